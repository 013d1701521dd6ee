//! The `parquet` sink: results as Parquet files in a local folder or under an object-store
//! prefix, optionally in hive-style partition folders, exactly once with checkpoints.
//!
//! ```yaml
//! sink:
//!   parquet:
//!     path: out/clicks            # or url: s3://bucket/clicks (with endpoint, region, keys)
//!     partition_by: [position]
//!     roll: { rows: 100000, seconds: 30 }
//!     compression: zstd           # snappy, none
//! ```
//!
//! Rows go into open files (`writer.rs`, one per partition folder; written straight to disk
//! under `_staging/` for a local folder, built in memory for an object store: `file.rs`) that
//! roll only at epoch boundaries. In a run with checkpoints a closed file is staged under
//! `_staging/<generation>/` and published (renamed to `<folder>/part-…parquet`) once a
//! checkpoint covers its last epoch (`commit.rs`); a restart publishes what its checkpoint
//! covers and deletes the rest of older runs' staged files, whose rows it reads again. Without
//! checkpoints a file is published as it closes. See `docs/sinks/parquet.md`.

mod commit;
mod file;
mod layout;
mod partition;
mod writer;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use ::parquet::basic::{Compression as Codec, ZstdLevel};
use ::parquet::file::properties::WriterProperties;
use arrow_schema::Schema;
use riffle_dataflow::range::Range;
use riffle_dataflow::sink::{Committer, Sink, SinkFactory};
use riffle_dataflow::{DataflowError, DataflowResult};
use riffle_storage::{Location, StoreOptions};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::kind::{Limits, SinkContext, SinkKind};

pub use commit::ParquetCommitter;
pub use layout::{NULL_PARTITION, STAGING};
pub use writer::{ParquetSink, Roll, OPEN_FILE_MARK};

const ROLL_ROWS: Range = Range::int("parquet.roll.rows", 1, 1_000_000_000);
const ROLL_SECONDS: Range = Range::real("parquet.roll.seconds", 0.001, 86_400.0);
const TIMEOUT_S: Range = Range::int("parquet.timeout_s", 1, 3600);

/// Default of `roll.rows`.
pub const DEFAULT_ROLL_ROWS: u64 = 1_000_000;
/// Default of `roll.seconds`.
pub const DEFAULT_ROLL_SECONDS: f64 = 60.0;

/// The file that names the output for the run lock (`<path>/._riffle.lock` is taken beside
/// it); it is never written.
const LOCK_NAME: &str = "_riffle";

/// What went wrong writing or publishing files.
#[derive(Debug, thiserror::Error)]
pub enum ParquetSinkError {
    #[error("parquet sink {url}: {what}: {source}")]
    Parquet {
        url: String,
        what: &'static str,
        #[source]
        source: ::parquet::errors::ParquetError,
    },
    #[error("parquet sink: {0}")]
    Store(#[from] riffle_storage::StorageError),
    #[error("parquet sink: {what} {path}: {source}")]
    Io {
        path: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl From<ParquetSinkError> for DataflowError {
    fn from(e: ParquetSinkError) -> Self {
        let context = match &e {
            ParquetSinkError::Parquet { .. } | ParquetSinkError::Io { .. } => "parquet sink",
            ParquetSinkError::Store(_) => "parquet sink storage",
        };
        DataflowError::io(context, std::io::Error::other(e))
    }
}

/// `sink: { parquet: { path | url, partition_by, roll, compression, <store options> } }`.
#[derive(Clone, Deserialize)]
#[serde(try_from = "RawConfig")]
pub struct ParquetSinkConfig {
    /// A local folder (created if missing).
    pub path: Option<PathBuf>,
    /// An object-store prefix, `s3://bucket/prefix` (or `file:///dir`).
    pub url: Option<String>,
    /// Columns whose values name hive-style folders (`k=v/…`), in this order; they are not
    /// repeated inside the files.
    pub partition_by: Vec<String>,
    pub roll: RollConfig,
    pub compression: Compression,
    /// Connection settings for `url` (`endpoint`, `region`, `access_key_id`, …), written
    /// beside it.
    pub store: StoreOptions,
    /// Set by `prepare`: what the run lock is taken beside.
    lock: Option<PathBuf>,
}

/// `roll: { rows, seconds }`: files close at the first epoch boundary after the open files
/// hold `rows` rows together, or after the oldest has been open `seconds`.
#[serde_inline_default]
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RollConfig {
    #[serde_inline_default(DEFAULT_ROLL_ROWS)]
    pub rows: u64,
    #[serde_inline_default(DEFAULT_ROLL_SECONDS)]
    pub seconds: f64,
}

impl Default for RollConfig {
    fn default() -> Self {
        RollConfig {
            rows: DEFAULT_ROLL_ROWS,
            seconds: DEFAULT_ROLL_SECONDS,
        }
    }
}

/// The files' compression codec.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    Zstd,
    Snappy,
    #[serde(rename = "none")]
    Uncompressed,
}

/// The block as written: the store options are beside the sink's own keys, and anything else
/// is refused by name (`deny_unknown_fields` does not work beside `flatten`).
#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    path: Option<PathBuf>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    partition_by: Vec<String>,
    #[serde(default)]
    roll: RollConfig,
    #[serde(default)]
    compression: Compression,
    #[serde(flatten)]
    store: StoreOptions,
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

const KEYS: &str = "`path`, `url`, `partition_by`, `roll`, `compression`, `endpoint`, `region`, \
                    `access_key_id`, `secret_access_key`, `session_token`, `timeout_s`";

impl TryFrom<RawConfig> for ParquetSinkConfig {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Self, String> {
        if let Some(key) = raw.unknown.keys().next() {
            return Err(format!("unknown field `{key}`, expected one of {KEYS}"));
        }
        match (&raw.path, &raw.url) {
            (Some(_), Some(_)) => {
                return Err(
                    "expected `path` (a folder) or `url` (s3://bucket/prefix), not both".into(),
                )
            }
            (None, None) => {
                return Err("missing field `path` (a folder) or `url` (s3://bucket/prefix)".into())
            }
            (Some(_), None) if raw.store != StoreOptions::default() => {
                return Err(
                    "store options (`endpoint`, `region`, keys, `timeout_s`) go with \
                            `url`, not `path`"
                        .into(),
                )
            }
            _ => {}
        }
        for (i, key) in raw.partition_by.iter().enumerate() {
            if key.is_empty() {
                return Err("partition_by: expected column names, found an empty one".into());
            }
            if raw.partition_by.iter().skip(i + 1).any(|k| k == key) {
                return Err(format!("partition_by: `{key}` is named twice"));
            }
        }
        Ok(ParquetSinkConfig {
            path: raw.path,
            url: raw.url,
            partition_by: raw.partition_by,
            roll: raw.roll,
            compression: raw.compression,
            store: raw.store,
            lock: None,
        })
    }
}

impl fmt::Debug for ParquetSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        f.debug_struct("ParquetSinkConfig")
            .field("path", &self.path)
            .field("url", &self.url)
            .field("partition_by", &self.partition_by)
            .field("roll", &self.roll)
            .field("compression", &self.compression)
            .field("endpoint", &self.store.endpoint)
            .field("region", &self.store.region)
            .field("access_key_id", &self.store.access_key_id)
            .field("secret_access_key", &secret(&self.store.secret_access_key))
            .field("session_token", &secret(&self.store.session_token))
            .field("timeout_s", &self.store.timeout_s)
            .finish()
    }
}

impl ParquetSinkConfig {
    /// A local folder's sink with the defaults (for programs building a pipeline in code).
    pub fn at_path(path: impl Into<PathBuf>) -> Self {
        ParquetSinkConfig {
            path: Some(path.into()),
            url: None,
            partition_by: Vec::new(),
            roll: RollConfig::default(),
            compression: Compression::default(),
            store: StoreOptions::default(),
            lock: None,
        }
    }

    /// The folder files go to, when it is a local one (`path`, or a `file://` URL).
    fn local_dir(&self) -> Option<PathBuf> {
        match (&self.url, &self.path) {
            (Some(url), _) => url.strip_prefix("file://").map(PathBuf::from),
            (None, path) => path.clone(),
        }
    }

    /// Where files go, as `Location::parse` takes it.
    fn target(&self) -> String {
        match (&self.url, &self.path) {
            (Some(url), _) => url.clone(),
            (None, Some(path)) => path.to_string_lossy().into_owned(),
            (None, None) => String::new(),
        }
    }

    fn properties(&self) -> WriterProperties {
        let codec = match self.compression {
            Compression::Zstd => Codec::ZSTD(ZstdLevel::default()),
            Compression::Snappy => Codec::SNAPPY,
            Compression::Uncompressed => Codec::UNCOMPRESSED,
        };
        WriterProperties::builder().set_compression(codec).build()
    }

    fn check(&self) -> DataflowResult<Roll> {
        ROLL_ROWS
            .check_int(self.roll.rows)
            .map_err(|e| e.at("roll"))?;
        ROLL_SECONDS
            .check_real(self.roll.seconds)
            .map_err(|e| e.at("roll"))?;
        if let Some(t) = self.store.timeout_s {
            TIMEOUT_S.check_int(t)?;
        }
        Ok(Roll {
            rows: self.roll.rows,
            after: Duration::from_secs_f64(self.roll.seconds),
        })
    }
}

impl SinkKind for ParquetSinkConfig {
    fn kind(&self) -> &'static str {
        "parquet"
    }

    /// The folder (`--output` moves it); none for `url`.
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        self.path.iter_mut().collect()
    }

    /// A name inside the folder, so the run lock (`._riffle.lock`) guards the whole folder
    /// against a second run: its staged files would be fenced by the other.
    fn outputs(&self) -> Vec<&Path> {
        self.lock.iter().map(PathBuf::as_path).collect()
    }

    fn prepare(&mut self, _ctx: &SinkContext<'_>) {
        self.lock = self.path.as_ref().map(|p| p.join(LOCK_NAME));
    }

    /// Any columns Parquet can hold; `partition_by` names primitive columns.
    fn check_input(&self, schema: &Schema) -> Result<(), String> {
        let files = partition::check(schema, &self.partition_by)?;
        ::parquet::arrow::ArrowSchemaConverter::new()
            .convert(&files)
            .map_err(|e| format!("Parquet cannot hold the results' columns: {e}"))?;
        Ok(())
    }

    /// A `url` sink's dead letters go beside it in the same store, as Parquet files under
    /// `<url>.dead-letters/` (a run on a machine without a disk of its own loses none); a
    /// `path` sink's go to `<path>.dead-letters.jsonl` beside the folder, as for file sinks.
    fn dead_letters(&self) -> Option<Self> {
        let url = self.url.as_ref()?;
        let trimmed = url.trim_end_matches('/');
        let (_, rest) = trimmed.split_once("://")?;
        // The bucket itself has no sibling: then the default (a local JSON-lines file).
        if !rest.contains('/') {
            return None;
        }
        Some(ParquetSinkConfig {
            url: Some(format!("{trimmed}.dead-letters")),
            partition_by: Vec::new(),
            lock: None,
            ..self.clone()
        })
    }

    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        let roll = self.check()?;
        // An object store is checked now (its URL and options); a local folder is only
        // created when the run opens the sink.
        let location = match &self.url {
            Some(url) => Some(
                Location::parse(url, &self.store)
                    .map_err(|e| DataflowError::Config(e.to_string()).at("url"))?,
            ),
            None => None,
        };
        Ok(Box::new(ParquetSinkFactory {
            config: self.clone(),
            roll,
            properties: self.properties(),
            location: Mutex::new(location),
        }))
    }
}

impl Limits for ParquetSinkConfig {
    const RANGES: &'static [Range] = &[ROLL_ROWS, ROLL_SECONDS, TIMEOUT_S];
}

/// A configured Parquet sink: the runtime opens one writer (worker 0) and commits through it.
pub struct ParquetSinkFactory {
    config: ParquetSinkConfig,
    roll: Roll,
    properties: WriterProperties,
    location: Mutex<Option<Location>>,
}

impl ParquetSinkFactory {
    fn location(&self) -> DataflowResult<Location> {
        let mut slot = self
            .location
            .lock()
            .map_err(|_| DataflowError::Config("parquet sink: a writer panicked".into()))?;
        if let Some(at) = slot.as_ref() {
            return Ok(at.clone());
        }
        let at = Location::parse(&self.config.target(), &self.config.store)
            .map_err(ParquetSinkError::from)?;
        *slot = Some(at.clone());
        Ok(at)
    }
}

impl SinkFactory for ParquetSinkFactory {
    /// A fresh writer. After a restart (`open_at`, the default) there is nothing to reopen: the
    /// crashed run's unpublished files are fenced and their rows read again.
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(ParquetSink::new(
            self.location()?,
            self.config.local_dir(),
            partition::Partitioner::new(self.config.partition_by.clone()),
            self.properties.clone(),
            self.roll,
        )))
    }

    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        Ok(Some(Box::new(ParquetCommitter::new(
            self.location()?,
            self.config.local_dir(),
        ))))
    }
}
