//! Riffle's operators: the stages a pipeline is made of.
//!
//! Every stage is one module with a serde config (mirroring its YAML block one-to-one) that
//! implements [`StageKind`] (schema without an engine, per-worker build, description), and a
//! type implementing [`riffle_dataflow::Stage`] (`process_batch`). Stages read and write named
//! Arrow columns, so they compose in any order the schemas allow; `output_schema` checks that
//! at validation. Adding a kind: its module here, plus one line in `riffle_pipelines::spec`.

mod cuda_device;
pub mod decode;
pub mod dense;
pub mod dense_cuda;
pub mod detections;
pub mod filter;
pub mod gpu;
#[cfg(test)]
mod kernel_emulation;
pub mod kind;
pub mod model;
pub mod onnx;
pub mod rank;
pub mod recs;
pub mod resize;
pub mod resize_cuda;
pub mod select;
pub mod topk;

pub use kind::{ConfigFile, StageContext, StageKind};
