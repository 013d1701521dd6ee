//! Vision: stages over camera frames. Decoding JPEG payloads, resizing into model tensors
//! (CPU or GPU, stretch or letterbox), turning detection models' outputs into boxes (SSD and
//! YOLO), cropping detections for a second model, tracking objects per camera, and the
//! analytics built on tracks (line counts, zones).

pub mod analytics;
pub mod crop;
pub mod decode;
pub mod detections;
pub mod resize;
pub mod track;
