//! Video source: cameras given as video files (MP4, MKV, TS; H.264, H.265, …) or live streams
//! (RTSP, HTTP/HLS), decoded to the RGB8 frames the `decode` stage would produce, so pipelines
//! go source → `resize` → model with no decode stage.
//!
//! Each camera decodes on a thread of its own into a bounded queue ([`OnOverload`] says what a
//! full queue does); camera k is read by worker k mod workers, so each camera stays in order
//! end to end. A live camera whose stream breaks reconnects with backoff without disturbing the
//! others; one that never comes up (or does not come back) is given up alone: logged, counted
//! (`riffle_video_camera_failures_total`) and reported as a dead letter. Files resume from a
//! checkpoint (partition = camera index, offset = frame number: decoding restarts at the file's
//! start and skips the frames delivered before); live streams cannot.
//!
//! # Why FFmpeg's libraries (through `ffmpeg-next`) rather than GStreamer
//! - One call opens any container and protocol FFmpeg knows (files, RTSP, HTTP, HLS) and hands
//!   back packets we decode on our thread, with our own queue, drop policy and reconnection:
//!   the control flow stays in Rust, where the dataflow's back-pressure lives. GStreamer would
//!   add a second scheduler (its pipeline threads and bus) to bridge through `appsink`.
//! - Fewer moving parts to install and ship: the libav* shared libraries, found by pkg-config,
//!   versus GStreamer's core plus the right set of plugin packages discovered at run time
//!   (a missing plugin is a run-time surprise, a missing FFmpeg library a build error).
//! - Decoding is the same code as the `ffmpeg` command used to make the test media.
//!
//! GStreamer is still used for what it does best here: serving RTSP test cameras
//! (`scripts/rtsp_server.py`). Hardware decoding (NVDEC) is left for later; FFmpeg offers it
//! through the same API (`hwaccel`).
//!
//! The decoding parts need the crate's `video` feature (FFmpeg's libraries); without it the
//! configuration still parses and validation says how to get the feature.

mod config;
pub use config::{
    Camera, CameraConfig, CameraUri, OnOverload, RtspTransport, ScaleMode, VideoConfig,
};

#[cfg(feature = "video")]
mod camera;
#[cfg(feature = "video")]
mod decoder;
#[cfg(feature = "video")]
mod directory;
#[cfg(feature = "video")]
mod metrics;
#[cfg(feature = "video")]
mod pace;
#[cfg(feature = "video")]
mod queue;
#[cfg(feature = "video")]
mod source;
#[cfg(feature = "video")]
pub use source::VideoSource;

#[cfg(all(test, feature = "video"))]
mod tests;

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use riffle_dataflow::range::Range;
use riffle_dataflow::{DataflowResult, SourceFactory};

/// Column names of the video source (`pixels`, `width`, `height` as the `decode` stage writes
/// them).
pub const CAMERA_ID: &str = "camera_id";
pub const FRAME: &str = "frame";
pub const PTS_MS: &str = "pts_ms";
pub const INGEST_MS: &str = "ingest_ms";
pub const WIDTH: &str = "width";
pub const HEIGHT: &str = "height";
pub const PIXELS: &str = "pixels";

/// Schema of the video source: `camera_id` Utf8, `frame` Int64 (the camera's frame number from
/// 0), `pts_ms` Int64 (presentation time from the stream's start), `ingest_ms` Int64 (wall
/// clock when decoded, ms since the Unix epoch), `width` / `height` UInt32, `pixels` Binary
/// (RGB8, interleaved, row-major). With `scale_to` every frame's pixels are that size, said on
/// the `pixels` field ([`riffle_formats::picture`]), while `width` / `height` keep the camera's.
pub fn schema(scale_to: Option<(u32, u32)>) -> SchemaRef {
    let pixels = Field::new(PIXELS, DataType::Binary, false);
    let pixels = match scale_to {
        Some(size) => riffle_formats::picture::with_pixels_size(pixels, size),
        None => pixels,
    };
    Arc::new(Schema::new(vec![
        Field::new(CAMERA_ID, DataType::Utf8, false),
        Field::new(FRAME, DataType::Int64, false),
        Field::new(PTS_MS, DataType::Int64, false),
        Field::new(INGEST_MS, DataType::Int64, false),
        Field::new(WIDTH, DataType::UInt32, false),
        Field::new(HEIGHT, DataType::UInt32, false),
        pixels,
    ]))
}

impl crate::kind::SourceKind for VideoConfig {
    fn kind(&self) -> &'static str {
        "video"
    }
    fn paths_mut(&mut self) -> Vec<&mut std::path::PathBuf> {
        VideoConfig::paths_mut(self)
    }
    fn inputs(&self) -> Vec<&std::path::Path> {
        self.paths()
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        build(self)
    }
    /// One swscale pass from the decoder's YUV to the first stage's size: no full-size RGB
    /// frame (`scale: off` keeps them).
    fn absorb_scale(&mut self, column: &str, width: u32, height: u32) -> bool {
        let absorbed = self.scale == ScaleMode::Auto && column == PIXELS;
        self.scale_to = absorbed.then_some((width, height));
        absorbed
    }
    fn plan_note(&self) -> Option<String> {
        let (w, h) = self.scale_to?;
        Some(format!(
            "frames go from the decoder's YUV to {w}x{h} RGB in one pass (the first stage's \
             size; `scale: off` gives full-size frames)"
        ))
    }
}

impl crate::kind::Limits for VideoConfig {
    const RANGES: &'static [Range] = &[
        crate::kind::shared::BATCH_SIZE,
        crate::kind::shared::CAMERAS,
        Range::int("every_nth", 1, 1_000_000),
        Range::int("max_frames", 0, i32::MAX as i64),
        Range::int("queue_size", 1, 4096),
        Range::real("sample_fps", 1e-6, 1000.0),
        Range::int("timeout_ms", 1, HOUR_MS),
        Range::int("probe_ms", 1, 60_000),
        Range::int("backoff_ms", 0, HOUR_MS),
        Range::int("max_backoff_ms", 0, HOUR_MS),
        // A camera is tried at least once.
        Range::int("connect_attempts", 1, 1_000_000),
    ];
}

const HOUR_MS: i64 = 3_600_000;

/// Opens the source described by `config`: cameras resolved, files checked, nothing decoded.
pub fn build(config: &VideoConfig) -> DataflowResult<Box<dyn SourceFactory>> {
    #[cfg(feature = "video")]
    {
        Ok(Box::new(VideoSource::new(config)?))
    }
    #[cfg(not(feature = "video"))]
    {
        config.resolve()?;
        Err(riffle_dataflow::DataflowError::Config(format!(
            "video source (FFmpeg): {}",
            crate::kind::not_built("video", "video")
        )))
    }
}
