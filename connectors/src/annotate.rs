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
use arrow_array::{Array, RecordBatch};
use riffle_dataflow::error::{DataflowError, DataflowResult};
use riffle_dataflow::sink::{Sink, SinkFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::draw::{self, sanitize, Picture};
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
        crate::draw::check_drawable(
            schema,
            "annotate",
            &self.detections,
            " to name the files",
            "expected the frame's picture in the results: a `bytes` column (JPEG), `pixels` \
             with `width` and `height` (RGB), or `path` (a JPEG file); they have {} (keep one of \
             them in the last `select`)",
        )
    }
}

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

impl Sink for AnnotateSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let (cameras, frames) = crate::draw::frame_columns(batch, "annotate")?;
        let picture = Picture::of(batch, "annotate")?;
        let detections = batch
            .column_by_name(&self.config.detections)
            .and_then(|c| c.as_list_opt::<i32>());
        for row in 0..batch.num_rows() {
            let camera = sanitize(cameras.value(row));
            let frame = frames.value(row);
            let boxes = detections
                .filter(|d| !d.is_null(row))
                .map(|d| draw::boxes(d.value(row).as_struct_opt()))
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
                draw::draw_box(&mut pixels, width, height, b);
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
