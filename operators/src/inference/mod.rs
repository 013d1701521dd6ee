//! Inference: running models. The `model` stage (ONNX Runtime or the dense executor, engines
//! chosen per worker and device, repositories of versions, A/B variants and a shadow), the
//! dense-graph executor itself (CPU and GPU), reading an ONNX file's signature without loading
//! an engine, and `riffle gpu-check`'s library side.

pub mod dense;
pub mod gpu_check;
pub mod model;
pub mod onnx;
