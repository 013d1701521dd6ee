//! Declarative pipelines: the YAML spec, its validation, and running it on timely workers.
//!
//! ```text
//! pipeline.yaml ──parse──▶ PipelineSpec ──validate──▶ Pipeline ──plan──▶ Job ──▶ runtime::run
//!                 (spec)                 (validate)            (plan)        (riffle-dataflow)
//! ```
//! - [`env`](mod@env): `${VAR}` / `${VAR:-default}` substituted into the file's text before parsing.
//! - [`spec`]: the structs the YAML maps onto, one-to-one (stage configs live beside their
//!   operators in `riffle-operators`, connector configs in `riffle-connectors`).
//! - [`validate`]: everything that can be checked before data flows (files, model signatures,
//!   column types through every stage), each error naming the file, line and field.
//! - [`plan`]: the runtime's [`riffle_dataflow::runtime::Job`] made of a validated pipeline
//!   (each stage kind builds itself per worker), and the plan `riffle plan` prints.
//! - [`exchange`]: `exchange:` blocks: checks, the route they become, their description.
//! - [`ranges`]: the allowed range of every number in a pipeline file.
//! - [`lock`]: one run at a time per checkpoint directory and output file.
//! - [`run`](mod@run): the run lifecycle of `riffle run` for any program: overrides, locks,
//!   stop signals, local multi-process launch and its supervisor's restarts, the exit-code
//!   policy ([`run()`], [`RunOptions`], [`RunOutcome`]).
//!
//! No stage kind is listed here except in [`spec`]'s one registration line per kind.

// No panic on data or configuration in library code (its unit tests may unwrap); every index
// or slice left says why it is in bounds.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod env;
pub mod error;
pub mod exchange;
mod locate;
pub mod lock;
pub mod plan;
pub mod ranges;
pub mod run;
pub mod spec;
pub mod tap;
mod unbuilt;
pub mod validate;

pub use error::PipelineError;
pub use lock::{LockError, RunLock};
pub use run::{run, RunError, RunOptions, RunOutcome, RunReport};
pub use spec::PipelineSpec;
pub use validate::{load, load_text, Pipeline};
