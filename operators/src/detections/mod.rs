//! Object-detection post-processing: SSD-style models' per-row `boxes [K,4]`, `scores [K]` and
//! `classes [K]` tensors, or YOLO's dense predictions ([`yolo`]), to a list of detections in
//! pixel coordinates of the original image, after a score threshold, an optional class filter
//! and non-maximum suppression (per class, or across classes).
//!
//! Output columns (with the default `output: detections`):
//! - `detections`: `List<Struct{class_id: Int64, label: Utf8?, score: Float32, x1, y1, x2, y2:
//!   Float32}>`, best first;
//! - `detections_count`: `Int32`, the number of detections kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type};
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, ListArray,
    RecordBatch, StringArray, StructArray, UInt32Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use riffle_dataflow::tensor::{element_type, row_shape, tensor_values};
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
use serde_inline_default::serde_inline_default;

pub mod yolo;

pub use yolo::{YoloConfig, YoloVersion};

const NAME: &str = "detections";

/// Column of letterbox parameters written by `resize: { mode: letterbox }`.
const LETTERBOX: &str = crate::resize::LETTERBOX_COLUMN;

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
    fn is_normalized(self) -> bool {
        !matches!(self, BoxFormat::XyxyPixels)
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

/// Columns holding the original image size, needed to scale normalized boxes.
const WIDTH: &str = "width";
const HEIGHT: &str = "height";

/// Indices of the boxes greedy NMS keeps, best score first: a box is suppressed when its IoU
/// with an already kept box exceeds `iou_threshold`. Boxes are `[x1, y1, x2, y2]`.
pub fn non_max_suppression(boxes: &[[f32; 4]], scores: &[f32], iou_threshold: f32) -> Vec<usize> {
    // (index, box, score) of the first `min(boxes, scores)` boxes.
    let mut order: Vec<(usize, &[f32; 4], f32)> = boxes
        .iter()
        .zip(scores)
        .enumerate()
        .map(|(i, (b, &s))| (i, b, s))
        .collect();
    // NaN scores sort last; equal scores keep input order.
    order.sort_by(|&(_, _, a), &(_, _, b)| {
        b.partial_cmp(&a)
            .unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
    });
    let mut kept: Vec<(usize, &[f32; 4])> = Vec::new();
    for (i, b, _) in order {
        if kept.iter().all(|&(_, k)| iou(k, b) <= iou_threshold) {
            kept.push((i, b));
        }
    }
    kept.into_iter().map(|(i, _)| i).collect()
}

/// Intersection over union of two `[x1, y1, x2, y2]` boxes; 0 when the union is empty.
fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |r: &[f32; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// One kept detection.
#[derive(Clone, Copy, Debug)]
struct Detection {
    class_id: i64,
    score: f32,
    rect: [f32; 4],
}

/// The `detections` stage.
///
/// Turns an SSD-style model's fixed `K` candidate boxes into the detections worth reporting,
/// in pixels of the original image: weak scores and duplicate boxes of one object are dropped.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::{Float32Type, Int32Type};
/// use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
/// use arrow_schema::{DataType, Field, Schema};
/// use riffle_dataflow::tensor::{tensor_column, tensor_field};
/// use riffle_dataflow::Stage;
/// use riffle_operators::detections::Detections;
///
/// // One 200x100 frame, K = 3: a person, a near-duplicate of it, a weak class-3 box.
/// let boxes = tensor_field("detection_boxes", DataType::Float32, &[3, 4]);
/// let scores = tensor_field("detection_scores", DataType::Float32, &[3]);
/// let classes = tensor_field("detection_classes", DataType::Float32, &[3]);
/// let f32s = |field: &Field, v: Vec<f32>| tensor_column::<Float32Type>(field, v).unwrap();
/// let columns: Vec<ArrayRef> = vec![
///     // [ymin, xmin, ymax, xmax] in 0..1 of the image.
///     f32s(&boxes, vec![0.25, 0.25, 0.5, 0.75, 0.25, 0.3, 0.5, 0.75, 0.0, 0.0, 0.1, 0.1]),
///     f32s(&scores, vec![0.9, 0.8, 0.3]),
///     f32s(&classes, vec![1.0, 1.0, 3.0]),
///     Arc::new(UInt32Array::from(vec![200])),
///     Arc::new(UInt32Array::from(vec![100])),
/// ];
/// let size = |name| Field::new(name, DataType::UInt32, false);
/// let schema = Schema::new(vec![boxes, scores, classes, size("width"), size("height")]);
/// let batch = RecordBatch::try_new(Arc::new(schema), columns).unwrap();
/// let config = serde_json::json!({ "score_threshold": 0.5, "labels": { "1": "person" } });
/// let mut stage = Detections::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap().records;
///
/// // The duplicate fell to NMS, the class-3 box to the score threshold.
/// let count = out.column_by_name("detections_count").unwrap();
/// assert_eq!(count.as_primitive::<Int32Type>().value(0), 1);
/// let list = out.column_by_name("detections").unwrap().as_list::<i32>().value(0);
/// let found = list.as_struct();
/// assert_eq!(found.column_by_name("label").unwrap().as_string::<i32>().value(0), "person");
/// let coord = |c: &str| found.column_by_name(c).unwrap().as_primitive::<Float32Type>().value(0);
/// assert_eq!([coord("x1"), coord("y1"), coord("x2"), coord("y2")], [50.0, 25.0, 150.0, 50.0]);
/// ```
#[derive(Debug)]
pub struct Detections {
    config: DetectionsConfig,
    entry_fields: Fields,
    /// `labels_file` then `labels`.
    labels: BTreeMap<i64, String>,
}

/// What the stage reads per row, from the input's schema.
#[derive(Clone, Copy, Debug)]
enum Inputs {
    /// `K` SSD-style detections.
    Ssd(usize),
    Yolo(yolo::Layout),
}

impl Detections {
    pub fn new(config: DetectionsConfig) -> DataflowResult<Self> {
        if !(0.0..=1.0).contains(&config.iou_threshold) {
            return Err(DataflowError::Config(format!(
                "{NAME}: iou_threshold must be within 0..=1, got {}",
                config.iou_threshold
            ))
            .at("iou_threshold"));
        }
        if config.score_threshold.is_nan() {
            return Err(
                DataflowError::Config(format!("{NAME}: score_threshold must be a number"))
                    .at("score_threshold"),
            );
        }
        let mut labels = match &config.labels_file {
            Some(path) => load_labels(path).map_err(|e| e.at("labels_file"))?,
            None => BTreeMap::new(),
        };
        labels.extend(config.labels.clone());
        Ok(Detections {
            config,
            entry_fields: entry_fields(),
            labels,
        })
    }

    fn count_column(&self) -> String {
        format!("{}_count", self.config.output)
    }

    fn list_field(&self) -> FieldRef {
        Arc::new(Field::new_list_field(
            DataType::Struct(self.entry_fields.clone()),
            false,
        ))
    }

    fn is_input(&self, name: &str) -> bool {
        match &self.config.yolo {
            Some(y) => name == y.predictions || name == LETTERBOX,
            None => {
                name == self.config.boxes
                    || name == self.config.scores
                    || name == self.config.classes
            }
        }
    }

    /// What each row holds, after checking every input column's type and shape. Errors about
    /// a configured column are located at the key naming it.
    fn check_inputs(&self, input: &Schema) -> DataflowResult<Inputs> {
        match &self.config.yolo {
            Some(y) => self.check_yolo(input, y).map(Inputs::Yolo),
            None => self.check_ssd(input).map(Inputs::Ssd),
        }
    }

    fn check_yolo(&self, input: &Schema, config: &YoloConfig) -> DataflowResult<yolo::Layout> {
        tensor_size(input, &config.predictions).map_err(|e| e.at("yolo.predictions"))?;
        let layout = yolo::layout(input, config).map_err(|e| e.at("yolo.predictions"))?;
        match input.field_with_name(LETTERBOX) {
            Ok(_) if tensor_size(input, LETTERBOX).ok() == Some(3) => {}
            Ok(f) => {
                return Err(DataflowError::schema(
                    LETTERBOX,
                    "[gain, pad_x, pad_y] per row (from resize's letterbox)",
                    f.data_type().to_string(),
                ))
            }
            Err(_) if config.input_size.is_some() => {
                for name in [WIDTH, HEIGHT] {
                    size_field(input, name, "needed to map stretched boxes back")?;
                }
            }
            Err(_) => {
                return Err(DataflowError::Config(format!(
                    "{NAME}: YOLO boxes are in pixels of the model's input; map them back with \
                     a `{LETTERBOX}` column (resize with `mode: letterbox`) or give \
                     `yolo.input_size: [width, height]` for stretched frames"
                ))
                .at("yolo"))
            }
        }
        if let Some([w, h]) = config.input_size {
            if w == 0 || h == 0 {
                return Err(DataflowError::Config(format!(
                    "{NAME}: yolo.input_size {w}x{h} must be non-zero"
                ))
                .at("yolo.input_size"));
            }
        }
        Ok(layout)
    }

    /// Detections per row (`K`) of SSD-style inputs.
    fn check_ssd(&self, input: &Schema) -> DataflowResult<usize> {
        let boxes = tensor_size(input, &self.config.boxes).map_err(|e| e.at("boxes"))?;
        let scores = tensor_size(input, &self.config.scores).map_err(|e| e.at("scores"))?;
        let classes = tensor_size(input, &self.config.classes).map_err(|e| e.at("classes"))?;
        let box_shape = input
            .field_with_name(&self.config.boxes)
            .map_err(DataflowError::from)
            .and_then(row_shape)
            .map_err(|e| e.at("boxes"))?;
        if boxes != 4 * scores || box_shape.last() != Some(&4) {
            return Err(DataflowError::schema(
                &self.config.boxes,
                format!("a [{scores},4] tensor (one box per score)"),
                format!("shape {box_shape:?}"),
            )
            .at("boxes"));
        }
        if classes != scores {
            return Err(DataflowError::schema(
                &self.config.classes,
                format!("{scores} classes per row (one per score)"),
                format!("{classes}"),
            )
            .at("classes"));
        }
        for name in [WIDTH, HEIGHT] {
            // Pixel boxes are usable without the image size: they are just not clamped.
            if input.field_with_name(name).is_err() && !self.config.box_format.is_normalized() {
                continue;
            }
            size_field(input, name, "needed to scale normalized boxes")?;
        }
        Ok(scores)
    }

    /// Detections of one row, best first.
    fn detect_row(
        &self,
        boxes: &[f32],
        scores: &[f32],
        classes: &[f32],
        size: Option<(f32, f32)>,
    ) -> Vec<Detection> {
        let cfg = &self.config;
        // Group candidates per class so NMS never suppresses across classes.
        let mut by_class: BTreeMap<i64, Vec<Detection>> = BTreeMap::new();
        // `boxes` holds 4 values per score (checked by the caller).
        let (boxes, _) = boxes.as_chunks::<4>();
        for ((&score, &class), &b) in scores.iter().zip(classes).zip(boxes) {
            // NaN scores and class ids carry no usable detection.
            if score.is_nan() || score < cfg.score_threshold || !class.is_finite() {
                continue;
            }
            let class_id = class.round() as i64;
            if !cfg.keep_classes.is_empty() && !cfg.keep_classes.contains(&class_id) {
                continue;
            }
            let rect = to_pixels(b, cfg.box_format, size);
            by_class.entry(class_id).or_default().push(Detection {
                class_id,
                score,
                rect,
            });
        }
        self.suppress(by_class.into_values().flatten().collect())
    }

    /// The detections NMS keeps of `candidates` (per class unless `class_agnostic`), best
    /// first, at most `max_detections`.
    fn suppress(&self, candidates: Vec<Detection>) -> Vec<Detection> {
        let cfg = &self.config;
        let mut groups: BTreeMap<i64, Vec<Detection>> = BTreeMap::new();
        for d in candidates {
            let group = if cfg.class_agnostic { 0 } else { d.class_id };
            groups.entry(group).or_default().push(d);
        }
        let mut kept = Vec::new();
        for candidates in groups.values() {
            if cfg.iou_threshold >= 1.0 {
                kept.extend_from_slice(candidates);
                continue;
            }
            let rects: Vec<[f32; 4]> = candidates.iter().map(|d| d.rect).collect();
            let scores: Vec<f32> = candidates.iter().map(|d| d.score).collect();
            let keep = non_max_suppression(&rects, &scores, cfg.iou_threshold);
            kept.extend(keep.into_iter().filter_map(|i| candidates.get(i).copied()));
        }
        // Scores passed the threshold, so none is NaN here.
        kept.sort_by(|a, b| b.score.total_cmp(&a.score));
        kept.truncate(cfg.max_detections);
        kept
    }

    /// Detections of one row of YOLO predictions, boxes mapped back to the source image.
    fn detect_yolo_row(
        &self,
        values: &[f32],
        layout: yolo::Layout,
        version: YoloVersion,
        back: yolo::BackMap,
        size: Option<(f32, f32)>,
    ) -> Vec<Detection> {
        let cfg = &self.config;
        let keep = |c: i64| cfg.keep_classes.is_empty() || cfg.keep_classes.contains(&c);
        let found = yolo::candidates(values, layout, version, cfg.score_threshold, keep);
        // NMS where the model saw the boxes (as Ultralytics does), then back to the source.
        let mut kept = self.suppress(found);
        for d in &mut kept {
            d.rect = to_pixels(back.apply(d.rect), BoxFormat::XyxyPixels, size);
        }
        kept
    }

    /// Each row's detections from SSD-style tensors of `k` detections per row.
    fn ssd_rows(
        &self,
        batch: &RecordBatch,
        k: usize,
        size_of: &dyn Fn(usize) -> Option<(f32, f32)>,
    ) -> DataflowResult<Vec<Option<Vec<Detection>>>> {
        let rows = batch.num_rows();
        let (box_list, boxes) = tensor(batch, &self.config.boxes).map_err(|e| e.at("boxes"))?;
        let (score_list, scores) =
            tensor(batch, &self.config.scores).map_err(|e| e.at("scores"))?;
        let (class_list, classes) =
            tensor(batch, &self.config.classes).map_err(|e| e.at("classes"))?;
        let misfit = || {
            DataflowError::stage(
                NAME,
                format!("input tensors do not hold {rows} rows of {k} detections"),
            )
        };
        if boxes.len() != rows * k * 4 || scores.len() != rows * k || classes.len() != rows * k {
            return Err(misfit());
        }
        let mut out = Vec::with_capacity(rows);
        for row in 0..rows {
            let size = size_of(row);
            let missing_tensor =
                box_list.is_null(row) || score_list.is_null(row) || class_list.is_null(row);
            // Normalized boxes cannot be placed without the image size; like a null tensor,
            // that row gets a null list (the row itself is kept: this stage preserves rows).
            if missing_tensor || (self.config.box_format.is_normalized() && size.is_none()) {
                out.push(None);
                continue;
            }
            let (Some(row_boxes), Some(row_scores), Some(row_classes)) = (
                boxes.get(row * k * 4..(row + 1) * k * 4),
                scores.get(row * k..(row + 1) * k),
                classes.get(row * k..(row + 1) * k),
            ) else {
                return Err(misfit());
            };
            out.push(Some(self.detect_row(
                row_boxes,
                row_scores,
                row_classes,
                size,
            )));
        }
        Ok(out)
    }

    /// Each row's detections from YOLO predictions.
    fn yolo_rows(
        &self,
        batch: &RecordBatch,
        layout: yolo::Layout,
        size_of: &dyn Fn(usize) -> Option<(f32, f32)>,
    ) -> DataflowResult<Vec<Option<Vec<Detection>>>> {
        let Some(config) = &self.config.yolo else {
            return Err(DataflowError::stage(NAME, "no yolo block"));
        };
        let rows = batch.num_rows();
        let per_row = layout.attrs * layout.anchors;
        let (list, values) =
            tensor(batch, &config.predictions).map_err(|e| e.at("yolo.predictions"))?;
        if values.len() != rows * per_row {
            return Err(DataflowError::stage(
                NAME,
                format!("predictions do not hold {rows} rows of {per_row} values"),
            ));
        }
        let letterbox = match batch.column_by_name(LETTERBOX) {
            Some(_) => Some(tensor(batch, LETTERBOX)?),
            None => None,
        };
        let mut out = Vec::with_capacity(rows);
        for row in 0..rows {
            let size = size_of(row);
            let back = match (&letterbox, config.input_size, size) {
                (Some((fits, fit)), _, _) if fits.is_valid(row) => {
                    match fit.get(row * 3..row * 3 + 3) {
                        Some(&[gain, pad_x, pad_y]) if gain > 0.0 => {
                            Some(yolo::BackMap::Letterbox { gain, pad_x, pad_y })
                        }
                        _ => None,
                    }
                }
                (None, Some([w, h]), Some((sw, sh))) => Some(yolo::BackMap::Stretch {
                    sx: sw / w as f32,
                    sy: sh / h as f32,
                }),
                _ => None,
            };
            let values = values.get(row * per_row..(row + 1) * per_row);
            match (back, values) {
                (Some(back), Some(values)) if list.is_valid(row) => {
                    out.push(Some(self.detect_yolo_row(
                        values,
                        layout,
                        config.version,
                        back,
                        size,
                    )));
                }
                // No predictions, or no way to place them: a null list, the row kept.
                _ => out.push(None),
            }
        }
        Ok(out)
    }
}

/// Class names from a text file, line `i` naming class `i`.
fn load_labels(path: &Path) -> DataflowResult<BTreeMap<i64, String>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        DataflowError::Config(format!(
            "{NAME}: cannot read labels file {}: {e}",
            path.display()
        ))
    })?;
    // Trailing whitespace (and a Windows `\r`) is never part of a class name.
    Ok((0..)
        .zip(text.lines())
        .map(|(i, l)| (i, l.trim_end().to_string()))
        .collect())
}

/// Checks that `name` is a UInt32 image-size column.
fn size_field(input: &Schema, name: &str, why: &str) -> DataflowResult<()> {
    match input.field_with_name(name) {
        Ok(f) if f.data_type() == &DataType::UInt32 => Ok(()),
        Ok(f) => Err(DataflowError::schema(
            name,
            "UInt32 image size",
            f.data_type().to_string(),
        )),
        Err(_) => Err(DataflowError::schema(
            name,
            format!("UInt32 image size ({why})"),
            "no such column",
        )),
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

/// Elements per row of the f32 tensor column `name`.
fn tensor_size(input: &Schema, name: &str) -> DataflowResult<usize> {
    let field = input
        .field_with_name(name)
        .map_err(|_| DataflowError::schema(name, "a float32 tensor column", "no such column"))?;
    let is_tensor = matches!(field.data_type(), DataType::FixedSizeList(_, _));
    if !is_tensor || element_type(field) != DataType::Float32 {
        return Err(DataflowError::schema(
            name,
            "a float32 tensor column (FixedSizeList<Float32>)",
            field.data_type().to_string(),
        ));
    }
    Ok(row_shape(field)?.iter().product())
}

/// The tensor column `name` of `batch` and its contiguous values.
fn tensor<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> DataflowResult<(&'a FixedSizeListArray, &'a [f32])> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| DataflowError::schema(name, "a column", "none"))?;
    let list = column.as_fixed_size_list_opt().ok_or_else(|| {
        DataflowError::schema(
            name,
            "FixedSizeList<Float32>",
            column.data_type().to_string(),
        )
    })?;
    Ok((list, tensor_values::<Float32Type>(list)?))
}

fn size_column<'a>(batch: &'a RecordBatch, name: &str) -> Option<&'a UInt32Array> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_primitive_opt::<UInt32Type>())
}

fn entry_fields() -> Fields {
    let coord = |name: &str| Field::new(name, DataType::Float32, false);
    Fields::from(vec![
        Field::new("class_id", DataType::Int64, false),
        Field::new("label", DataType::Utf8, true),
        Field::new("score", DataType::Float32, false),
        coord("x1"),
        coord("y1"),
        coord("x2"),
        coord("y2"),
    ])
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

impl Stage for Detections {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.check_inputs(input)?;
        let mut fields: Vec<FieldRef> = input
            .fields()
            .iter()
            .filter(|f| !(self.config.drop_inputs && self.is_input(f.name())))
            .cloned()
            .collect();
        let added = [
            Field::new(&self.config.output, DataType::List(self.list_field()), true),
            Field::new(self.count_column(), DataType::Int32, false),
        ];
        for field in added {
            if fields.iter().any(|f| f.name() == field.name()) {
                // Both added columns are named from `output`.
                return Err(DataflowError::schema(
                    field.name(),
                    "a column name not already in the input",
                    "an existing column",
                )
                .at("output"));
            }
            fields.push(Arc::new(field));
        }
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let schema = self.output_schema(batch.schema_ref())?;
        let rows = batch.num_rows();
        let widths = size_column(batch, WIDTH);
        let heights = size_column(batch, HEIGHT);
        let size_of = |row: usize| match (widths, heights) {
            (Some(w), Some(h)) if w.is_valid(row) && h.is_valid(row) => {
                Some((w.value(row) as f32, h.value(row) as f32))
            }
            _ => None,
        };
        // Per row: its detections, or None for a null list.
        let found: Vec<Option<Vec<Detection>>> = match self.check_inputs(batch.schema_ref())? {
            Inputs::Ssd(k) => self.ssd_rows(batch, k, &size_of)?,
            Inputs::Yolo(layout) => self.yolo_rows(batch, layout, &size_of)?,
        };
        let mut lengths = Vec::with_capacity(rows);
        let mut valid = Vec::with_capacity(rows);
        let mut kept: Vec<Detection> = Vec::new();
        for row in found {
            valid.push(row.is_some());
            let row = row.unwrap_or_default();
            lengths.push(row.len());
            kept.extend(row);
        }

        let mut coords: [Vec<f32>; 4] = Default::default();
        for d in &kept {
            for (coord, &v) in coords.iter_mut().zip(&d.rect) {
                coord.push(v);
            }
        }
        let [x1, y1, x2, y2] = coords.map(|c| Arc::new(Float32Array::from(c)) as ArrayRef);
        let entries = StructArray::try_new(
            self.entry_fields.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    kept.iter().map(|d| d.class_id),
                )),
                Arc::new(StringArray::from_iter(
                    kept.iter().map(|d| self.labels.get(&d.class_id)),
                )),
                Arc::new(Float32Array::from_iter_values(kept.iter().map(|d| d.score))),
                x1,
                y1,
                x2,
                y2,
            ],
            None,
        )?;
        let counts = lengths
            .iter()
            .map(|&n| i32::try_from(n))
            .collect::<Result<Vec<i32>, _>>()
            .map_err(|e| DataflowError::stage(NAME, e))?;
        let offsets = OffsetBuffer::<i32>::try_from_lengths(lengths)
            .map_err(|e| DataflowError::stage(NAME, e))?;
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        let list = ListArray::try_new(self.list_field(), offsets, Arc::new(entries), nulls)?;

        let mut columns: Vec<ArrayRef> = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .filter(|(f, _)| !(self.config.drop_inputs && self.is_input(f.name())))
            .map(|(_, c)| c.clone())
            .collect();
        columns.push(Arc::new(list));
        columns.push(Arc::new(Int32Array::from(counts)));
        Ok(StageOutput::all(RecordBatch::try_new(schema, columns)?))
    }

    fn preserves_rows(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
