//! The `video` sink: each camera's result frames with their detections drawn (boxes coloured
//! by track id, labels `#12 person`), encoded to H.264 by FFmpeg's libraries (libx264) into
//! fragmented MP4 files, `<dir>/<camera_id>/<UTC start>.mp4`, a new file every
//! `segment_seconds` of stream time, so a person can watch any camera at its full frame rate
//! with the pipeline's drawings, while the file is being written.
//!
//! Frames are timed by `pts_ms` (else `frame` / `fps`). Rows whose picture is missing or does
//! not match its size are dead letters, appended to `dead_letter_path` (a sink sees no
//! pipeline dead-letter stream). Encoding needs the crate's `video` feature; without it the
//! configuration still parses and validation says how to get the feature.

#[cfg(feature = "video")]
mod encoder;
#[cfg(feature = "video")]
mod sink;

use std::path::{Path, PathBuf};

use riffle_dataflow::error::{DataflowError, DataflowResult};
use riffle_dataflow::range::Range;
use riffle_dataflow::sink::SinkFactory;
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::kind::{Limits, SinkKind};

/// libx264's presets, fastest first.
pub const PRESETS: [&str; 10] = [
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
];

/// `sink: { video: { dir: out/video, segment_seconds: 60, fps: 25, crf: 23, preset: veryfast,
/// detections: detections } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VideoSinkConfig {
    /// Folder of the videos: `<dir>/<camera_id>/<UTC start>.mp4`.
    pub dir: PathBuf,
    /// Stream time (`pts_ms`) per file; the next frame after it starts a new file.
    #[serde_inline_default(60.0)]
    pub segment_seconds: f64,
    /// The frame rate told to the encoder, and the frames' times when `pts_ms` is missing
    /// (`frame` / `fps`). A keyframe (and a fragment of the file) every 2 s of frames at it.
    #[serde_inline_default(25.0)]
    pub fps: f64,
    /// x264's constant rate factor: 0 (lossless) to 51 (worst); 23 is its default.
    #[serde_inline_default(23)]
    pub crf: u32,
    /// x264's speed/size trade-off (`ultrafast` … `placebo`).
    #[serde_inline_default("veryfast".to_string())]
    pub preset: String,
    /// The list column of detections to draw.
    #[serde_inline_default("detections".to_string())]
    pub detections: String,
    /// Also a live stream per camera, `<dir>/<camera>/live/index.m3u8` (HLS), which the live
    /// view plays.
    #[serde_inline_default(true)]
    pub live: bool,
    /// JSON lines file for rows that could not be encoded (default
    /// `<dir>/dead-letters.jsonl`).
    #[serde(default)]
    pub dead_letter_path: Option<PathBuf>,
}

const SEGMENT_SECONDS: Range = Range::real("video.segment_seconds", 0.1, 86_400.0);
const CRF: Range = Range::int("video.crf", 0, 51);
/// The same range as `fps` has elsewhere (the reference has one row per key).
const FPS: Range = Range::real("fps", 1e-6, 1000.0);

impl VideoSinkConfig {
    /// Where rejected rows go.
    pub fn dead_letter_file(&self) -> PathBuf {
        self.dead_letter_path
            .clone()
            .unwrap_or_else(|| self.dir.join("dead-letters.jsonl"))
    }

    /// The settings `build` checks beyond their ranges' numbers.
    fn check(&self) -> DataflowResult<()> {
        SEGMENT_SECONDS.check_real(self.segment_seconds)?;
        CRF.check_int(self.crf)?;
        FPS.check_real(self.fps)?;
        if !PRESETS.contains(&self.preset.as_str()) {
            return Err(DataflowError::At {
                key: "preset".into(),
                source: Box::new(DataflowError::Config(format!(
                    "video.preset: expected one of {}, found `{}`",
                    PRESETS.join(", "),
                    self.preset
                ))),
            });
        }
        // FFmpeg takes paths as UTF-8 C strings.
        if self.dir.to_str().is_none_or(|d| d.contains('\0')) {
            return Err(DataflowError::Config(format!(
                "video.dir: {} is not a UTF-8 path",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Checks, before running, that results in `schema` name their camera and carry a picture
    /// and detections; the message says what is missing and what would do.
    fn check_schema(&self, schema: &arrow_schema::Schema) -> Result<(), String> {
        use arrow_schema::DataType;
        if schema
            .field_with_name("pts_ms")
            .is_ok_and(|f| f.data_type() != &DataType::Int64)
        {
            return Err("expected `pts_ms` to be Int64 (milliseconds)".into());
        }
        crate::draw::check_drawable(
            schema,
            "video",
            &self.detections,
            ": one video per camera, in frame order",
            "expected the frame's picture in the results: `pixels` with `width` and `height` \
             (RGB; `resize: { ..., keep_input: true }` keeps the video source's), a `bytes` \
             column (JPEG) or `path` (a JPEG file); they have {} (keep them in the last \
             `select`)",
        )
    }
}

impl SinkKind for VideoSinkConfig {
    fn kind(&self) -> &'static str {
        "video"
    }
    /// The folder first: `--output` moves it.
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        let mut paths = vec![&mut self.dir];
        paths.extend(self.dead_letter_path.as_mut());
        paths
    }
    fn outputs(&self) -> Vec<&Path> {
        self.dead_letter_path.as_deref().into_iter().collect()
    }
    fn check_input(&self, schema: &arrow_schema::Schema) -> Result<(), String> {
        self.check_schema(schema)
    }
    /// A camera's frames are on one worker (the source's, or the `exchange` by camera's).
    fn per_worker(&self) -> bool {
        true
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        self.check()?;
        #[cfg(feature = "video")]
        {
            Ok(Box::new(sink::VideoSinkFactory::new(self.clone())))
        }
        #[cfg(not(feature = "video"))]
        {
            Err(DataflowError::Config(format!(
                "video sink (FFmpeg): {}",
                crate::kind::not_built("video", "video")
            )))
        }
    }
}

impl Limits for VideoSinkConfig {
    const RANGES: &'static [Range] = &[SEGMENT_SECONDS, CRF, FPS];
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> VideoSinkConfig {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn defaults_and_checks() {
        let c = config(serde_json::json!({"dir": "out"}));
        assert_eq!(
            (c.segment_seconds, c.fps, c.crf, c.preset.as_str()),
            (60.0, 25.0, 23, "veryfast")
        );
        assert_eq!(
            c.dead_letter_file(),
            PathBuf::from("out/dead-letters.jsonl")
        );
        assert!(c.check().is_ok());
        let slow = config(serde_json::json!({"dir": "out", "preset": "glacial"}));
        let e = slow.check().unwrap_err().to_string();
        assert!(e.contains("veryfast") && e.contains("glacial"), "{e}");
        let crf = config(serde_json::json!({"dir": "out", "crf": 52}));
        assert!(crf.check().is_err());
        let segment = config(serde_json::json!({"dir": "out", "segment_seconds": 0}));
        assert!(segment.check().is_err());
    }

    #[test]
    fn results_need_a_camera_a_picture_and_detections() {
        use arrow_schema::{DataType, Field, Schema};
        let c = config(serde_json::json!({"dir": "out"}));
        let detections = Field::new(
            "detections",
            DataType::List(std::sync::Arc::new(Field::new_list_field(
                DataType::Int32,
                true,
            ))),
            true,
        );
        let mut fields = vec![
            Field::new("camera_id", DataType::Utf8, false),
            Field::new("frame", DataType::Int64, false),
            Field::new("pts_ms", DataType::Int64, false),
            Field::new("width", DataType::UInt32, false),
            Field::new("height", DataType::UInt32, false),
            Field::new("pixels", DataType::Binary, false),
            detections,
        ];
        assert_eq!(c.check_schema(&Schema::new(fields.clone())), Ok(()));
        let without_pixels: Vec<Field> = fields
            .iter()
            .filter(|f| f.name() != "pixels")
            .cloned()
            .collect();
        let e = c.check_schema(&Schema::new(without_pixels)).unwrap_err();
        assert!(e.contains("keep_input: true"), "{e}");
        fields.pop();
        let e = c.check_schema(&Schema::new(fields)).unwrap_err();
        assert!(e.contains("no column `detections`"), "{e}");
    }
}
