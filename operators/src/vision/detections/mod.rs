//! Object-detection post-processing: SSD-style models' per-row `boxes [K,4]`, `scores [K]` and
//! `classes [K]` tensors ([`ssd`]), or YOLO's dense predictions ([`yolo`]), to a list of
//! detections in pixel coordinates of the original image, after a score threshold, an optional
//! class filter and non-maximum suppression ([`nms`]: per class, or across classes).
//!
//! This module holds the stage's configuration and its [`StageKind`](crate::StageKind); the
//! stage itself (output columns, rows in and out) is [`Detections`].
//!
//! Output columns (with the default `output: detections`):
//! - `detections`: `List<Struct{class_id: Int64, label: Utf8?, score: Float32, x1, y1, x2, y2:
//!   Float32}>`, best first;
//! - `detections_count`: `Int32`, the number of detections kept.

use std::collections::BTreeMap;
use std::path::PathBuf;

use arrow_schema::SchemaRef;
use riffle_dataflow::{DataflowResult, Stage};
use serde_inline_default::serde_inline_default;

mod columns;
pub mod nms;
pub mod ssd;
mod stage;
pub mod yolo;

pub use nms::non_max_suppression;
pub use stage::Detections;
pub use yolo::{YoloConfig, YoloVersion};

const NAME: &str = "detections";

/// Column of letterbox parameters written by `resize: { mode: letterbox }`.
const LETTERBOX: &str = crate::vision::resize::LETTERBOX_COLUMN;

/// Columns holding the original image size, needed to scale normalized boxes.
const WIDTH: &str = "width";
const HEIGHT: &str = "height";

/// How the model lays out each box's four numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoxFormat {
    /// `[ymin, xmin, ymax, xmax]` in `0..1` of the image (TensorFlow object-detection API).
    #[default]
    YxyxNormalized,
    /// `[xmin, ymin, xmax, ymax]` in `0..1` of the image.
    XyxyNormalized,
    /// `[xmin, ymin, xmax, ymax]` already in pixels of the original image.
    XyxyPixels,
}

impl BoxFormat {
    pub(crate) fn is_normalized(self) -> bool {
        !matches!(self, BoxFormat::XyxyPixels)
    }
}

/// `[x1, y1, x2, y2]` in pixels, ordered and clamped to the image when its size is known.
fn to_pixels(b: [f32; 4], format: BoxFormat, size: Option<(f32, f32)>) -> [f32; 4] {
    let [x1, y1, x2, y2] = match format {
        BoxFormat::YxyxNormalized => [b[1], b[0], b[3], b[2]],
        BoxFormat::XyxyNormalized | BoxFormat::XyxyPixels => b,
    };
    let (sx, sy) = match (format.is_normalized(), size) {
        (true, Some((w, h))) => (w, h),
        _ => (1.0, 1.0),
    };
    let (x1, x2) = (x1.min(x2) * sx, x1.max(x2) * sx);
    let (y1, y2) = (y1.min(y2) * sy, y1.max(y2) * sy);
    match size {
        Some((w, h)) => [
            x1.clamp(0.0, w),
            y1.clamp(0.0, h),
            x2.clamp(0.0, w),
            y2.clamp(0.0, h),
        ],
        None => [x1, y1, x2, y2],
    }
}

/// YAML block of a `detections` stage.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectionsConfig {
    /// Tensor column of per-row boxes, shape `[K,4]`.
    #[serde_inline_default("detection_boxes".to_string())]
    pub boxes: String,
    /// Tensor column of per-row scores, shape `[K]`.
    #[serde_inline_default("detection_scores".to_string())]
    pub scores: String,
    /// Tensor column of per-row class ids stored as floats, shape `[K]`.
    #[serde_inline_default("detection_classes".to_string())]
    pub classes: String,
    #[serde(default)]
    pub box_format: BoxFormat,
    /// Detections scoring below this are dropped.
    #[serde_inline_default(0.5)]
    pub score_threshold: f32,
    /// Class ids to keep; empty keeps every class.
    #[serde(default)]
    pub keep_classes: Vec<i64>,
    /// NMS: a box overlapping a better one of its class by more than this IoU is dropped.
    /// `1.0` disables NMS.
    #[serde_inline_default(0.5)]
    pub iou_threshold: f32,
    /// NMS across classes: a box also suppresses better-scoring boxes' overlaps of other
    /// classes.
    #[serde(default)]
    pub class_agnostic: bool,
    /// Class names by id, e.g. `{1: person}`; classes without one get a null label.
    #[serde(default)]
    pub labels: BTreeMap<i64, String>,
    /// A text file of class names, line `i` naming class `i` (entries in `labels` win).
    #[serde(default)]
    pub labels_file: Option<PathBuf>,
    /// Decode YOLO predictions instead of SSD-style `boxes`/`scores`/`classes`.
    #[serde(default)]
    pub yolo: Option<YoloConfig>,
    /// At most this many detections per row (the best ones).
    #[serde_inline_default(100)]
    pub max_detections: usize,
    /// Name of the list column written; `{output}_count` comes with it.
    #[serde_inline_default("detections".to_string())]
    pub output: String,
    /// Drop the three model-output tensors from the output.
    #[serde_inline_default(true)]
    pub drop_inputs: bool,
}

/// One kept detection.
#[derive(Clone, Copy, Debug)]
struct Detection {
    class_id: i64,
    score: f32,
    rect: [f32; 4],
}

impl crate::StageKind for DetectionsConfig {
    fn kind(&self) -> &'static str {
        "detections"
    }

    fn files_mut(&mut self) -> Vec<crate::ConfigFile<'_>> {
        self.labels_file
            .iter_mut()
            .map(|path| crate::ConfigFile {
                key: "labels_file",
                path,
                expected: "a text file, one class name per line",
                kind: crate::kind::FileKind::File,
            })
            .collect()
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // Building this stage is cheap (no engine): its own check is the one rule.
        Detections::new(self.clone())?.output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(Detections::new(self.clone())?))
    }
}

#[cfg(test)]
mod tests;
