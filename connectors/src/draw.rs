//! Drawing results on their frames, shared by the `annotate` (JPEG) and `video` (H.264) sinks:
//! where a row's picture is, the boxes of its detections (coloured by track id, else class),
//! their labels (`#12 person`, an 8×8 bitmap font scaled to the frame) and camera folder names.

// Labels are drawn by the video sink only, which needs the `video` feature.
#![cfg_attr(not(feature = "video"), allow(dead_code))]

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type, UInt32Type};
use arrow_array::{Array, RecordBatch, StructArray};
use font8x8::UnicodeFonts;
use riffle_dataflow::error::{DataflowError, DataflowResult};

/// Box colours (RGB), by track id or class id.
pub(crate) const PALETTE: [[u8; 3]; 8] = [
    [255, 77, 77],
    [77, 210, 255],
    [255, 210, 77],
    [125, 255, 77],
    [255, 77, 210],
    [77, 125, 255],
    [255, 159, 77],
    [184, 77, 255],
];
/// Line width of a box, pixels.
pub(crate) const THICKNESS: u32 = 3;
/// The colour of label text, on the box's colour.
const INK: [u8; 3] = [0, 0, 0];
/// Side of a glyph of the font, pixels before scaling.
const GLYPH: u32 = 8;

/// One box to draw.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Box2 {
    pub x1: f32,
    pub y1: f32,
    pub x2: f32,
    pub y2: f32,
    pub colour: [u8; 3],
    /// `#<track id> <label>`, either part when known.
    pub label: Option<String>,
}

/// Where a row's picture is.
pub(crate) enum Picture<'a> {
    Encoded(&'a arrow_array::BinaryArray),
    Raw(
        &'a arrow_array::BinaryArray,
        &'a arrow_array::UInt32Array,
        &'a arrow_array::UInt32Array,
    ),
    File(&'a arrow_array::StringArray),
}

impl<'a> Picture<'a> {
    /// The picture columns of `batch`: `bytes` (JPEG), `pixels` + `width` + `height` (RGB) or
    /// `path` (a JPEG file), in that order; `sink` names the sink in the error.
    pub fn of(batch: &'a RecordBatch, sink: &str) -> DataflowResult<Self> {
        let binary = |name| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_binary_opt::<i32>())
        };
        let size = |name| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_primitive_opt::<UInt32Type>())
        };
        if let Some(bytes) = binary("bytes") {
            return Ok(Picture::Encoded(bytes));
        }
        if let (Some(p), Some(w), Some(h)) = (binary("pixels"), size("width"), size("height")) {
            return Ok(Picture::Raw(p, w, h));
        }
        if let Some(path) = batch
            .column_by_name("path")
            .and_then(|c| c.as_string_opt::<i32>())
        {
            return Ok(Picture::File(path));
        }
        let names: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        Err(DataflowError::Config(format!(
            "{sink} sink: the results need the frame's picture: a `bytes` column (JPEG), \
             `pixels` with `width` and `height` (RGB), or `path` (a JPEG file); they have {} \
             (keep one of them in the last `select`)",
            names.join(", ")
        )))
    }

    /// Row `row`'s picture as `(width, height, packed RGB)`; the error says why there is none.
    pub fn rgb(&self, row: usize) -> Result<(u32, u32, Vec<u8>), String> {
        match self {
            Picture::Encoded(bytes) => {
                if bytes.is_null(row) {
                    return Err("no picture (`bytes` is null)".into());
                }
                decode_jpeg(bytes.value(row))
            }
            Picture::Raw(p, w, h) => {
                if p.is_null(row) {
                    return Err("no picture (`pixels` is null)".into());
                }
                if w.is_null(row) || h.is_null(row) {
                    return Err("no size (`width` or `height` is null)".into());
                }
                let (width, height) = (w.value(row), h.value(row));
                let pixels = p.value(row);
                if width == 0 || height == 0 {
                    return Err(format!("an empty picture ({width}×{height})"));
                }
                if pixels.len() as u64 != u64::from(width) * u64::from(height) * 3 {
                    return Err(format!(
                        "{} bytes of pixels for {width}×{height} RGB",
                        pixels.len()
                    ));
                }
                Ok((width, height, pixels.to_vec()))
            }
            Picture::File(path) => {
                if path.is_null(row) {
                    return Err("no picture (`path` is null)".into());
                }
                let path = Path::new(path.value(row));
                let bytes =
                    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
                decode_jpeg(&bytes)
            }
        }
    }
}

fn decode_jpeg(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>), String> {
    use zune_jpeg::zune_core::bytestream::ZCursor;
    use zune_jpeg::zune_core::colorspace::ColorSpace;
    use zune_jpeg::zune_core::options::DecoderOptions;
    let options = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    let pixels = decoder.decode().map_err(|e| format!("not a JPEG: {e}"))?;
    let (width, height) = decoder
        .dimensions()
        .ok_or_else(|| "a JPEG without dimensions".to_string())?;
    Ok((width as u32, height as u32, pixels))
}

/// The boxes of one row's detections (`x1`, `y1`, `x2`, `y2`; `track_id`, `class_id` and
/// `label` when present); entries without the four corners draw nothing.
pub(crate) fn boxes(entries: Option<&StructArray>) -> Vec<Box2> {
    let Some(entries) = entries else {
        return Vec::new();
    };
    let coord = |name| {
        entries
            .column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<Float32Type>())
    };
    let id = |name| {
        entries
            .column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
    };
    let (Some(x1), Some(y1), Some(x2), Some(y2)) =
        (coord("x1"), coord("y1"), coord("x2"), coord("y2"))
    else {
        return Vec::new();
    };
    let (track, class) = (id("track_id"), id("class_id"));
    let labels = entries
        .column_by_name("label")
        .and_then(|c| c.as_string_opt::<i32>());
    (0..entries.len())
        .map(|i| {
            let track_id = track.filter(|t| !t.is_null(i)).map(|t| t.value(i));
            let key = track_id
                .or(class.filter(|c| !c.is_null(i)).map(|c| c.value(i)))
                .unwrap_or(i as i64);
            let name = labels.filter(|l| !l.is_null(i)).map(|l| l.value(i));
            let label = match (track_id, name) {
                (Some(t), Some(n)) => Some(format!("#{t} {n}")),
                (Some(t), None) => Some(format!("#{t}")),
                (None, Some(n)) => Some(n.to_string()),
                (None, None) => None,
            };
            Box2 {
                x1: x1.value(i),
                y1: y1.value(i),
                x2: x2.value(i),
                y2: y2.value(i),
                colour: PALETTE
                    .get(key.unsigned_abs() as usize % PALETTE.len())
                    .copied()
                    .unwrap_or([255, 0, 0]),
                label,
            }
        })
        .collect()
}

/// A box's corners as pixel indices inside the picture, or `None` when it cannot be drawn.
fn corners(width: u32, height: u32, b: &Box2) -> Option<(u32, u32, u32, u32)> {
    if width == 0
        || height == 0
        || !(b.x1.is_finite() && b.y1.is_finite() && b.x2.is_finite() && b.y2.is_finite())
    {
        return None;
    }
    let clamp = |v: f32, max: u32| (v.max(0.0) as u32).min(max - 1);
    Some((
        clamp(b.x1.min(b.x2), width),
        clamp(b.y1.min(b.y2), height),
        clamp(b.x1.max(b.x2), width),
        clamp(b.y1.max(b.y2), height),
    ))
}

fn put(pixels: &mut [u8], width: u32, x: u32, y: u32, colour: [u8; 3]) {
    let at = (y as usize * width as usize + x as usize) * 3;
    if let Some(px) = pixels.get_mut(at..at + 3) {
        px.copy_from_slice(&colour);
    }
}

/// Draws `b`'s outline, clipped to the picture (`pixels`: packed RGB, `width` × `height`).
pub(crate) fn draw_box(pixels: &mut [u8], width: u32, height: u32, b: &Box2) {
    let Some((x1, y1, x2, y2)) = corners(width, height, b) else {
        return;
    };
    for t in 0..THICKNESS {
        for x in x1..=x2 {
            put(pixels, width, x, (y1 + t).min(y2), b.colour);
            put(pixels, width, x, y2.saturating_sub(t).max(y1), b.colour);
        }
        for y in y1..=y2 {
            put(pixels, width, (x1 + t).min(x2), y, b.colour);
            put(pixels, width, x2.saturating_sub(t).max(x1), y, b.colour);
        }
    }
}

/// How much the 8×8 font is enlarged on a picture `height` rows high: readable at a glance
/// from 360 rows to 4K (1 up to 539 rows, 3 at 1080).
pub(crate) fn text_scale(height: u32) -> u32 {
    (height / 360).max(1)
}

/// The size of `text` drawn at `scale`, in pixels.
pub(crate) fn text_size(text: &str, scale: u32) -> (u32, u32) {
    let chars = u32::try_from(text.chars().count()).unwrap_or(u32::MAX);
    (
        chars.saturating_mul(GLYPH).saturating_mul(scale),
        GLYPH * scale,
    )
}

/// Draws `text` with its top-left corner at (`x`, `y`), each font pixel a `scale`-sided square
/// of `colour`, clipped to the picture; characters the font lacks are drawn as `?`.
pub(crate) fn draw_text(
    pixels: &mut [u8],
    width: u32,
    height: u32,
    (x, y): (u32, u32),
    text: &str,
    scale: u32,
    colour: [u8; 3],
) {
    let scale = scale.max(1);
    let mut left = x;
    for c in text.chars() {
        let glyph = font8x8::BASIC_FONTS
            .get(c)
            .or_else(|| font8x8::BASIC_FONTS.get('?'))
            .unwrap_or_default();
        for (row, bits) in (0u32..).zip(glyph) {
            for col in 0..GLYPH {
                // Bit 0 is the glyph's leftmost pixel.
                if bits & (1 << col) == 0 {
                    continue;
                }
                for dy in 0..scale {
                    for dx in 0..scale {
                        let px = left + col * scale + dx;
                        let py = y + row * scale + dy;
                        if px < width && py < height {
                            put(pixels, width, px, py, colour);
                        }
                    }
                }
            }
        }
        left = left.saturating_add(GLYPH * scale);
        if left >= width {
            break;
        }
    }
}

/// Draws `b`'s label on a band of its colour: above the box when there is room, else just
/// inside its top edge; clipped to the picture.
pub(crate) fn draw_label(pixels: &mut [u8], width: u32, height: u32, b: &Box2) {
    let (Some(text), Some((x1, y1, _, _))) = (b.label.as_deref(), corners(width, height, b)) else {
        return;
    };
    let scale = text_scale(height);
    let (w, h) = text_size(text, scale);
    // A margin of one scaled pixel around the text.
    let (band_w, band_h) = (w + 2 * scale, h + 2 * scale);
    let top = if y1 >= band_h { y1 - band_h } else { y1 };
    for y in top..(top + band_h).min(height) {
        for x in x1..(x1.saturating_add(band_w)).min(width) {
            put(pixels, width, x, y, b.colour);
        }
    }
    draw_text(
        pixels,
        width,
        height,
        (x1 + scale, top + scale),
        text,
        scale,
        INK,
    );
}

/// Draws every box, then every label (so no box's outline crosses a label).
pub(crate) fn draw_boxes_and_labels(pixels: &mut [u8], width: u32, height: u32, boxes: &[Box2]) {
    for b in boxes {
        draw_box(pixels, width, height, b);
    }
    for b in boxes {
        draw_label(pixels, width, height, b);
    }
}

/// A camera id as one path component.
/// The camera and frame columns of a batch of results for the `kind` sink.
pub(crate) fn frame_columns<'a>(
    batch: &'a arrow_array::RecordBatch,
    kind: &str,
) -> riffle_dataflow::DataflowResult<(&'a arrow_array::StringArray, &'a arrow_array::Int64Array)> {
    use arrow_array::cast::AsArray;
    let cameras = batch
        .column_by_name("camera_id")
        .and_then(|c| c.as_string_opt::<i32>());
    let frames = batch
        .column_by_name("frame")
        .and_then(|c| c.as_primitive_opt::<arrow_array::types::Int64Type>());
    match (cameras, frames) {
        (Some(cameras), Some(frames)) => Ok((cameras, frames)),
        _ => Err(riffle_dataflow::DataflowError::Config(format!(
            "{kind} sink: the results need `camera_id` (Utf8) and `frame` (Int64) columns"
        ))),
    }
}

/// Checks, before running, that results in `schema` can be drawn by the `kind` sink: they
/// name their camera and frame (`purpose`: what for), carry a picture (`picture`: the message
/// when they do not, with `{}` for the columns they have) and the `detections` list column.
pub(crate) fn check_drawable(
    schema: &arrow_schema::Schema,
    kind: &str,
    detections: &str,
    purpose: &str,
    picture: &str,
) -> Result<(), String> {
    use arrow_schema::DataType;
    let has = |name: &str, types: &[DataType]| {
        schema
            .field_with_name(name)
            .is_ok_and(|f| types.contains(f.data_type()))
    };
    let columns = schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if !has("camera_id", &[DataType::Utf8]) || !has("frame", &[DataType::Int64]) {
        return Err(format!(
            "expected results with `camera_id` (Utf8) and `frame` (Int64){purpose}; they have \
             {columns}"
        ));
    }
    let drawable = has("bytes", &[DataType::Binary])
        || (has("pixels", &[DataType::Binary])
            && has("width", &[DataType::UInt32])
            && has("height", &[DataType::UInt32]))
        || has("path", &[DataType::Utf8]);
    if !drawable {
        return Err(picture.replace("{}", &columns));
    }
    match schema.field_with_name(detections) {
        Ok(f) if matches!(f.data_type(), DataType::List(_)) => Ok(()),
        Ok(f) => Err(format!(
            "{kind}.detections: `{detections}` is {}, expected a list of detections (x1, y1, \
             x2, y2)",
            f.data_type()
        )),
        Err(_) => Err(format!(
            "{kind}.detections: no column `{detections}` in the results ({columns})"
        )),
    }
}

pub(crate) fn sanitize(camera: &str) -> String {
    let cleaned: String = camera
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match cleaned.as_str() {
        "" | "." | ".." => "_".to_string(),
        _ => cleaned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pixels: &[u8], w: u32, x: u32, y: u32) -> [u8; 3] {
        let i = ((y * w + x) * 3) as usize;
        [pixels[i], pixels[i + 1], pixels[i + 2]]
    }

    fn a_box(label: Option<&str>) -> Box2 {
        Box2 {
            x1: 2.0,
            y1: 1.0,
            x2: 50.0,
            y2: 8.0,
            colour: [255, 0, 0],
            label: label.map(str::to_string),
        }
    }

    #[test]
    fn draws_clipped_boxes_and_names_files_safely() {
        let (w, h) = (20u32, 10u32);
        let mut pixels = vec![0u8; (w * h * 3) as usize];
        draw_box(&mut pixels, w, h, &a_box(None));
        assert_eq!(at(&pixels, w, 10, 1), [255, 0, 0], "top edge");
        assert_eq!(
            at(&pixels, w, 19, 5),
            [255, 0, 0],
            "right edge clipped to the picture"
        );
        assert_eq!(at(&pixels, w, 10, 5), [0, 0, 0], "inside stays");
        assert_eq!(sanitize("../cam/1"), ".._cam_1");
        assert_eq!(sanitize(".."), "_");
    }

    #[test]
    fn text_lands_where_the_font_says() {
        let (w, h) = (40u32, 20u32);
        let mut pixels = vec![0u8; (w * h * 3) as usize];
        let white = [255, 255, 255];
        // '1' in the font: rows 0b00001100, 0b00001110, then the stem, a 0b00111111 foot.
        draw_text(&mut pixels, w, h, (4, 2), "1", 1, white);
        let glyph = font8x8::BASIC_FONTS.get('1').unwrap();
        for row in 0..8u32 {
            for col in 0..8u32 {
                let on = glyph[row as usize] & (1 << col) != 0;
                let want = if on { white } else { [0, 0, 0] };
                assert_eq!(at(&pixels, w, 4 + col, 2 + row), want, "({col}, {row})");
            }
        }
        // The flag of the `1` points left: column 1 of row 1 is set, column 1 of row 0 not.
        assert_eq!(at(&pixels, w, 5, 3), white);
        assert_eq!(at(&pixels, w, 5, 2), [0, 0, 0]);
        // Scaled by 2: each font pixel is a 2×2 square; the picture's edge clips.
        let mut big = vec![0u8; (w * h * 3) as usize];
        draw_text(&mut big, w, h, (0, 0), "11111", 2, white);
        assert_eq!(at(&big, w, 2 * 2, 2 * 6), white, "foot of the first `1`");
        assert_eq!(at(&big, w, 2 * 2 + 1, 2 * 6 + 1), white);
        assert_eq!(at(&big, w, 16 + 2 * 2, 2 * 6), white, "the second `1`");
        assert_eq!(text_size("#12 person", 1), (80, 8));
        assert_eq!(text_size("#12", 3), (72, 24));
    }

    #[test]
    fn a_label_sits_above_its_box_or_inside_at_the_top() {
        let (w, h) = (100u32, 60u32);
        let mut pixels = vec![0u8; (w * h * 3) as usize];
        let mut b = a_box(Some("#7"));
        (b.x1, b.y1, b.x2, b.y2) = (10.0, 30.0, 90.0, 55.0);
        draw_boxes_and_labels(&mut pixels, w, h, &[b.clone()]);
        // Band: 2 + 16 wide, 10 high, from row 20 to 29 above the top edge at row 30.
        assert_eq!(at(&pixels, w, 10, 20), [255, 0, 0], "band's corner");
        assert_eq!(at(&pixels, w, 27, 29), [255, 0, 0], "band's other corner");
        assert_eq!(
            at(&pixels, w, 28, 25),
            [0, 0, 0],
            "right of the band: untouched"
        );
        assert_eq!(
            at(&pixels, w, 10, 19),
            [0, 0, 0],
            "above the band: untouched"
        );
        // The `#` of the font, drawn in ink from (11, 21).
        let glyph = font8x8::BASIC_FONTS.get('#').unwrap();
        let mut ink = 0;
        for row in 0..8u32 {
            for col in 0..8u32 {
                let on = glyph[row as usize] & (1 << col) != 0;
                let want = if on { INK } else { [255, 0, 0] };
                assert_eq!(at(&pixels, w, 11 + col, 21 + row), want, "# ({col}, {row})");
                ink += u32::from(on);
            }
        }
        assert!(ink > 10);
        // A box at the top: the band goes inside it, from its top edge down.
        let mut top = vec![0u8; (w * h * 3) as usize];
        b.y1 = 2.0;
        draw_label(&mut top, w, h, &b);
        assert_eq!(at(&top, w, 10, 2), [255, 0, 0]);
        assert_eq!(at(&top, w, 10, 11), [255, 0, 0]);
        assert_eq!(at(&top, w, 10, 12), [0, 0, 0]);
        assert_eq!(at(&top, w, 10, 1), [0, 0, 0]);
    }

    #[test]
    fn labels_name_the_track_and_the_class() {
        use arrow_array::{Float32Array, Int64Array, StringArray};
        use arrow_schema::{DataType, Field};
        use std::sync::Arc;
        let f = |v: Vec<f32>| Arc::new(Float32Array::from(v)) as Arc<dyn Array>;
        let entries = StructArray::from(vec![
            (
                Arc::new(Field::new("x1", DataType::Float32, false)),
                f(vec![0.0, 0.0, 0.0]),
            ),
            (
                Arc::new(Field::new("y1", DataType::Float32, false)),
                f(vec![0.0, 0.0, 0.0]),
            ),
            (
                Arc::new(Field::new("x2", DataType::Float32, false)),
                f(vec![5.0, 5.0, 5.0]),
            ),
            (
                Arc::new(Field::new("y2", DataType::Float32, false)),
                f(vec![5.0, 5.0, 5.0]),
            ),
            (
                Arc::new(Field::new("track_id", DataType::Int64, true)),
                Arc::new(Int64Array::from(vec![Some(12), None, Some(3)])) as Arc<dyn Array>,
            ),
            (
                Arc::new(Field::new("label", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec![Some("person"), Some("car"), None]))
                    as Arc<dyn Array>,
            ),
        ]);
        let labels: Vec<Option<String>> =
            boxes(Some(&entries)).into_iter().map(|b| b.label).collect();
        assert_eq!(
            labels,
            [
                Some("#12 person".to_string()),
                Some("car".to_string()),
                Some("#3".to_string())
            ]
        );
        let colours: Vec<[u8; 3]> = boxes(Some(&entries)).iter().map(|b| b.colour).collect();
        assert_eq!(colours[0], PALETTE[12 % PALETTE.len()], "by track id");
    }
}
