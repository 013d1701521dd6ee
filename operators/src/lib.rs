//! Riffle's operators: the stages a pipeline is made of.
//!
//! Every stage is one module with a serde config (mirroring its YAML block one-to-one) and a
//! type implementing [`riffle_dataflow::Stage`]. Stages read and write named Arrow columns, so
//! they compose in any order the schemas allow; `output_schema` checks that at validation.

pub mod batching;
mod cuda_device;
pub mod decode;
pub mod dense;
pub mod dense_cuda;
pub mod detections;
pub mod filter;
pub mod gpu;
#[cfg(test)]
mod kernel_emulation;
pub mod model;
pub mod onnx;
pub mod rank;
pub mod recs;
pub mod resize;
pub mod resize_cuda;
pub mod select;
pub mod topk;
