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
//! Sinks: [`jsonl`] (a JSON-lines file), [`stdout`] (JSON lines on standard output) and
//! [`ipc`] (an Arrow IPC file).
//!
//! [`SourceConfig`] and [`SinkConfig`] are the `source:` and `sink:` blocks of a pipeline file.

// No panic on data or configuration in library code (its unit tests may unwrap); this crate
// reads what comes from outside, so every index or slice left says why it is in bounds.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod annotate;
pub mod csv;
mod files;
pub mod formats;
pub mod images;
pub mod ipc;
pub mod jsonl;
pub mod kafka;
pub mod stdout;
mod text;
pub mod video;

use std::path::{Path, PathBuf};

use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowResult, SourceFactory};
use serde::Deserialize;

pub use crate::annotate::AnnotateSinkConfig;
pub use crate::csv::{CsvSource, CsvSourceConfig};
pub use crate::images::{ImagesConfig, ImagesSource, PartitionBy};
pub use crate::ipc::{IpcFileSink, IpcSinkConfig, IpcSource, IpcSourceConfig};
pub use crate::jsonl::{JsonLinesSink, JsonlSinkConfig, JsonlSource, JsonlSourceConfig};
pub use crate::stdout::StdoutSinkConfig;
pub use crate::text::DEFAULT_MAX_LINE_BYTES;
pub use crate::video::VideoConfig;

/// Where a pipeline's records come from (externally tagged: `source: { images: {...} }`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceConfig {
    Images(ImagesConfig),
    Ipc(IpcSourceConfig),
    Csv(CsvSourceConfig),
    Jsonl(JsonlSourceConfig),
    Kafka(kafka::KafkaSourceConfig),
    Video(VideoConfig),
}

impl SourceConfig {
    /// Opens the source: lists or inspects its input and fixes its schema, so a missing or
    /// unusable input is reported before the dataflow starts.
    pub fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Ok(match self {
            SourceConfig::Images(c) => Box::new(ImagesSource::new(c)?),
            SourceConfig::Ipc(c) => Box::new(IpcSource::new(c)?),
            SourceConfig::Csv(c) => Box::new(CsvSource::new(c)?),
            SourceConfig::Jsonl(c) => Box::new(JsonlSource::new(c)?),
            SourceConfig::Kafka(c) => Box::new(kafka::KafkaSourceFactory::new(c)?),
            SourceConfig::Video(c) => video::build(c)?,
        })
    }

    /// Files or directories the source reads.
    pub fn paths(&self) -> Vec<&Path> {
        match self {
            SourceConfig::Images(c) => vec![c.path.as_path()],
            SourceConfig::Ipc(c) => vec![c.path.as_path()],
            SourceConfig::Csv(c) => vec![c.path.as_path()],
            SourceConfig::Jsonl(c) => vec![c.path.as_path()],
            SourceConfig::Kafka(_) => Vec::new(),
            SourceConfig::Video(c) => c.paths(),
        }
    }

    /// The same paths, for the caller to resolve relative ones.
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        match self {
            SourceConfig::Images(c) => vec![&mut c.path],
            SourceConfig::Ipc(c) => vec![&mut c.path],
            SourceConfig::Csv(c) => vec![&mut c.path],
            SourceConfig::Jsonl(c) => vec![&mut c.path],
            SourceConfig::Kafka(_) => Vec::new(),
            SourceConfig::Video(c) => c.paths_mut(),
        }
    }
}

/// Where a pipeline's results (or dead letters) go (`sink: { jsonl: { path: ... } }`,
/// `sink: { stdout: {} }`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkConfig {
    Jsonl(JsonlSinkConfig),
    Stdout(StdoutSinkConfig),
    Ipc(IpcSinkConfig),
    Kafka(Box<kafka::KafkaSinkConfig>),
    Annotate(AnnotateSinkConfig),
}

impl SinkConfig {
    pub fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(match self {
            SinkConfig::Jsonl(c) => Box::new(c.clone()),
            SinkConfig::Stdout(c) => Box::new(c.clone()),
            SinkConfig::Ipc(c) => Box::new(c.clone()),
            SinkConfig::Kafka(c) => Box::new(kafka::KafkaSinkFactory::new(c)?),
            SinkConfig::Annotate(c) => Box::new(c.clone()),
        })
    }

    /// Files the sink writes.
    pub fn paths(&self) -> Vec<&Path> {
        match self {
            SinkConfig::Jsonl(c) => vec![c.path.as_path()],
            SinkConfig::Stdout(_) => Vec::new(),
            SinkConfig::Ipc(c) => vec![c.path.as_path()],
            // A folder of pictures, one file a frame: no single file to lock or check.
            SinkConfig::Kafka(_) | SinkConfig::Annotate(_) => Vec::new(),
        }
    }

    /// The same paths, for the caller to resolve relative ones.
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        match self {
            SinkConfig::Jsonl(c) => vec![&mut c.path],
            SinkConfig::Stdout(_) => Vec::new(),
            SinkConfig::Ipc(c) => vec![&mut c.path],
            SinkConfig::Kafka(_) => Vec::new(),
            SinkConfig::Annotate(c) => vec![&mut c.dir],
        }
    }
}

/// Checks a worker's place among its peers before a partition is built.
pub(crate) fn check_partition(index: usize, peers: usize) -> DataflowResult<()> {
    if peers == 0 || index >= peers {
        return Err(riffle_dataflow::DataflowError::Config(format!(
            "source partition {index} of {peers} peers does not exist"
        )));
    }
    Ok(())
}
