//! The `annotate` sink: each result's frame as a JPEG file with its detections drawn, for people
//! who were not watching (`<dir>/<camera_id>/<frame>.jpg`).
//!
//! The picture comes from the result row: a `bytes` column (the JPEG as read), a `pixels`
//! column (packed RGB, with `width` and `height`, as the video source makes them) or a `path`
//! column (the file is read again). Boxes come from a list column of detections whose entries
//! have `x1`, `y1`, `x2`, `y2` in source pixels (the `detections` and `track` stages make
//! them), coloured by track id, else by class. A frame written again after a restart replaces
//! its file (written whole, then renamed), so replays leave one file per frame.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type, UInt32Type};
use arrow_array::{Array, RecordBatch, StructArray};
use riffle_dataflow::error::{DataflowError, DataflowResult};
use riffle_dataflow::sink::{Sink, SinkFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::kind::Limits;
use crate::kind::SinkKind;
use riffle_dataflow::range::Range;

/// `sink: { annotate: { dir: ..., detections: detections, quality: 85 } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnotateSinkConfig {
    /// Folder of the pictures: `<dir>/<camera_id>/<frame>.jpg`.
    pub dir: PathBuf,
    /// The list column of detections to draw.
    #[serde_inline_default("detections".to_string())]
    pub detections: String,
    /// JPEG quality, 1 to 100.
    #[serde_inline_default(85)]
    pub quality: u8,
}

impl AnnotateSinkConfig {
    /// Checks, before running, that results in `schema` name their files and carry a picture;
    /// the message says what is missing and what would do.
    fn check_schema(&self, schema: &arrow_schema::Schema) -> Result<(), String> {
        use arrow_schema::DataType;
        let has = |name: &str, types: &[DataType]| {
            schema
                .field_with_name(name)
                .is_ok_and(|f| types.contains(f.data_type()))
        };
        let columns = || {
            schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !has("camera_id", &[DataType::Utf8]) || !has("frame", &[DataType::Int64]) {
            return Err(format!(
                "expected results with `camera_id` (Utf8) and `frame` (Int64) to name the files; they have {}",
                columns()
            ));
        }
        let picture = has("bytes", &[DataType::Binary])
            || (has("pixels", &[DataType::Binary])
                && has("width", &[DataType::UInt32])
                && has("height", &[DataType::UInt32]))
            || has("path", &[DataType::Utf8]);
        if !picture {
            return Err(format!(
                "expected the frame's picture in the results: a `bytes` column (JPEG), `pixels` \
                 with `width` and `height` (RGB), or `path` (a JPEG file); they have {} (keep one \
                 of them in the last `select`)",
                columns()
            ));
        }
        match schema.field_with_name(&self.detections) {
            Ok(f) if matches!(f.data_type(), DataType::List(_)) => Ok(()),
            Ok(f) => Err(format!(
                "annotate.detections: `{}` is {}, expected a list of detections (x1, y1, x2, y2)",
                self.detections,
                f.data_type()
            )),
            Err(_) => Err(format!(
                "annotate.detections: no column `{}` in the results ({})",
                self.detections,
                columns()
            )),
        }
    }
}

/// Box colours (RGB), by track id or class id.
const PALETTE: [[u8; 3]; 8] = [
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
const THICKNESS: u32 = 3;

impl SinkFactory for AnnotateSinkConfig {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        if !(1..=100).contains(&self.quality) {
            return Err(DataflowError::Config(format!(
                "annotate.quality: expected 1 to 100, found {}",
                self.quality
            )));
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| DataflowError::io(format!("creating {}", self.dir.display()), e))?;
        Ok(Box::new(AnnotateSink {
            config: self.clone(),
            skipped: 0,
        }))
    }
}

struct AnnotateSink {
    config: AnnotateSinkConfig,
    skipped: u64,
}

/// One box to draw.
struct Box2 {
    x1: f32,
    y1: f32,
    x2: f32,
    y2: f32,
    colour: [u8; 3],
}

impl Sink for AnnotateSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let cameras = batch
            .column_by_name("camera_id")
            .and_then(|c| c.as_string_opt::<i32>());
        let frames = batch
            .column_by_name("frame")
            .and_then(|c| c.as_primitive_opt::<Int64Type>());
        let (Some(cameras), Some(frames)) = (cameras, frames) else {
            return Err(DataflowError::Config(
                "annotate sink: the results need `camera_id` (Utf8) and `frame` (Int64) columns to name the files".into(),
            ));
        };
        let picture = Picture::of(batch)?;
        let detections = batch
            .column_by_name(&self.config.detections)
            .and_then(|c| c.as_list_opt::<i32>());
        for row in 0..batch.num_rows() {
            let camera = sanitize(cameras.value(row));
            let frame = frames.value(row);
            let boxes = detections
                .filter(|d| !d.is_null(row))
                .map(|d| boxes(d.value(row).as_struct_opt()))
                .unwrap_or_default();
            let rgb = match picture.rgb(row) {
                Ok(rgb) => rgb,
                Err(why) => {
                    self.skip(&camera, frame, &why);
                    continue;
                }
            };
            let (width, height, mut pixels) = rgb;
            for b in &boxes {
                draw_box(&mut pixels, width, height, b);
            }
            let dir = self.config.dir.join(&camera);
            let path = dir.join(format!("{frame}.jpg"));
            write_jpeg(&dir, &path, width, height, &pixels, self.config.quality)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}

impl AnnotateSink {
    fn skip(&mut self, camera: &str, frame: i64, why: &str) {
        self.skipped += 1;
        // One line a picture for the first few, then one every thousand: never a flood.
        if self.skipped <= 10 || self.skipped.is_multiple_of(1000) {
            tracing::warn!(
                "annotate: {camera} frame {frame} not drawn ({why}); {} skipped so far",
                self.skipped
            );
        }
    }
}

/// Where a row's picture is.
enum Picture<'a> {
    Encoded(&'a arrow_array::BinaryArray),
    Raw(
        &'a arrow_array::BinaryArray,
        &'a arrow_array::UInt32Array,
        &'a arrow_array::UInt32Array,
    ),
    File(&'a arrow_array::StringArray),
}

impl<'a> Picture<'a> {
    fn of(batch: &'a RecordBatch) -> DataflowResult<Self> {
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
            "annotate sink: the results need the frame's picture: a `bytes` column (JPEG), \
             `pixels` with `width` and `height` (RGB), or `path` (a JPEG file); they have {} \
             (keep one of them in the last `select`)",
            names.join(", ")
        )))
    }

    /// Row `row`'s picture as packed RGB.
    fn rgb(&self, row: usize) -> Result<(u32, u32, Vec<u8>), String> {
        match self {
            Picture::Encoded(bytes) => decode_jpeg(bytes.value(row)),
            Picture::Raw(p, w, h) => {
                let (width, height) = (w.value(row), h.value(row));
                let pixels = p.value(row);
                if pixels.len() as u64 != u64::from(width) * u64::from(height) * 3 {
                    return Err(format!(
                        "{} bytes of pixels for {width}×{height} RGB",
                        pixels.len()
                    ));
                }
                Ok((width, height, pixels.to_vec()))
            }
            Picture::File(path) => {
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

fn boxes(entries: Option<&StructArray>) -> Vec<Box2> {
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
    (0..entries.len())
        .map(|i| {
            let key = track
                .filter(|t| !t.is_null(i))
                .or(class.filter(|c| !c.is_null(i)))
                .map_or(i as i64, |c| c.value(i));
            Box2 {
                x1: x1.value(i),
                y1: y1.value(i),
                x2: x2.value(i),
                y2: y2.value(i),
                colour: PALETTE
                    .get(key.unsigned_abs() as usize % PALETTE.len())
                    .copied()
                    .unwrap_or([255, 0, 0]),
            }
        })
        .collect()
}

/// Draws `b`'s outline, clipped to the picture.
fn draw_box(pixels: &mut [u8], width: u32, height: u32, b: &Box2) {
    if width == 0
        || height == 0
        || !(b.x1.is_finite() && b.y1.is_finite() && b.x2.is_finite() && b.y2.is_finite())
    {
        return;
    }
    let clamp = |v: f32, max: u32| (v.max(0.0) as u32).min(max - 1);
    let (x1, x2) = (clamp(b.x1.min(b.x2), width), clamp(b.x1.max(b.x2), width));
    let (y1, y2) = (clamp(b.y1.min(b.y2), height), clamp(b.y1.max(b.y2), height));
    let mut put = |x: u32, y: u32| {
        let at = (y as usize * width as usize + x as usize) * 3;
        if let Some(px) = pixels.get_mut(at..at + 3) {
            px.copy_from_slice(&b.colour);
        }
    };
    for t in 0..THICKNESS {
        for x in x1..=x2 {
            put(x, (y1 + t).min(y2));
            put(x, y2.saturating_sub(t).max(y1));
        }
        for y in y1..=y2 {
            put((x1 + t).min(x2), y);
            put(x2.saturating_sub(t).max(x1), y);
        }
    }
}

fn write_jpeg(
    dir: &Path,
    path: &Path,
    width: u32,
    height: u32,
    pixels: &[u8],
    quality: u8,
) -> DataflowResult<()> {
    let too_big = || {
        DataflowError::Config(format!(
            "{}: {width}×{height} is too large for a JPEG",
            path.display()
        ))
    };
    let (w, h) = (
        u16::try_from(width).map_err(|_| too_big())?,
        u16::try_from(height).map_err(|_| too_big())?,
    );
    let mut jpeg = Vec::new();
    jpeg_encoder::Encoder::new(&mut jpeg, quality)
        .encode(pixels, w, h, jpeg_encoder::ColorType::Rgb)
        .map_err(|e| DataflowError::Config(format!("{}: encoding: {e}", path.display())))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| DataflowError::io(format!("creating {}", dir.display()), e))?;
    let partial = path.with_extension("jpg.partial");
    std::fs::write(&partial, &jpeg)
        .map_err(|e| DataflowError::io(format!("writing {}", partial.display()), e))?;
    std::fs::rename(&partial, path)
        .map_err(|e| DataflowError::io(format!("renaming to {}", path.display()), e))
}

/// A camera id as one path component.
fn sanitize(camera: &str) -> String {
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

impl SinkKind for AnnotateSinkConfig {
    fn kind(&self) -> &'static str {
        "annotate"
    }
    /// The folder: `--output` moves it. It holds a file per frame, none of them to check.
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.dir]
    }
    fn check_input(&self, schema: &arrow_schema::Schema) -> Result<(), String> {
        self.check_schema(schema)
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(Box::new(self.clone()))
    }
}

impl Limits for AnnotateSinkConfig {
    const RANGES: &'static [Range] = &[Range::int("annotate.quality", 1, 100)];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_clipped_boxes_and_names_files_safely() {
        let (w, h) = (20u32, 10u32);
        let mut pixels = vec![0u8; (w * h * 3) as usize];
        let b = Box2 {
            x1: 2.0,
            y1: 1.0,
            x2: 50.0,
            y2: 8.0,
            colour: [255, 0, 0],
        };
        draw_box(&mut pixels, w, h, &b);
        let at =
            |x: u32, y: u32| &pixels[((y * w + x) * 3) as usize..((y * w + x) * 3 + 3) as usize];
        assert_eq!(at(10, 1), &[255, 0, 0], "top edge");
        assert_eq!(at(19, 5), &[255, 0, 0], "right edge clipped to the picture");
        assert_eq!(at(10, 5), &[0, 0, 0], "inside stays");
        assert_eq!(sanitize("../cam/1"), ".._cam_1");
        assert_eq!(sanitize(".."), "_");
    }
}
