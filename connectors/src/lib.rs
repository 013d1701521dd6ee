//! Riffle's connectors: where records come from and where results go.
//!
//! Sources (each splits itself deterministically across any number of workers):
//! - [`images`]: a directory of image files, one row per file with its raw bytes.
//! - [`ipc`]: an Arrow IPC file, whole batches per worker.
//! - [`csv`] and [`jsonl`]: text files, chunks of lines per worker; malformed lines become
//!   dead letters instead of failing the run.
//! - [`kafka`]: a topic's partitions, messages decoded as JSON, CSV, raw bytes or JPEG.
//! - [`video`]: video files and live streams (RTSP, HTTP), one camera each, decoded to RGB8
//!   frames by FFmpeg's libraries (the `video` feature).
//!
//! Decoding of payloads (JSON, CSV, raw bytes, JPEG) into Arrow batches, schema inference and
//! per-record rejection live in one place, [`formats`], shared by the file and Kafka sources.
//! Kafka clients are configured in one place too: [`kafka::client`].
//!
//! Sinks: [`jsonl`] (a JSON-lines file), [`stdout`] (JSON lines on standard output),
//! [`ipc`] (an Arrow IPC file) and [`video_sink`] (each camera's frames with their detections
//! drawn, as H.264 MP4 files; the `video` feature).
//!
//! [`SourceConfig`] and [`SinkConfig`] are the `source:` and `sink:` blocks of a pipeline file.
//! Each kind describes itself ([`SourceKind`], [`SinkKind`], [`Limits`]): a new kind is its
//! own module plus one line in [`registry`].

// No panic on data or configuration in library code (its unit tests may unwrap); this crate
// reads what comes from outside, so every index or slice left says why it is in bounds.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod annotate;
#[cfg(feature = "schemas")]
pub mod avro;
pub mod csv;
mod draw;
mod files;
/// Payload formats (their own crate, `riffle-formats`; the path kept for the connectors).
pub use riffle_formats as formats;
pub mod http;
pub mod images;
pub mod ipc;
pub mod jsonl;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod kind;
pub mod lines;
mod pace;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod registry;
#[cfg(feature = "schemas")]
pub use riffle_formats::schema_registry;
mod staged_file;
pub mod stdout;
mod text;
pub mod video;
pub mod video_sink;
use riffle_formats::web;

use riffle_dataflow::DataflowResult;

pub use crate::annotate::AnnotateSinkConfig;
pub use crate::csv::{CsvSource, CsvSourceConfig};
pub use crate::images::{ImagesConfig, ImagesSource, PartitionBy};
pub use crate::ipc::{IpcFileSink, IpcSinkConfig, IpcSource, IpcSourceConfig};
pub use crate::jsonl::{JsonlSinkConfig, JsonlSource, JsonlSourceConfig};
pub use crate::kind::{Limits, SinkContext, SinkKind, SinkRole, SourceKind};
pub use crate::lines::JsonLinesSink;
pub use crate::registry::{sink_ranges, source_ranges, SinkConfig, SourceConfig};
pub use crate::stdout::StdoutSinkConfig;
pub use crate::text::DEFAULT_MAX_LINE_BYTES;
pub use crate::video::VideoConfig;

/// Checks a worker's place among its peers before a partition is built.
pub(crate) fn check_partition(index: usize, peers: usize) -> DataflowResult<()> {
    if peers == 0 || index >= peers {
        return Err(riffle_dataflow::DataflowError::Config(format!(
            "source partition {index} of {peers} peers does not exist"
        )));
    }
    Ok(())
}
