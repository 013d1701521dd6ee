use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use riffle_dataflow::range::Range;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowError, DataflowResult, SourceFactory};

use crate::formats::value::{AvroValueConfig, ProtobufValueConfig, SchemaFormat, SchemaSettings};
use crate::formats::{ColumnType, DeclaredSchema, MessageFormat};
pub use crate::kind::SourceGroup;
use crate::kind::{shared, Limits, OffsetsWithOutput, SinkContext, SinkKind, SinkRole, SourceKind};
use crate::schema_registry::RegistryConfig;

/// Default of `max_message_bytes`: 16 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Default of `transaction_timeout_ms`: 30 s. librdkafka's own 60 s meant that a cluster killed
/// with a transaction open held back every `read_committed` reader of the results topic for
/// about 70 s (the timeout, then up to the broker's 10 s
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms`). Kafka Streams' 10 s was too
/// short here: a broker restart (`tests/kafka.rs`'s crash test) outlasted it, and the run
/// recovering from the aborted commit wrote one epoch's results twice in 3 tries of 4.
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 30_000;

/// `source: { kafka: {...} }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// `host:port[,host:port…]` (librdkafka `bootstrap.servers`).
    pub brokers: String,
    pub topic: String,
    /// How a message's value becomes columns.
    pub format: MessageFormat,
    /// Column that receives the message key as a string (none: the key is not kept).
    #[serde(default)]
    pub key: Option<String>,
    /// Where reading starts in every partition.
    #[serde(default)]
    pub start: StartAt,
    /// End the run once every partition reaches the end offset seen at start.
    #[serde(default)]
    pub stop_at_end: bool,
    /// Most messages per batch.
    #[serde_inline_default(256)]
    pub batch_size: usize,
    /// Largest message value taken into a batch; a larger one becomes a dead letter naming its
    /// topic, partition, offset and size (librdkafka is set to fetch it, so it never stalls
    /// its partition).
    #[serde_inline_default(DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Longest wait to fill a batch before emitting what arrived.
    #[serde_inline_default(20)]
    pub linger_ms: u64,
    /// Replay pace: at most this many messages per second per worker (unset: as fast as
    /// they come). For replaying a recorded topic at its real rate, demos and tests.
    #[serde(default)]
    pub max_records_per_second: Option<f64>,
    /// Value columns for `json`/`csv` (name → type, `int64?` for a column a message may leave
    /// out or null; the others are required; `float32[4]`, a list of exactly 4, for `json`),
    /// in the order written; inferred from the topic's first messages when absent.
    #[serde(default)]
    pub schema: Option<DeclaredSchema>,
    /// Message headers copied into typed columns (header name → type).
    #[serde(default)]
    pub header_columns: BTreeMap<String, ColumnType>,
    /// Consumer-group mode: join this group and read the partitions Kafka assigns, which move
    /// as other members (clusters) join and leave. Offsets are committed with the Kafka sink's
    /// transactions (needs `runtime.checkpoint` and a `kafka` sink with transactions). Unset:
    /// partitions are assigned to workers statically.
    #[serde(default)]
    pub group_id: Option<String>,
    /// `format: avro`: the reader schema (`schema: x.avsc`) and framing.
    #[serde(default)]
    pub avro: Option<AvroValueConfig>,
    /// `format: protobuf`: the message (`proto: x.proto`, `message: pkg.Click`) and framing.
    #[serde(default)]
    pub protobuf: Option<ProtobufValueConfig>,
    /// A schema registry (Confluent REST API) with the topic's writer schemas.
    #[serde(default)]
    pub schema_registry: Option<RegistryConfig>,
    /// Any librdkafka consumer option, passed through.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// Where a source starts reading.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StartAt {
    #[default]
    Earliest,
    Latest,
    /// The first message at or after this time (ms since the Unix epoch).
    TimestampMs(i64),
    /// Given offsets per partition (partitions not listed start at the earliest).
    Offsets(BTreeMap<i32, i64>),
}

/// `sink: { kafka: {...} }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    pub brokers: String,
    pub topic: String,
    /// Message value: one JSON object per row, or one Arrow IPC stream per batch.
    #[serde(default)]
    pub format: SinkFormat,
    /// Column whose value (as a string) is the message key.
    #[serde(default)]
    pub key: Option<String>,
    /// Message headers from columns (header name → column).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Create the topic when the run starts if it does not exist (with `partitions`).
    #[serde_inline_default(true)]
    pub create_topic: bool,
    /// Partitions of a topic the sink creates.
    #[serde_inline_default(4)]
    pub partitions: i32,
    /// Replicas of a topic the sink creates (-1: the broker's `default.replication.factor`).
    #[serde_inline_default(-1)]
    pub replication_factor: i32,
    /// Topic configs of a topic the sink creates (e.g. `retention.ms`, `min.insync.replicas`).
    #[serde(default)]
    pub topic_config: BTreeMap<String, String>,
    /// How a run with checkpoints makes its output exactly-once (see [`ExactlyOnce`]).
    #[serde(default)]
    pub exactly_once: ExactlyOnce,
    /// The producer's `transactional.id` in `transactions` mode; it must stay the same across
    /// restarts of one pipeline and differ between pipelines (default:
    /// `riffle-<pipeline>-<topic>`).
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// `transactions` mode: librdkafka's `transaction.timeout.ms`. The broker aborts a
    /// transaction open longer than this: a commit that took longer fails (the run restarts
    /// from its last checkpoint), and a cluster killed mid-transaction that does not come back
    /// holds back every `read_committed` reader of the topic for about this long. At least
    /// twice `runtime.checkpoint.interval_ms`.
    #[serde_inline_default(DEFAULT_TRANSACTION_TIMEOUT_MS)]
    pub transaction_timeout_ms: u64,
    /// Set by the planner when the source reads as consumer group: its offsets are committed
    /// in this sink's transactions.
    #[serde(skip)]
    pub source_group: Option<SourceGroup>,
    /// How long `flush` waits for every delivery report before failing.
    #[serde_inline_default(30_000)]
    pub delivery_timeout_ms: u64,
    /// `format: avro`: the written schema (`schema: x.avsc`; unset: derived from the results'
    /// columns) and framing.
    #[serde(default)]
    pub avro: Option<AvroValueConfig>,
    /// `format: protobuf`: the message written (`proto: x.proto`, `message: pkg.Rec`).
    #[serde(default)]
    pub protobuf: Option<ProtobufValueConfig>,
    /// A schema registry (Confluent REST API) the written schema is registered with.
    #[serde(default)]
    pub schema_registry: Option<RegistryConfig>,
    /// Any librdkafka producer option, passed through.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// How a Kafka sink with checkpoints writes each result once.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExactlyOnce {
    /// `transactions` where the broker supports them, else `markers`.
    #[default]
    Auto,
    /// Kafka transactions committed with each checkpoint: any `read_committed` consumer sees
    /// every result once.
    Transactions,
    /// Commit and fence marker messages in the results topic, for brokers without
    /// transactions: only a reader that applies them (`riffle consume`) sees every result once.
    Markers,
    /// At-least-once: results are written as they come, and a restart may repeat some.
    Off,
}

/// Kafka sink value formats.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SinkFormat {
    #[default]
    Json,
    Ipc,
    /// One Avro record per row (`avro:`, `schema_registry:`).
    Avro,
    /// One Protobuf message per row (`protobuf:`, `schema_registry:`).
    Protobuf,
}

impl SinkFormat {
    /// The schema'd format, for `avro` and `protobuf`.
    pub fn schemaful(self) -> Option<SchemaFormat> {
        match self {
            SinkFormat::Avro => Some(SchemaFormat::Avro),
            SinkFormat::Protobuf => Some(SchemaFormat::Protobuf),
            SinkFormat::Json | SinkFormat::Ipc => None,
        }
    }
}

impl KafkaSourceConfig {
    /// The avro/protobuf settings.
    pub fn schema_settings(&self) -> SchemaSettings<'_> {
        SchemaSettings {
            topic: &self.topic,
            avro: self.avro.as_ref(),
            protobuf: self.protobuf.as_ref(),
            registry: self.schema_registry.as_ref(),
            framing: None,
        }
    }
}

impl KafkaSinkConfig {
    /// The avro/protobuf settings.
    pub fn schema_settings(&self) -> SchemaSettings<'_> {
        SchemaSettings {
            topic: &self.topic,
            avro: self.avro.as_ref(),
            protobuf: self.protobuf.as_ref(),
            registry: self.schema_registry.as_ref(),
            framing: None,
        }
    }

    /// An error in this sink's configuration or set-up, naming its topic and brokers.
    pub(crate) fn config_error(&self, message: impl std::fmt::Display) -> DataflowError {
        DataflowError::Config(format!(
            "kafka sink (topic `{}` on {}): {message}",
            self.topic, self.brokers
        ))
    }

    /// An error while writing, naming the topic and brokers.
    pub(crate) fn sink_error(&self, message: impl std::fmt::Display) -> DataflowError {
        DataflowError::stage(
            "sink",
            format!(
                "kafka topic `{}` on {}: {message}",
                self.topic, self.brokers
            ),
        )
    }
}

impl SourceKind for KafkaSourceConfig {
    fn kind(&self) -> &'static str {
        "kafka"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        let mut paths = SchemaSettings::paths_mut(self.avro.as_mut(), self.protobuf.as_mut());
        paths.extend(
            self.schema_registry
                .as_mut()
                .and_then(|r| r.ca_file.as_mut()),
        );
        paths
    }
    fn inputs(&self) -> Vec<&Path> {
        let mut inputs: Vec<&Path> = Vec::new();
        if let Some(a) = &self.avro {
            inputs.extend(a.schema.as_deref());
        }
        if let Some(p) = &self.protobuf {
            inputs.extend(p.proto.as_deref());
            inputs.extend(p.descriptor_set.as_deref());
        }
        inputs
    }
    fn offsets_with_output(&self) -> Option<OffsetsWithOutput> {
        Some(OffsetsWithOutput {
            key: "group_id",
            group: SourceGroup {
                topic: self.topic.clone(),
                group_id: self.group_id.clone()?,
            },
            expected: "a consumer group's offsets are committed with the output: expected \
                       `runtime.checkpoint` and a `kafka` sink with `exactly_once: transactions` \
                       (or `auto`)",
        })
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Ok(Box::new(super::KafkaSourceFactory::new(self)?))
    }
}

impl Limits for KafkaSourceConfig {
    const RANGES: &'static [Range] = &[
        shared::BATCH_SIZE,
        shared::MAX_RECORDS_PER_SECOND,
        Range::int("max_message_bytes", 1, 1 << 30),
        Range::int("linger_ms", 0, 60_000),
    ];
}

impl SinkKind for KafkaSinkConfig {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        let mut paths = SchemaSettings::paths_mut(self.avro.as_mut(), self.protobuf.as_mut());
        paths.extend(
            self.schema_registry
                .as_mut()
                .and_then(|r| r.ca_file.as_mut()),
        );
        paths
    }

    // Its paths are inputs (schemas, a CA file): `--output` has nothing to replace.
    fn output_mut(&mut self) -> Option<&mut PathBuf> {
        None
    }

    /// Avro and Protobuf: the results must fit the written schema (checked by building the
    /// encoder, without registering anything).
    fn check_input(&self, schema: &arrow_schema::Schema) -> Result<(), String> {
        let Some(format) = self.format.schemaful() else {
            return Ok(());
        };
        let plain = SchemaSettings {
            registry: None,
            framing: Some(crate::formats::value::WireFraming::Plain),
            ..self.schema_settings()
        };
        plain.encoder(format, schema).map(|_| ())
    }

    fn prepare(&mut self, ctx: &SinkContext<'_>) {
        match ctx.role {
            // One transactional.id per pipeline and topic, the same on every restart.
            SinkRole::Results => {
                if self.transactional_id.is_none() {
                    self.transactional_id = Some(format!("riffle-{}-{}", ctx.pipeline, self.topic));
                }
            }
            // Written as results arrive: no transactions or markers, whatever the file says.
            SinkRole::Live | SinkRole::Events => self.exactly_once = ExactlyOnce::Off,
            SinkRole::DeadLetters => {}
        }
    }

    /// `transaction_timeout_ms` against the checkpoint interval: a transaction stays open from
    /// one checkpoint to the next (plus the checkpoint's write), so a timeout within two
    /// intervals would abort transactions of a healthy run.
    fn check_runtime(
        &self,
        checkpoint_interval_ms: Option<u64>,
    ) -> Result<(), (&'static str, String)> {
        if self.options.contains_key(TRANSACTION_TIMEOUT_OPTION) {
            return Err((
                "options",
                format!(
                    "`{TRANSACTION_TIMEOUT_OPTION}` is set by the sink's `transaction_timeout_ms` \
                     (checked against runtime.checkpoint.interval_ms): expected it there, not \
                     in `options`"
                ),
            ));
        }
        let transactions = matches!(
            self.exactly_once,
            ExactlyOnce::Auto | ExactlyOnce::Transactions
        );
        let Some(interval) = checkpoint_interval_ms.filter(|_| transactions) else {
            return Ok(());
        };
        let least = interval.saturating_mul(2);
        if self.transaction_timeout_ms < least {
            return Err((
                "transaction_timeout_ms",
                format!(
                    "{} ms would abort the transactions of a healthy run: each stays open from \
                     one checkpoint to the next, and runtime.checkpoint.interval_ms is {interval}; \
                     expected at least {least} (twice the interval), or a shorter interval",
                    self.transaction_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    fn commit_source_offsets(&mut self, group: &SourceGroup) -> bool {
        if !matches!(
            self.exactly_once,
            ExactlyOnce::Auto | ExactlyOnce::Transactions
        ) {
            return false;
        }
        self.source_group = Some(group.clone());
        true
    }

    /// `<topic>-dead-letters`, JSON, with the reason and stage in headers.
    fn dead_letters(&self) -> Option<Self> {
        let mut dlq = self.clone();
        dlq.topic = format!("{}-dead-letters", self.topic);
        dlq.format = SinkFormat::Json;
        dlq.avro = None;
        dlq.protobuf = None;
        dlq.schema_registry = None;
        dlq.key = None;
        dlq.headers = [("reason", "reason"), ("stage", "stage")]
            .into_iter()
            .map(|(h, c)| (h.to_string(), c.to_string()))
            .collect();
        Some(dlq)
    }

    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(Box::new(super::KafkaSinkFactory::new(self)?))
    }
}

impl Limits for KafkaSinkConfig {
    const RANGES: &'static [Range] = &[
        Range::int("partitions", 1, 100_000),
        Range::int("replication_factor", -1, 1000),
        Range::int("delivery_timeout_ms", 1, 3_600_000),
        // librdkafka's least, and the broker's default `transaction.max.timeout.ms` (15 min).
        Range::int("transaction_timeout_ms", 1_000, 900_000),
    ];
}

/// The librdkafka property `transaction_timeout_ms` sets.
pub(crate) const TRANSACTION_TIMEOUT_OPTION: &str = "transaction.timeout.ms";

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(extra: serde_json::Value) -> KafkaSinkConfig {
        let mut v = serde_json::json!({"brokers": "b:9092", "topic": "out"});
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            v.extend(extra.clone());
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_transaction_timeout_defaults_to_30_s_and_passes_a_1_s_checkpoint_interval() {
        let c = sink(serde_json::json!({}));
        assert_eq!(c.transaction_timeout_ms, 30_000);
        assert_eq!(c.check_runtime(Some(1_000)), Ok(()));
        assert_eq!(c.check_runtime(Some(15_000)), Ok(()));
        assert!(c.check_runtime(Some(15_001)).is_err());
        assert_eq!(c.check_runtime(None), Ok(()));
    }

    #[test]
    fn a_transaction_timeout_within_two_checkpoint_intervals_is_refused_naming_the_key() {
        let c = sink(serde_json::json!({"transaction_timeout_ms": 15_000}));
        assert_eq!(c.check_runtime(Some(7_500)), Ok(()));
        let (key, message) = c.check_runtime(Some(8_000)).unwrap_err();
        assert_eq!(key, "transaction_timeout_ms");
        assert!(
            message.contains("15000 ms")
                && message.contains("runtime.checkpoint.interval_ms is 8000")
                && message.contains("at least 16000"),
            "{message}"
        );
        // Without transactions (or checkpoints) the timeout is never used.
        for mode in ["markers", "off"] {
            let c =
                sink(serde_json::json!({"transaction_timeout_ms": 1_000, "exactly_once": mode}));
            assert_eq!(c.check_runtime(Some(60_000)), Ok(()), "{mode}");
        }
        let c = sink(serde_json::json!({"transaction_timeout_ms": 1_000}));
        assert_eq!(c.check_runtime(None), Ok(()));
    }

    #[test]
    fn the_librdkafka_transaction_timeout_in_options_is_refused_for_the_key() {
        let c = sink(serde_json::json!({"options": {"transaction.timeout.ms": "60000"}}));
        let (key, message) = c.check_runtime(None).unwrap_err();
        assert_eq!(key, "options");
        assert!(message.contains("`transaction_timeout_ms`"), "{message}");
    }
}
