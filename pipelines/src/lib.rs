//! Declarative pipelines: the YAML spec, its validation, and running it on timely workers.
//!
//! ```text
//! pipeline.yaml ──parse──▶ PipelineSpec ──validate──▶ Pipeline ──run──▶ timely workers
//!                 (spec)                 (validate)              (run)
//! ```
//! - [`spec`]: the structs the YAML maps onto, one-to-one (stage configs live beside their
//!   operators in `riffle-operators`, connector configs in `riffle-connectors`).
//! - [`validate`]: everything that can be checked before data flows (files, model signatures,
//!   column types through every stage), each error naming the file, line and field.
//! - [`plan`]: the per-worker operator chain built from a validated pipeline.
//! - [`run()`]: executes a pipeline on threads and processes, feeding sources under flow control.

pub mod checkpointing;
pub mod error;
pub mod liveness;
pub mod plan;
pub mod run;
pub mod spec;
pub mod validate;

pub use error::PipelineError;
pub use run::{run, RunOptions, RunReport};
pub use spec::PipelineSpec;
pub use validate::{load, Pipeline};
