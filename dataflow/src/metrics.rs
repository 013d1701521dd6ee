//! The paths stage code has always imported: the registry and the summary now live in
//! [`crate::observe`] (see [`crate::observe::RunContext`] for what a run reports to).

pub use crate::observe::registry::{Metrics, StageMetrics};
pub use crate::observe::summary::{fmt_duration, StageSummary, Summary};
