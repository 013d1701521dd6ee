//! Kafka source: each worker reads a fixed share of the topic's partitions with its own
//! consumer (no group membership), and messages become rows of the configured format.
//!
//! - [`assignment`]: the topic's partitions and where reading starts in each.
//! - [`schema`]: the output columns, declared or inferred from sampled messages.
//! - [`reader`]: one worker's consumer, filling batches and keeping lag metrics.
//! - [`messages`]: messages copied out of librdkafka and turned into columns; value decoding
//!   is [`crate::formats`]'s, shared with the file sources.
//!
//! Columns:
//! - `json`/`csv`: the value columns, then the key column (when `key` is set), then one column
//!   per `header_columns` entry.
//! - `jpeg`/`raw`: `bytes` (the value), the key column (when set), `partition`, `offset`,
//!   `timestamp` (ms), `headers` (JSON object of all headers), then the `header_columns`.
//!
//! A `json`/`csv` message that does not decode as exactly one record of the schema becomes a
//! dead letter naming its topic, partition and offset; the other messages of its batch are kept.

mod assignment;
mod group;
mod messages;
mod reader;
mod schema;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::SchemaRef;
use rdkafka::consumer::BaseConsumer;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};

use super::client::{check_files, client_config, creation_error, Diagnosed, Role};
use super::config::{KafkaSourceConfig, StartAt};
use super::metrics;
use crate::formats::value::ValueDecoder;
use crate::formats::MessageFormat;

/// Longest wait for metadata, watermarks and offset look-ups.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Most value bytes gathered into one batch: with no value over `max_message_bytes` (capped at
/// this too), a batch's values stay within the 2 GiB of a binary column.
pub(super) const BATCH_VALUE_BYTES: usize = 1 << 30;

/// librdkafka's default `fetch.max.bytes` and `receive.message.max.bytes`.
const DEFAULT_FETCH_MAX_BYTES: usize = 52_428_800;
const DEFAULT_RECEIVE_MAX_BYTES: usize = 100_000_000;
/// Room for the protocol around a message in a fetch response.
const FETCH_OVERHEAD: usize = 1 << 20;

/// Longest single poll, so the batch deadline and end-of-partition checks stay responsive.
const POLL_SLICE: Duration = Duration::from_millis(50);

/// A configured Kafka source: the topic's partitions and the schema are fixed at creation.
pub struct KafkaSourceFactory {
    config: KafkaSourceConfig,
    /// Partition ids, sorted; worker `i` of `n` reads those at positions `p % n == i`.
    partitions: Vec<i32>,
    /// Decodes the values of `json`/`csv`/`avro`/`protobuf` messages (`None` for `jpeg`/`raw`).
    decoder: Option<ValueDecoder>,
    schema: SchemaRef,
}

impl std::fmt::Debug for KafkaSourceFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSourceFactory")
            .field("brokers", &self.config.brokers)
            .field("topic", &self.config.topic)
            .field("partitions", &self.partitions)
            .field("schema", &self.schema)
            .finish()
    }
}

impl KafkaSourceFactory {
    /// Reads the topic's metadata and fixes the schema (declared, or inferred from the first
    /// messages for `json`/`csv`), so an unreachable broker or a missing topic is reported
    /// before the dataflow starts.
    pub fn new(config: &KafkaSourceConfig) -> DataflowResult<Self> {
        validate(config)?;
        let consumer: BaseConsumer<Diagnosed> = consumer_config(config, false, false)
            .create_with_context(Diagnosed::default())
            .map_err(|e| {
                config_error(
                    config,
                    format!(
                        "creating a consumer: {}",
                        creation_error(&config.options, &e)
                    ),
                )
            })?;
        let partitions = assignment::fetch_partitions(&consumer, config)?;
        let decoder = match (config.format.schemaful(), config.format.text()) {
            (Some(format), _) => Some(
                config
                    .schema_settings()
                    .decoder(format)
                    .map_err(|e| config_error(config, e))?,
            ),
            (None, Some(format)) => Some(ValueDecoder::Text(schema::value_decoder(
                config,
                format,
                &partitions,
            )?)),
            (None, None) => None,
        };
        let schema = schema::output_schema(config, decoder.as_ref().map(ValueDecoder::schema))?;
        Ok(KafkaSourceFactory {
            config: config.clone(),
            partitions,
            decoder,
            schema,
        })
    }

    /// The topic's partition ids, sorted.
    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }
}

impl SourceFactory for KafkaSourceFactory {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(self.schema.clone())
    }

    fn checkpoint_id(&self) -> Option<String> {
        Some(format!("kafka:{}", self.config.topic))
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        crate::check_partition(index, peers)?;
        let mine: Vec<i32> = self
            .partitions
            .iter()
            .enumerate()
            .filter(|(pos, _)| pos % peers == index)
            .map(|(_, &p)| p)
            .collect();
        Ok(Box::new(reader::KafkaReader::open(self, &mine)?))
    }

    fn attach_metrics(&self, metrics: &Metrics) -> DataflowResult<()> {
        metrics::attach(metrics)
    }

    /// The same topic, partitions and columns, reading from `offsets` (partitions not listed
    /// start at the earliest).
    fn resume(
        &self,
        offsets: &BTreeMap<i32, i64>,
    ) -> DataflowResult<Option<Arc<dyn SourceFactory>>> {
        // A group's own committed offsets, committed with the output, are where it resumes.
        if self.config.group_id.is_some() {
            return Ok(Some(Arc::new(KafkaSourceFactory {
                config: self.config.clone(),
                partitions: self.partitions.clone(),
                decoder: self.decoder.clone(),
                schema: self.schema.clone(),
            })));
        }
        let mut config = self.config.clone();
        config.start = StartAt::Offsets(offsets.clone());
        validate(&config)?;
        assignment::check_start_offsets(&config, &self.partitions)?;
        Ok(Some(Arc::new(KafkaSourceFactory {
            config,
            partitions: self.partitions.clone(),
            decoder: self.decoder.clone(),
            schema: self.schema.clone(),
        })))
    }
}

fn validate(config: &KafkaSourceConfig) -> DataflowResult<()> {
    let schemaful = config.format.schemaful().is_some();
    if schemaful && config.schema.is_some() {
        return Err(config_error(
            config,
            "`schema` declares JSON/CSV columns; Avro and Protobuf columns come from their own              schema: expected `avro.schema`, `protobuf.proto` or a `schema_registry`",
        ));
    }
    let stray = [
        (
            "avro",
            config.avro.is_some() && config.format != MessageFormat::Avro,
        ),
        (
            "protobuf",
            config.protobuf.is_some() && config.format != MessageFormat::Protobuf,
        ),
        (
            "schema_registry",
            config.schema_registry.is_some() && !schemaful,
        ),
    ];
    if let Some((key, _)) = stray.iter().find(|(_, stray)| *stray) {
        return Err(config_error(
            config,
            format!(
                "`{key}` applies to `format: avro` or `protobuf`, not `{:?}`",
                config.format
            )
            .to_lowercase(),
        ));
    }
    if config.batch_size == 0 {
        return Err(config_error(config, "batch_size must be at least 1"));
    }
    if config.max_message_bytes == 0 || config.max_message_bytes > BATCH_VALUE_BYTES {
        return Err(config_error(
            config,
            format!("max_message_bytes must be between 1 and {BATCH_VALUE_BYTES}"),
        ));
    }
    receive_max_bytes(config)?;
    check_files(&config.options).map_err(|e| config_error(config, e))?;
    if let StartAt::Offsets(offsets) = &config.start {
        if let Some((p, o)) = offsets.iter().find(|(_, &o)| o < 0) {
            return Err(config_error(
                config,
                format!("start offset {o} for partition {p} is negative"),
            ));
        }
    }
    Ok(())
}

/// The librdkafka `receive.message.max.bytes` the source's consumers use. A fetch response
/// larger than it is refused and retried forever, stalling its partition without a word, so
/// it must hold a whole fetch plus a message of `max_message_bytes`; larger messages (up to
/// what is left) are still fetched, and become dead letters.
fn receive_max_bytes(config: &KafkaSourceConfig) -> DataflowResult<usize> {
    let option = |key: &str| -> DataflowResult<Option<usize>> {
        config
            .options
            .get(key)
            .map(|v| {
                v.trim().parse::<usize>().map_err(|_| {
                    config_error(
                        config,
                        format!("options.\"{key}\": `{v}` is not a byte count"),
                    )
                })
            })
            .transpose()
    };
    let needed = config.max_message_bytes + FETCH_OVERHEAD;
    match option("receive.message.max.bytes")? {
        Some(set) if set < needed => Err(config_error(
            config,
            format!(
                "options.\"receive.message.max.bytes\" ({set}) must be at least max_message_bytes + 1 MiB ({needed}): librdkafka cannot fetch a larger message, which would stall its partition"
            ),
        )),
        Some(set) => Ok(set),
        None => {
            let fetch = option("fetch.max.bytes")?.unwrap_or(DEFAULT_FETCH_MAX_BYTES);
            Ok(DEFAULT_RECEIVE_MAX_BYTES
                .max(fetch.saturating_add(needed))
                .min(i32::MAX as usize))
        }
    }
}

/// The source's fetch settings on top of a client configuration (the `options:` were applied
/// last and win; `validate` checked them).
fn with_fetch_settings(
    config: &KafkaSourceConfig,
    mut client: rdkafka::ClientConfig,
) -> rdkafka::ClientConfig {
    if let Ok(receive) = receive_max_bytes(config) {
        client.set("receive.message.max.bytes", receive.to_string());
    }
    client
}

/// Whether a client error says a fetch response was too large to receive: the partition
/// cannot advance, so the run stops saying so instead of retrying forever.
fn is_oversized_fetch(reason: &str) -> bool {
    reason.contains("receive.message.max.bytes")
}

/// What a run says when a message is too large to fetch at all.
fn oversized_fetch_error(max_message_bytes: usize, reason: &str) -> String {
    format!(
        "a message is too large to fetch ({reason}); raise max_message_bytes (now {max_message_bytes}) or options.\"receive.message.max.bytes\""
    )
}

/// A consumer of the source's topic, with the source's `options:`.
fn consumer_config(
    config: &KafkaSourceConfig,
    partition_eof: bool,
    statistics: bool,
) -> rdkafka::ClientConfig {
    with_fetch_settings(
        config,
        client_config(
            &config.brokers,
            &config.options,
            Role::SourceConsumer {
                topic: &config.topic,
                partition_eof,
                statistics,
            },
        ),
    )
}

fn config_error(config: &KafkaSourceConfig, message: impl std::fmt::Display) -> DataflowError {
    DataflowError::Config(format!(
        "kafka source (topic `{}` on {}): {message}",
        config.topic, config.brokers
    ))
}

fn read_error(config: &KafkaSourceConfig, message: impl std::fmt::Display) -> DataflowError {
    DataflowError::stage(
        "source",
        format!(
            "kafka topic `{}` on {}: {message}",
            config.topic, config.brokers
        ),
    )
}
