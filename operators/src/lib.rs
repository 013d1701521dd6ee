//! Riffle's operators: the stages a pipeline is made of.
//!
//! Every stage is one module with a serde config (mirroring its YAML block one-to-one) that
//! implements [`StageKind`] (schema without an engine, per-worker build, description), and a
//! type implementing [`riffle_dataflow::Stage`] (`process_batch`). Stages read and write named
//! Arrow columns, so they compose in any order the schemas allow; `output_schema` checks that
//! at validation. Errors about a config key are located at it ([`DataflowError::at`]), for
//! validation to point at the field. Adding a kind: its module in its family, plus one line in
//! `riffle_pipelines::spec`.
//!
//! The stages come in three families, one folder each:
//! - [`inference`]: the `model` stage and its engines (ONNX Runtime, the dense executor), the
//!   ONNX signature reader, [`inference::gpu_check`] (`riffle gpu-check`'s library side);
//! - [`vision`]: `decode`, `resize`, `detections`, `crop`, `track` and the track analytics;
//! - [`tabular`]: `cast`, `tensor`, `filter`, `select`, `topk`, `rank` and recommendation
//!   candidates (`recs`).
//!
//! The model and resize stages also have their schema rules as functions
//! ([`inference::model::output_schema`] over a [`inference::model::Signature`] read from the
//! ONNX file, [`vision::resize::output_schema`]), which load no engine, library or GPU. GPUs
//! themselves (discovery, placement, the device abstraction, the CUDA kernels) are the
//! `riffle-gpu` crate. Stateful stages keep their state through `riffle_dataflow`'s operators
//! ([`riffle_dataflow::operators::Keyed`] for state per key).

// No panic on data or configuration in library code (its unit tests may unwrap).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod inference;
pub mod kind;
pub mod tabular;
pub mod vision;

pub use kind::{ConfigFile, FileKind, StageContext, StageKind};

use riffle_dataflow::DataflowError;
use riffle_gpu::GpuError;

/// `key` as one segment of a config key path: quoted unless an identifier
/// (`inputs."image_tensor:0"`).
pub fn key_segment(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        key.to_string()
    } else {
        format!("\"{key}\"")
    }
}

/// A GPU error as the stages report it: an unusable GPU is a configuration error, a failed
/// CUDA call the stage's. (riffle-gpu does not know the engine's error type.)
pub(crate) fn gpu_error(e: GpuError) -> DataflowError {
    match e {
        GpuError::Unusable(message) => DataflowError::Config(message),
        GpuError::Cuda { stage, message } => DataflowError::Stage { stage, message },
    }
}

/// The error without the config key it is located at (tests match on the kind of error).
#[cfg(test)]
pub(crate) fn unlocated(e: DataflowError) -> DataflowError {
    match e {
        DataflowError::At { source, .. } => unlocated(*source),
        other => other,
    }
}
