//! The pipeline file, as Rust types. Field names and defaults here are the reference
//! (docs/pipeline-spec.md describes the same).

use riffle_connectors::{SinkConfig, SourceConfig};
use riffle_operators::inference::model::ModelConfig;
use riffle_operators::tabular::cast::CastConfig;
use riffle_operators::tabular::filter::FilterConfig;
use riffle_operators::tabular::rank::RankConfig;
use riffle_operators::tabular::recs::CandidatesConfig;
use riffle_operators::tabular::select::SelectConfig;
use riffle_operators::tabular::topk::TopKConfig;
use riffle_operators::vision::analytics::{LineCountConfig, ZoneConfig};
use riffle_operators::vision::crop::CropConfig;
use riffle_operators::vision::decode::DecodeConfig;
use riffle_operators::vision::detections::DetectionsConfig;
use riffle_operators::vision::resize::ResizeConfig;
use riffle_operators::vision::track::TrackConfig;
use riffle_operators::StageKind;
use serde::Deserialize;
use serde_inline_default::serde_inline_default;
use serde_saphyr::Spanned;

/// A whole pipeline file: `source → stages → sink`, plus how to run it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Shown in logs and metrics.
    #[serde(default)]
    pub name: Option<String>,
    pub source: Spanned<SourceConfig>,
    /// Applied in order to every record.
    #[serde(default)]
    pub stages: Vec<Spanned<StageSpec>>,
    pub sink: Spanned<SinkConfig>,
    /// Where rejected records go (default: `dead-letters.jsonl` beside the sink's file).
    #[serde(default)]
    pub dead_letter: Option<Spanned<SinkConfig>>,
    /// Results as they exist, before their epoch commits, e.g. a Kafka topic a dashboard
    /// reads: uncommitted (after a crash, replayed epochs' results appear again).
    #[serde(default)]
    pub live_sink: Option<Spanned<SinkConfig>>,
    /// Events (line crossings, zone entries and exits) as rows of their own, to a sink of
    /// their own.
    #[serde(default)]
    pub events: Option<Spanned<EventsConfig>>,
    #[serde(default)]
    pub runtime: Option<Spanned<RuntimeConfig>>,
}

/// `events: { from: [line_events, zone_events], keep: [camera_id, frame, pts_ms], sink: {…} }`:
/// one row per entry of the `from` list columns of the results, with the `keep` columns of its
/// result row, written to `sink` as each epoch's results are written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsConfig {
    /// List-of-struct columns of the results holding events.
    pub from: Vec<String>,
    /// Columns of the result row copied into each of its events; default: those of
    /// `camera_id`, `frame`, `pts_ms` and `ingest_ms` the results have.
    #[serde(default)]
    pub keep: Option<Vec<String>>,
    pub sink: SinkConfig,
}

/// Registers the stage kinds: each line is a YAML key's variant and its configuration type,
/// which implements [`StageKind`] (everything validation, planning and running need).
macro_rules! stage_kinds {
    ($($(#[$doc:meta])* $variant:ident($config:ty) $(if $cfg:meta)?),* $(,)?) => {
        /// One stage; the YAML key names the kind.
        #[derive(Clone, Debug, Deserialize)]
        #[serde(rename_all = "snake_case", deny_unknown_fields)]
        pub enum StageSpec {
            $($(#[$doc])* $(#[cfg($cfg)])? $variant($config),)*
            /// Re-shards rows across workers by a key column (e.g. `camera_id`), or places the
            /// next stages: a move between workers, not a stage.
            Exchange(ExchangeConfig),
        }

        impl StageSpec {
            /// The stage kind, or `None` for an exchange.
            pub fn stage(&self) -> Option<&dyn StageKind> {
                match self {
                    $($(#[cfg($cfg)])? StageSpec::$variant(c) => Some(c),)*
                    StageSpec::Exchange(_) => None,
                }
            }

            pub fn stage_mut(&mut self) -> Option<&mut dyn StageKind> {
                match self {
                    $($(#[cfg($cfg)])? StageSpec::$variant(c) => Some(c),)*
                    StageSpec::Exchange(_) => None,
                }
            }
        }
    };
}

stage_kinds! {
    Decode(DecodeConfig),
    Resize(ResizeConfig),
    Model(ModelConfig),
    Topk(TopKConfig),
    Detections(DetectionsConfig),
    Filter(FilterConfig),
    Select(SelectConfig),
    /// Recommendation candidates for each click from incrementally maintained features.
    Candidates(CandidatesConfig),
    /// Per-request top-k of scored candidates.
    Rank(RankConfig),
    /// Multi-object tracking per camera: a track id on each detection.
    Track(TrackConfig),
    /// Tracks crossing counting lines, per camera, with running totals.
    LineCount(LineCountConfig),
    /// Tracks entering and leaving zones, per camera: dwell times and occupancy.
    Zone(ZoneConfig),
    /// One row per detected object with its pixel crop, for a second model.
    Crop(CropConfig),
    /// One `[k]` tensor column per row from k numeric columns or a list column.
    Tensor(riffle_operators::tabular::tensor_stage::TensorConfig),
    /// Columns cast to other element types (tensors element-wise, keeping their shape).
    Cast(CastConfig),
    /// The rows written to a sink of the worker's own as they pass (a camera's annotated
    /// video), and passed on unchanged.
    Tap(crate::tap::TapConfig),
    /// A function of a Python file called with each batch (`pyarrow.RecordBatch`).
    Python(riffle_udf::PythonConfig) if feature = "python",
    Python(crate::unbuilt::UnbuiltPython) if not(feature = "python"),
}

impl StageSpec {
    /// The YAML key.
    pub fn kind(&self) -> &'static str {
        self.stage().map_or("exchange", |s| s.kind())
    }
}

pub use crate::exchange::{ExchangeConfig, Workers};

/// `runtime:` — how the pipeline runs. Command-line flags override these.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Worker threads per process.
    pub workers: usize,
    /// ONNX Runtime threads inside each model run (per worker).
    pub intra_op_threads: usize,
    /// Records each source worker puts in one epoch (the unit of progress tracking).
    pub epoch_records: usize,
    /// An epoch also closes once it has been open this long with records in it: results of a
    /// slow source complete after at most this wait, whatever `epoch_records` is.
    pub epoch_ms: Option<u64>,
    /// Epochs a source may run ahead of the sink before it waits (bounds memory).
    pub max_epochs_in_flight: u64,
    /// Adds a column of this name to every result: its end-to-end latency in milliseconds,
    /// from the source reading it to the sink writing it.
    pub latency_column: Option<String>,
    /// Checkpoint source positions as epochs complete, and resume from the newest on start.
    pub checkpoint: Option<CheckpointConfig>,
    /// Named groups of workers for `exchange: { workers: NAME }` (e.g. `gpu: [1]`).
    pub placement: std::collections::BTreeMap<String, Vec<usize>>,
    /// Worker → GPU map for stages with `device: auto`: worker `i` uses GPU
    /// `gpus[i mod len]` (default: GPU `i mod` the number of GPUs).
    pub gpus: Vec<usize>,
    /// Testing and demos: makes one worker's model stages slower by a fixed delay per batch.
    pub slow_worker: Option<SlowWorker>,
    /// A peer worker silent this long (its process died or its host dropped off the network)
    /// fails the run, so that supervisors restart the cluster from its last checkpoint.
    pub peer_timeout_ms: u64,
    /// `riffle run` fails (exit 3) when more than this share of the records read went to dead
    /// letters (0 to 1; default: only when every record did).
    pub max_dead_letter_ratio: Option<f64>,
}

/// `runtime.slow_worker: { worker, delay_ms }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlowWorker {
    pub worker: usize,
    pub delay_ms: u64,
}

/// `runtime.checkpoint:` — where checkpoints go: a directory (`dir`) or an object store's
/// prefix (`url: s3://bucket/prefix`, with the connection keys beside it), exactly one.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// A local directory, or any shared path (NFS/EFS) for many hosts.
    #[serde(default)]
    pub dir: Option<std::path::PathBuf>,
    /// An S3-compatible object store's prefix, `s3://bucket/prefix`.
    #[serde(default)]
    pub url: Option<String>,
    /// The object store's address (`http://127.0.0.1:9000`; default: AWS, or
    /// `AWS_ENDPOINT_URL`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Default: `AWS_REGION`, else `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
    /// Default: `AWS_ACCESS_KEY_ID` (and the other usual AWS sources).
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// Default: `AWS_SECRET_ACCESS_KEY`. Write it as `${VAR}` to keep it out of the file.
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// Default: `AWS_SESSION_TOKEN`.
    #[serde(default)]
    pub session_token: Option<String>,
    /// One request to the object store (its retries included) gives up after this long.
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Checkpoints kept (older ones are deleted); at least 2.
    #[serde_inline_default(3)]
    pub keep: usize,
    /// At most one checkpoint per this many milliseconds (0: at every completed epoch). Large
    /// operator state (recommendation features) makes each write cost more; a restart replays
    /// the epochs since the last one.
    #[serde(default)]
    pub interval_ms: u64,
    /// An object store that keeps failing for this long fails the run; until then its
    /// checkpoints are only delayed. A directory's failure fails the run at once.
    #[serde_inline_default(300)]
    pub give_up_s: u64,
    /// An object store's lease on the prefix (one cluster per prefix): renewed every third of
    /// this; a lease not renewed for this long is taken over by the next run.
    #[serde_inline_default(30)]
    pub lease_s: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            dir: None,
            url: None,
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            timeout_s: None,
            keep: 3,
            interval_ms: 0,
            give_up_s: 300,
            lease_s: 30,
        }
    }
}

/// What `runtime.checkpoint` needs of `dir` and `url`.
const ONE_OF: &str = "expected exactly one of `dir` (a directory) and `url` (s3://bucket/prefix)";

impl CheckpointConfig {
    /// The object store's connection settings.
    pub fn store_options(&self) -> riffle_storage::StoreOptions {
        riffle_storage::StoreOptions {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            session_token: self.session_token.clone(),
            timeout_s: self.timeout_s,
        }
    }

    /// `runtime.checkpoint`'s own rules: exactly one of `dir` and `url`, an `s3://` URL, and the
    /// store's keys only beside a URL. The key at fault and the message.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let url = match (&self.dir, &self.url) {
            (Some(_), Some(_)) => return Err(("url", format!("{ONE_OF}, found both"))),
            (None, None) => return Err(("checkpoint", ONE_OF.to_string())),
            (Some(_), None) => None,
            (None, Some(url)) => Some(url),
        };
        let Some(url) = url else {
            let store_keys = [
                ("endpoint", self.endpoint.is_some()),
                ("region", self.region.is_some()),
                ("access_key_id", self.access_key_id.is_some()),
                ("secret_access_key", self.secret_access_key.is_some()),
                ("session_token", self.session_token.is_some()),
                ("timeout_s", self.timeout_s.is_some()),
            ];
            if let Some((key, _)) = store_keys.iter().find(|(_, set)| *set) {
                return Err((
                    key,
                    format!("`{key}` is an object store's setting: it goes with `url`, not `dir`"),
                ));
            }
            return Ok(());
        };
        let bucket = url.strip_prefix("s3://").map(|rest| rest.split('/').next());
        match bucket {
            Some(Some(bucket)) if !bucket.is_empty() => Ok(()),
            _ => Err((
                "url",
                format!(
                    "`{url}`: expected s3://bucket/prefix (an S3-compatible object store; a local \
                     directory goes in `dir`)"
                ),
            )),
        }
    }

    /// Where the checkpoints go, for messages: the directory or the URL.
    pub fn describe(&self) -> String {
        match (&self.dir, &self.url) {
            (Some(dir), _) => dir.display().to_string(),
            (None, Some(url)) => url.clone(),
            (None, None) => String::new(),
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: 1,
            intra_op_threads: 1,
            epoch_records: 32,
            epoch_ms: None,
            max_epochs_in_flight: 4,
            latency_column: None,
            checkpoint: None,
            placement: Default::default(),
            gpus: Vec::new(),
            slow_worker: None,
            peer_timeout_ms: 30_000,
            max_dead_letter_ratio: None,
        }
    }
}
