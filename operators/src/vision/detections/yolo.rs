//! Decoding YOLO's dense predictions: one row of `anchors` candidates, each `[cx, cy, w, h]` in
//! pixels of the model's input followed by per-class scores (v8, v11) or by an objectness and
//! per-class scores (v5), into scored boxes, suppressed where the model saw them and mapped
//! back to the source image (through the letterbox, or the stretch to `input_size`).

use arrow_array::{Array, RecordBatch};
use arrow_schema::Schema;
use riffle_dataflow::tensor::row_shape;
use riffle_dataflow::{DataflowError, DataflowResult};
use serde_inline_default::serde_inline_default;

use super::columns::{size_field, tensor, tensor_size};
use super::{
    nms, to_pixels, BoxFormat, Detection, DetectionsConfig, HEIGHT, LETTERBOX, NAME, WIDTH,
};

/// Which YOLO head made the predictions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum YoloVersion {
    /// `[cx, cy, w, h, objectness, C class scores]` per candidate (YOLOv5, v7).
    V5,
    /// `[cx, cy, w, h, C class scores]` per candidate (YOLOv8, v11: the same head).
    #[default]
    #[serde(alias = "v11")]
    V8,
}

impl YoloVersion {
    /// Numbers per candidate before the class scores.
    fn leading(self) -> usize {
        match self {
            YoloVersion::V5 => 5,
            YoloVersion::V8 => 4,
        }
    }
}

/// `yolo:` block of a `detections` stage.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct YoloConfig {
    /// Tensor column of the model's predictions, per row `[4+C, anchors]` or
    /// `[anchors, 4+C]` (v5: `5+C`); the smaller axis is taken as the per-candidate one.
    #[serde_inline_default("output0".to_string())]
    pub predictions: String,
    #[serde(default)]
    pub version: YoloVersion,
    /// The model's input `[width, height]`, needed to map boxes back when the frames were
    /// stretched; a `letterbox` column (from `resize: { mode: letterbox }`) is used instead
    /// when present.
    #[serde(default)]
    pub input_size: Option<[u32; 2]>,
}

/// How a row's predictions are laid out, from the column's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    /// Numbers per candidate (`4+C` or `5+C`).
    pub attrs: usize,
    pub anchors: usize,
    /// `[attrs, anchors]` (Ultralytics' export) rather than `[anchors, attrs]`.
    pub attrs_first: bool,
}

/// The layout of the predictions column, checked.
pub(super) fn layout(input: &Schema, config: &YoloConfig) -> DataflowResult<Layout> {
    let name = &config.predictions;
    let field = input.field_with_name(name).map_err(|_| {
        DataflowError::schema(
            name,
            "a float32 tensor of YOLO predictions",
            "no such column",
        )
    })?;
    let shape = row_shape(field)?;
    let version = config.version;
    let [a, b] = shape[..] else {
        return Err(DataflowError::schema(
            name,
            "per row [4+C, anchors] or [anchors, 4+C] (YOLO predictions)",
            format!("shape {shape:?}"),
        ));
    };
    let (attrs, anchors, attrs_first) = if a <= b { (a, b, true) } else { (b, a, false) };
    if attrs <= version.leading() {
        return Err(DataflowError::schema(
            name,
            format!(
                "at least {} numbers per candidate for YOLO {}",
                version.leading() + 1,
                match version {
                    YoloVersion::V5 => "v5",
                    YoloVersion::V8 => "v8/v11",
                }
            ),
            format!("shape {shape:?}"),
        ));
    }
    Ok(Layout {
        attrs,
        anchors,
        attrs_first,
    })
}

/// Candidates of one row scoring at least `threshold`, boxes `[x1, y1, x2, y2]` in pixels of
/// the model's input; `keep` filters class ids.
pub(super) fn candidates(
    values: &[f32],
    layout: Layout,
    version: YoloVersion,
    threshold: f32,
    keep: impl Fn(i64) -> bool,
) -> Vec<Detection> {
    let Layout {
        attrs,
        anchors,
        attrs_first,
    } = layout;
    let at = |anchor: usize, attr: usize| -> f32 {
        let i = if attrs_first {
            attr * anchors + anchor
        } else {
            anchor * attrs + attr
        };
        values.get(i).copied().unwrap_or(f32::NAN)
    };
    let leading = version.leading();
    let mut found = Vec::new();
    for anchor in 0..anchors {
        let objectness = match version {
            YoloVersion::V5 => {
                let o = at(anchor, 4);
                // Most anchors see nothing: skip their class scores early.
                if o.is_nan() || o < threshold {
                    continue;
                }
                o
            }
            YoloVersion::V8 => 1.0,
        };
        // The best class; ties keep the lower id (as an argmax does).
        let mut best: Option<(usize, f32)> = None;
        for class in 0..attrs - leading {
            let s = at(anchor, leading + class);
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((class, s));
            }
        }
        let Some((class, score)) = best else { continue };
        let score = score * objectness;
        if score.is_nan() || score < threshold {
            continue;
        }
        let class_id = class as i64;
        if !keep(class_id) {
            continue;
        }
        let (cx, cy, w, h) = (at(anchor, 0), at(anchor, 1), at(anchor, 2), at(anchor, 3));
        if ![cx, cy, w, h].iter().all(|v| v.is_finite()) {
            continue;
        }
        found.push(Detection {
            class_id,
            score,
            rect: [cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0],
        });
    }
    found
}

/// Maps a box from the model's input back to the source image.
#[derive(Clone, Copy, Debug)]
pub(super) enum BackMap {
    /// From a letterbox: `(v - pad) / gain`.
    Letterbox { gain: f32, pad_x: f32, pad_y: f32 },
    /// From a stretch: `v * scale` per axis.
    Stretch { sx: f32, sy: f32 },
}

impl BackMap {
    pub fn apply(self, [x1, y1, x2, y2]: [f32; 4]) -> [f32; 4] {
        match self {
            BackMap::Letterbox { gain, pad_x, pad_y } => [
                (x1 - pad_x) / gain,
                (y1 - pad_y) / gain,
                (x2 - pad_x) / gain,
                (y2 - pad_y) / gain,
            ],
            BackMap::Stretch { sx, sy } => [x1 * sx, y1 * sy, x2 * sx, y2 * sy],
        }
    }
}

/// The layout of the predictions, after checking them and the way back to the source image (a
/// letterbox column, or the image size with `input_size`); errors are located at their key.
pub(super) fn check(input: &Schema, config: &YoloConfig) -> DataflowResult<Layout> {
    tensor_size(input, &config.predictions).map_err(|e| e.at("yolo.predictions"))?;
    let layout = layout(input, config).map_err(|e| e.at("yolo.predictions"))?;
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

/// Detections of one row of YOLO predictions, boxes mapped back to the source image.
fn detect_row(
    cfg: &DetectionsConfig,
    values: &[f32],
    layout: Layout,
    version: YoloVersion,
    back: BackMap,
    size: Option<(f32, f32)>,
) -> Vec<Detection> {
    let keep = |c: i64| cfg.keep_classes.is_empty() || cfg.keep_classes.contains(&c);
    let found = candidates(values, layout, version, cfg.score_threshold, keep);
    // NMS where the model saw the boxes (as Ultralytics does), then back to the source.
    let mut kept = nms::suppress(cfg, found);
    for d in &mut kept {
        d.rect = to_pixels(back.apply(d.rect), BoxFormat::XyxyPixels, size);
    }
    kept
}

/// Each row's detections from YOLO predictions.
pub(super) fn rows(
    cfg: &DetectionsConfig,
    batch: &RecordBatch,
    layout: Layout,
    size_of: &dyn Fn(usize) -> Option<(f32, f32)>,
) -> DataflowResult<Vec<Option<Vec<Detection>>>> {
    let Some(config) = &cfg.yolo else {
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
                        Some(BackMap::Letterbox { gain, pad_x, pad_y })
                    }
                    _ => None,
                }
            }
            (None, Some([w, h]), Some((sw, sh))) => Some(BackMap::Stretch {
                sx: sw / w as f32,
                sy: sh / h as f32,
            }),
            _ => None,
        };
        let values = values.get(row * per_row..(row + 1) * per_row);
        match (back, values) {
            (Some(back), Some(values)) if list.is_valid(row) => {
                out.push(Some(detect_row(
                    cfg,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two classes, three anchors, laid out `[attrs, anchors]`.
    fn v8_row() -> Vec<f32> {
        // anchor:   0     1     2
        vec![
            10.0, 50.0, 90.0, // cx
            10.0, 50.0, 90.0, // cy
            4.0, 20.0, 10.0, // w
            4.0, 10.0, 10.0, // h
            0.9, 0.1, 0.3, // class 0
            0.2, 0.8, 0.1, // class 1
        ]
    }

    #[test]
    fn v8_candidates_take_the_best_class_and_convert_cxcywh() {
        let layout = Layout {
            attrs: 6,
            anchors: 3,
            attrs_first: true,
        };
        let found = candidates(&v8_row(), layout, YoloVersion::V8, 0.5, |_| true);
        let got: Vec<(i64, f32, [f32; 4])> = found
            .iter()
            .map(|d| (d.class_id, d.score, d.rect))
            .collect();
        assert_eq!(
            got,
            [
                (0, 0.9, [8.0, 8.0, 12.0, 12.0]),
                (1, 0.8, [40.0, 45.0, 60.0, 55.0])
            ]
        );
    }

    #[test]
    fn the_transposed_layout_gives_the_same_candidates() {
        let row = v8_row();
        let transposed: Vec<f32> = (0..3)
            .flat_map(|anchor| (0..6).map(move |attr| (anchor, attr)))
            .map(|(anchor, attr)| row[attr * 3 + anchor])
            .collect();
        let layout = |attrs_first| Layout {
            attrs: 6,
            anchors: 3,
            attrs_first,
        };
        let a = candidates(&row, layout(true), YoloVersion::V8, 0.25, |_| true);
        let b = candidates(&transposed, layout(false), YoloVersion::V8, 0.25, |_| true);
        assert_eq!(a.len(), 3);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn v5_scores_are_objectness_times_class() {
        // [anchors, attrs]: cx, cy, w, h, objectness, class 0, class 1.
        let row = vec![
            10.0, 10.0, 2.0, 2.0, 0.9, 0.5, 0.9, // 0.81 for class 1
            20.0, 20.0, 2.0, 2.0, 0.4, 1.0, 0.0, // objectness below the threshold
        ];
        let layout = Layout {
            attrs: 7,
            anchors: 2,
            attrs_first: false,
        };
        let found = candidates(&row, layout, YoloVersion::V5, 0.5, |_| true);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].class_id, 1);
        assert!((found[0].score - 0.81).abs() < 1e-6);
        // A class filter drops it.
        assert!(candidates(&row, layout, YoloVersion::V5, 0.5, |c| c == 0).is_empty());
    }

    #[test]
    fn boxes_map_back_through_a_letterbox() {
        let map = BackMap::Letterbox {
            gain: 0.5,
            pad_x: 0.0,
            pad_y: 184.0,
        };
        assert_eq!(
            map.apply([10.0, 194.0, 20.0, 204.0]),
            [20.0, 20.0, 40.0, 40.0]
        );
    }
}
