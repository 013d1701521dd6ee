//! SSD-style inputs (TensorFlow's object-detection API and its kin): per row `K` candidate
//! boxes `[K,4]`, scores `[K]` and class ids stored as floats `[K]`, laid out as `box_format`
//! says.

use std::collections::BTreeMap;

use arrow_array::{Array, RecordBatch};
use arrow_schema::Schema;
use riffle_dataflow::tensor::row_shape;
use riffle_dataflow::{DataflowError, DataflowResult};

use super::columns::{size_field, tensor, tensor_size};
use super::{nms, to_pixels, Detection, DetectionsConfig, HEIGHT, NAME, WIDTH};

/// Detections per row (`K`) of SSD-style inputs, after checking each input column's type and
/// shape; errors about a configured column are located at the key naming it.
pub(super) fn check(config: &DetectionsConfig, input: &Schema) -> DataflowResult<usize> {
    let boxes = tensor_size(input, &config.boxes).map_err(|e| e.at("boxes"))?;
    let scores = tensor_size(input, &config.scores).map_err(|e| e.at("scores"))?;
    let classes = tensor_size(input, &config.classes).map_err(|e| e.at("classes"))?;
    let box_shape = input
        .field_with_name(&config.boxes)
        .map_err(DataflowError::from)
        .and_then(row_shape)
        .map_err(|e| e.at("boxes"))?;
    if boxes != 4 * scores || box_shape.last() != Some(&4) {
        return Err(DataflowError::schema(
            &config.boxes,
            format!("a [{scores},4] tensor (one box per score)"),
            format!("shape {box_shape:?}"),
        )
        .at("boxes"));
    }
    if classes != scores {
        return Err(DataflowError::schema(
            &config.classes,
            format!("{scores} classes per row (one per score)"),
            format!("{classes}"),
        )
        .at("classes"));
    }
    for name in [WIDTH, HEIGHT] {
        // Pixel boxes are usable without the image size: they are just not clamped.
        if input.field_with_name(name).is_err() && !config.box_format.is_normalized() {
            continue;
        }
        size_field(input, name, "needed to scale normalized boxes")?;
    }
    Ok(scores)
}

/// Detections of one row, best first.
fn detect_row(
    cfg: &DetectionsConfig,
    boxes: &[f32],
    scores: &[f32],
    classes: &[f32],
    size: Option<(f32, f32)>,
) -> Vec<Detection> {
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
    nms::suppress(cfg, by_class.into_values().flatten().collect())
}

/// Each row's detections from SSD-style tensors of `k` detections per row.
pub(super) fn rows(
    config: &DetectionsConfig,
    batch: &RecordBatch,
    k: usize,
    size_of: &dyn Fn(usize) -> Option<(f32, f32)>,
) -> DataflowResult<Vec<Option<Vec<Detection>>>> {
    let rows = batch.num_rows();
    let (box_list, boxes) = tensor(batch, &config.boxes).map_err(|e| e.at("boxes"))?;
    let (score_list, scores) = tensor(batch, &config.scores).map_err(|e| e.at("scores"))?;
    let (class_list, classes) = tensor(batch, &config.classes).map_err(|e| e.at("classes"))?;
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
        if missing_tensor || (config.box_format.is_normalized() && size.is_none()) {
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
        out.push(Some(detect_row(
            config,
            row_boxes,
            row_scores,
            row_classes,
            size,
        )));
    }
    Ok(out)
}
