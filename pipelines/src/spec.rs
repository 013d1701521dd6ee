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
    #[serde(default)]
    pub runtime: Option<Spanned<RuntimeConfig>>,
}

/// Registers the stage kinds: each line is a YAML key's variant and its configuration type,
/// which implements [`StageKind`] (everything validation, planning and running need).
macro_rules! stage_kinds {
    ($($(#[$doc:meta])* $variant:ident($config:ty)),* $(,)?) => {
        /// One stage; the YAML key names the kind.
        #[derive(Clone, Debug, Deserialize)]
        #[serde(rename_all = "snake_case", deny_unknown_fields)]
        pub enum StageSpec {
            $($(#[$doc])* $variant($config),)*
            /// Re-shards rows across workers by a key column (e.g. `camera_id`), or places the
            /// next stages: a move between workers, not a stage.
            Exchange(ExchangeConfig),
        }

        impl StageSpec {
            /// The stage kind, or `None` for an exchange.
            pub fn stage(&self) -> Option<&dyn StageKind> {
                match self {
                    $(StageSpec::$variant(c) => Some(c),)*
                    StageSpec::Exchange(_) => None,
                }
            }

            pub fn stage_mut(&mut self) -> Option<&mut dyn StageKind> {
                match self {
                    $(StageSpec::$variant(c) => Some(c),)*
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

/// `runtime.checkpoint:` — where checkpoints go.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// A local directory, or any shared path (NFS/EFS) for many hosts.
    pub dir: std::path::PathBuf,
    /// Checkpoints kept (older ones are deleted); at least 2.
    #[serde_inline_default(3)]
    pub keep: usize,
    /// At most one checkpoint per this many milliseconds (0: at every completed epoch). Large
    /// operator state (recommendation features) makes each write cost more; a restart replays
    /// the epochs since the last one.
    #[serde(default)]
    pub interval_ms: u64,
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
