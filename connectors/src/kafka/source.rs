//! Kafka source: each worker reads a fixed share of the topic's partitions with its own
//! consumer (no group membership), and messages become rows of the configured format.
//!
//! Columns:
//! - `json`/`csv`: the value columns, then the key column (when `key` is set), then one column
//!   per `header_columns` entry.
//! - `jpeg`/`raw`: `bytes` (the value), the key column (when set), `partition`, `offset`,
//!   `timestamp` (ms), `headers` (JSON object of all headers), then the `header_columns`.
//!
//! A `json`/`csv` message that does not decode as exactly one record of the schema becomes a
//! dead letter naming its topic, partition and offset; the other messages of its batch are kept.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Cursor;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow_array::builder::BinaryBuilder;
use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_csv::reader::Format;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use prometheus::{IntCounter, IntGauge};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::metrics::Metrics;
use riffle_dataflow::{
    DataflowError, DataflowResult, Source, SourceBatch, SourceFactory, SourcePosition,
};
use serde_json::Value;
use tracing::{debug, warn};

use super::config::{ColumnType, KafkaSourceConfig, MessageFormat, StartAt};
use super::metrics::{self, kafka_metrics};

/// Longest wait for metadata, watermarks and offset look-ups.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages read to infer a `json`/`csv` schema.
const INFER_MESSAGES: usize = 500;
/// Longest wait for those messages.
const INFER_WAIT: Duration = Duration::from_secs(5);
/// Longest single poll, so the batch deadline and end-of-partition checks stay responsive.
const POLL_SLICE: Duration = Duration::from_millis(50);

/// A configured Kafka source: the topic's partitions and the schema are fixed at creation.
pub struct KafkaSourceFactory {
    config: KafkaSourceConfig,
    /// Partition ids, sorted; worker `i` of `n` reads those at positions `p % n == i`.
    partitions: Vec<i32>,
    /// Value columns of `json`/`csv` messages (`None` for `jpeg`/`raw`).
    value_schema: Option<SchemaRef>,
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
        let consumer: BaseConsumer = client_config(config, Role::Metadata)
            .create()
            .map_err(|e| config_error(config, format!("creating a consumer: {e}")))?;
        let partitions = fetch_partitions(&consumer, config)?;
        let value_schema = match config.format {
            MessageFormat::Jpeg | MessageFormat::Raw => None,
            MessageFormat::Json | MessageFormat::Csv => Some(match &config.schema {
                Some(declared) => declared_schema(config, declared)?,
                None => infer_schema(config, &partitions)?,
            }),
        };
        let schema = output_schema(config, value_schema.as_deref())?;
        Ok(KafkaSourceFactory {
            config: config.clone(),
            partitions,
            value_schema,
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
        Ok(Box::new(KafkaReader::open(self, &mine)?))
    }

    fn attach_metrics(&self, metrics: &Metrics) -> DataflowResult<()> {
        metrics::attach(metrics)
    }
}

fn validate(config: &KafkaSourceConfig) -> DataflowResult<()> {
    if config.batch_size == 0 {
        return Err(config_error(config, "batch_size must be at least 1"));
    }
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

/// What a consumer is created for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Metadata,
    /// Reading the first messages for schema inference.
    Sample,
    Read {
        stop_at_end: bool,
    },
}

fn client_config(config: &KafkaSourceConfig, role: Role) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.brokers)
        // Offsets belong to Riffle; the group only receives advisory commits for lag tools.
        .set("group.id", format!("riffle-{}", config.topic))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // An explicit start offset that has been deleted by retention restarts at the oldest
        // message rather than skipping to the end.
        .set("auto.offset.reset", "earliest");
    match role {
        Role::Metadata => {}
        Role::Sample => {
            c.set("enable.partition.eof", "true");
        }
        Role::Read { stop_at_end } => {
            // The statistics carry each partition's high watermark: consumer lag for free.
            c.set("statistics.interval.ms", "1000");
            if stop_at_end {
                c.set("enable.partition.eof", "true");
            }
        }
    }
    for (key, value) in &config.options {
        c.set(key, value);
    }
    c
}

fn fetch_partitions(
    consumer: &BaseConsumer,
    config: &KafkaSourceConfig,
) -> DataflowResult<Vec<i32>> {
    let metadata = consumer
        .fetch_metadata(Some(&config.topic), METADATA_TIMEOUT)
        .map_err(|e| {
            config_error(
                config,
                format!(
                    "cannot read topic metadata within {} s (brokers unreachable?): {e}",
                    METADATA_TIMEOUT.as_secs()
                ),
            )
        })?;
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == config.topic)
        .ok_or_else(|| config_error(config, "the topic does not exist"))?;
    if let Some(err) = topic.error() {
        return Err(config_error(
            config,
            format!(
                "the topic is not available: {}",
                RDKafkaErrorCode::from(err)
            ),
        ));
    }
    let mut partitions: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
    partitions.sort_unstable();
    if partitions.is_empty() {
        return Err(config_error(config, "the topic has no partitions"));
    }
    if let StartAt::Offsets(offsets) = &config.start {
        let unknown: Vec<i32> = offsets
            .keys()
            .filter(|p| partitions.binary_search(p).is_err())
            .copied()
            .collect();
        if !unknown.is_empty() {
            return Err(config_error(
                config,
                format!(
                    "start offsets name partitions {unknown:?}, but the topic has {partitions:?}"
                ),
            ));
        }
    }
    Ok(partitions)
}

/// Where reading starts in each of `partitions`, as librdkafka offsets.
fn start_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    config: &KafkaSourceConfig,
    partitions: &[i32],
) -> DataflowResult<Vec<(i32, Offset)>> {
    Ok(match &config.start {
        StartAt::Earliest => partitions.iter().map(|&p| (p, Offset::Beginning)).collect(),
        StartAt::Latest => partitions.iter().map(|&p| (p, Offset::End)).collect(),
        StartAt::Offsets(offsets) => partitions
            .iter()
            .map(|&p| {
                (
                    p,
                    offsets
                        .get(&p)
                        .map_or(Offset::Beginning, |&o| Offset::Offset(o)),
                )
            })
            .collect(),
        StartAt::TimestampMs(ts) => {
            if partitions.is_empty() {
                return Ok(Vec::new());
            }
            let mut query = TopicPartitionList::new();
            for &p in partitions {
                // librdkafka takes the timestamp in the offset field.
                query
                    .add_partition_offset(&config.topic, p, Offset::Offset(*ts))
                    .map_err(|e| read_error(config, format!("partition {p}: {e}")))?;
            }
            let found = consumer
                .offsets_for_times(query, METADATA_TIMEOUT)
                .map_err(|e| read_error(config, format!("looking up offsets at {ts} ms: {e}")))?;
            let mut starts = Vec::with_capacity(partitions.len());
            for &p in partitions {
                let elem = found.find_partition(&config.topic, p).ok_or_else(|| {
                    read_error(config, format!("partition {p}: no offset for time {ts} ms"))
                })?;
                elem.error().map_err(|e| {
                    read_error(
                        config,
                        format!("partition {p}: offset for time {ts} ms: {e}"),
                    )
                })?;
                // No message at or after the time: librdkafka answers the end.
                starts.push((p, elem.offset()));
            }
            starts
        }
    })
}

fn watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    config: &KafkaSourceConfig,
    partition: i32,
) -> DataflowResult<(i64, i64)> {
    consumer
        .fetch_watermarks(&config.topic, partition, METADATA_TIMEOUT)
        .map_err(|e| {
            read_error(
                config,
                format!("partition {partition}: reading watermarks: {e}"),
            )
        })
}

fn arrow_type(t: ColumnType) -> DataType {
    match t {
        ColumnType::String => DataType::Utf8,
        ColumnType::Int64 => DataType::Int64,
        ColumnType::Float64 => DataType::Float64,
        ColumnType::Bool => DataType::Boolean,
    }
}

fn declared_schema(
    config: &KafkaSourceConfig,
    declared: &BTreeMap<String, ColumnType>,
) -> DataflowResult<SchemaRef> {
    if declared.is_empty() {
        return Err(config_error(config, "`schema` declares no columns"));
    }
    Ok(Arc::new(Schema::new(
        declared
            .iter()
            .map(|(name, t)| Field::new(name, arrow_type(*t), true))
            .collect::<Vec<_>>(),
    )))
}

/// Infers the value columns from up to [`INFER_MESSAGES`] messages at the start position (the
/// newest ones for `start: latest`, where nothing would be there yet).
fn infer_schema(config: &KafkaSourceConfig, partitions: &[i32]) -> DataflowResult<SchemaRef> {
    let sample = sample_messages(config, partitions)?;
    let format = if config.format == MessageFormat::Csv {
        "csv"
    } else {
        "json"
    };
    if sample.is_empty() {
        return Err(config_error(
            config,
            format!(
                "no messages at the start position to infer the {format} columns from (waited up to {} s); declare them with `schema:`",
                INFER_WAIT.as_secs()
            ),
        ));
    }
    let schema = match config.format {
        MessageFormat::Csv => infer_csv(&sample),
        _ => infer_json(&sample),
    }
    .map_err(|e| {
        config_error(
            config,
            format!("cannot infer the {format} columns from the first messages: {e}; declare them with `schema:`"),
        )
    })?;
    if schema.fields().is_empty() {
        return Err(config_error(
            config,
            format!("the first messages hold no {format} fields; declare them with `schema:`"),
        ));
    }
    Ok(Arc::new(schema))
}

fn sample_messages(config: &KafkaSourceConfig, partitions: &[i32]) -> DataflowResult<Vec<Vec<u8>>> {
    let consumer: BaseConsumer = client_config(config, Role::Sample)
        .create()
        .map_err(|e| config_error(config, format!("creating a consumer: {e}")))?;
    let per_partition = (INFER_MESSAGES / partitions.len()).max(1) as i64;
    let starts = start_offsets(&consumer, config, partitions)?;
    let mut assignment = TopicPartitionList::new();
    // Partition → its high watermark; a partition leaves once read up to it.
    let mut open: HashMap<i32, i64> = HashMap::new();
    for (p, start) in starts {
        let (low, high) = watermarks(&consumer, config, p)?;
        let from = match start {
            Offset::End if config.start == StartAt::Latest => (high - per_partition).max(low),
            Offset::Offset(n) => n.max(low),
            Offset::End => high,
            _ => low,
        };
        if from < high {
            assignment
                .add_partition_offset(&config.topic, p, Offset::Offset(from))
                .map_err(|e| config_error(config, format!("partition {p}: {e}")))?;
            open.insert(p, high);
        }
    }
    let mut sample = Vec::new();
    if open.is_empty() {
        return Ok(sample);
    }
    consumer
        .assign(&assignment)
        .map_err(|e| config_error(config, format!("assigning partitions: {e}")))?;
    let deadline = Instant::now() + INFER_WAIT;
    while sample.len() < INFER_MESSAGES && !open.is_empty() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        match consumer.poll(remaining.min(POLL_SLICE)) {
            None => {}
            Some(Ok(message)) => {
                let p = message.partition();
                if let Some(&high) = open.get(&p) {
                    if let Some(value) = message.payload() {
                        sample.push(value.to_vec());
                    }
                    if message.offset() + 1 >= high {
                        open.remove(&p);
                    }
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => debug!(topic = %config.topic, "kafka source: while sampling: {e}"),
        }
    }
    Ok(sample)
}

fn infer_json(sample: &[Vec<u8>]) -> Result<Schema, ArrowError> {
    // Messages that are not JSON objects are skipped here and rejected when read.
    let objects: Vec<Value> = sample
        .iter()
        .filter_map(|v| serde_json::from_slice::<Value>(v).ok())
        .filter(Value::is_object)
        .collect();
    let infer = |values: &[&Value]| {
        arrow_json::reader::infer_json_schema_from_iterator(values.iter().map(|v| Ok(*v)))
    };
    let all: Vec<&Value> = objects.iter().collect();
    match infer(&all) {
        Ok(schema) => Ok(schema),
        // Conflicting types: infer from the messages that agree, the others get rejected.
        Err(_) => {
            let mut agreeing: Vec<&Value> = Vec::with_capacity(objects.len());
            for value in &objects {
                agreeing.push(value);
                if infer(&agreeing).is_err() {
                    agreeing.pop();
                }
            }
            infer(&agreeing)
        }
    }
}

fn infer_csv(sample: &[Vec<u8>]) -> Result<Schema, ArrowError> {
    let mut text = Vec::new();
    for value in sample {
        let record = trim_line_end(value);
        if !record.is_empty() {
            text.extend_from_slice(record);
            text.push(b'\n');
        }
    }
    // Ragged records must not stop inference: they are rejected one by one when read.
    let format = Format::default()
        .with_header(false)
        .with_truncated_rows(true);
    format
        .infer_schema(Cursor::new(text), Some(INFER_MESSAGES))
        .map(|(schema, _)| schema)
}

fn trim_line_end(value: &[u8]) -> &[u8] {
    let end = value
        .iter()
        .rposition(|&b| b != b'\n' && b != b'\r')
        .map_or(0, |i| i + 1);
    &value[..end]
}

fn output_schema(
    config: &KafkaSourceConfig,
    value_schema: Option<&Schema>,
) -> DataflowResult<SchemaRef> {
    let mut fields: Vec<Field> = match value_schema {
        Some(values) => values.fields().iter().map(|f| f.as_ref().clone()).collect(),
        None => vec![Field::new("bytes", DataType::Binary, false)],
    };
    if let Some(key) = &config.key {
        fields.push(Field::new(key, DataType::Utf8, true));
    }
    if value_schema.is_none() {
        fields.push(Field::new("partition", DataType::Int32, false));
        fields.push(Field::new("offset", DataType::Int64, false));
        fields.push(Field::new("timestamp", DataType::Int64, true));
        fields.push(Field::new("headers", DataType::Utf8, true));
    }
    for (name, t) in &config.header_columns {
        fields.push(Field::new(name, arrow_type(*t), true));
    }
    let mut seen = HashSet::new();
    for f in &fields {
        if !seen.insert(f.name().as_str()) {
            return Err(config_error(
                config,
                format!(
                    "column `{}` would appear twice; rename the key or header column",
                    f.name()
                ),
            ));
        }
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// Keeps the high watermarks that librdkafka reports in its statistics.
struct SourceContext {
    topic: String,
    high_watermarks: Mutex<HashMap<i32, i64>>,
}

impl ClientContext for SourceContext {
    fn stats_raw(&self, statistics: &[u8]) {
        // Only the watermarks are needed: skip parsing the whole statistics tree into types.
        let Ok(stats) = serde_json::from_slice::<Value>(statistics) else {
            return;
        };
        let Some(partitions) = stats
            .get("topics")
            .and_then(|t| t.get(&self.topic))
            .and_then(|t| t.get("partitions"))
            .and_then(Value::as_object)
        else {
            return;
        };
        let mut hw = lock(&self.high_watermarks);
        for (id, p) in partitions {
            let hi = p.get("hi_offset").and_then(Value::as_i64);
            // Partition -1 is librdkafka's internal "unassigned" entry.
            if let (Ok(id), Some(hi)) = (id.parse::<i32>(), hi) {
                if id >= 0 && hi >= 0 {
                    hw.insert(id, hi);
                }
            }
        }
    }
}

impl ConsumerContext for SourceContext {}

// A poisoned lock only means another thread panicked mid-update; the values are still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct PartitionState {
    /// The next offset to read, once known.
    next: Option<i64>,
    /// With `stop_at_end`: the high watermark at start, where reading ends.
    end: Option<i64>,
    finished: bool,
    lag: IntGauge,
}

/// One worker's share of the topic.
struct KafkaReader {
    config: KafkaSourceConfig,
    /// `None` when this worker has no partitions (more workers than partitions).
    consumer: Option<BaseConsumer<SourceContext>>,
    value_schema: Option<SchemaRef>,
    schema: SchemaRef,
    header_columns: Vec<(String, ColumnType)>,
    linger: Duration,
    partitions: BTreeMap<i32, PartitionState>,
    records_in: IntCounter,
    bytes_in: IntCounter,
    /// When pacing: the first read, and the messages read since.
    paced: Option<(Instant, u64)>,
}

impl KafkaReader {
    fn open(factory: &KafkaSourceFactory, mine: &[i32]) -> DataflowResult<Self> {
        let config = &factory.config;
        let m = kafka_metrics()?;
        let mut reader = KafkaReader {
            config: config.clone(),
            consumer: None,
            value_schema: factory.value_schema.clone(),
            schema: factory.schema.clone(),
            header_columns: config
                .header_columns
                .iter()
                .map(|(name, t)| (name.clone(), *t))
                .collect(),
            linger: Duration::from_millis(config.linger_ms),
            partitions: BTreeMap::new(),
            records_in: m.records_in.with_label_values(&[config.topic.as_str()]),
            bytes_in: m.bytes_in.with_label_values(&[config.topic.as_str()]),
            paced: None,
        };
        if mine.is_empty() {
            return Ok(reader);
        }
        let context = SourceContext {
            topic: config.topic.clone(),
            high_watermarks: Mutex::new(HashMap::new()),
        };
        let consumer: BaseConsumer<SourceContext> = client_config(
            config,
            Role::Read {
                stop_at_end: config.stop_at_end,
            },
        )
        .create_with_context(context)
        .map_err(|e| read_error(config, format!("creating a consumer: {e}")))?;
        let mut assignment = TopicPartitionList::new();
        for (p, start) in start_offsets(&consumer, config, mine)? {
            let mut state = PartitionState {
                next: match start {
                    Offset::Offset(n) => Some(n),
                    _ => None,
                },
                end: None,
                finished: false,
                lag: m
                    .consumer_lag
                    .with_label_values(&[config.topic.as_str(), p.to_string().as_str()]),
            };
            if config.stop_at_end {
                let (low, high) = watermarks(&consumer, config, p)?;
                state.end = Some(high);
                state.finished = match start {
                    Offset::Offset(n) => n >= high,
                    Offset::End => true,
                    _ => high <= low,
                };
            }
            if !state.finished {
                assignment
                    .add_partition_offset(&config.topic, p, start)
                    .map_err(|e| read_error(config, format!("partition {p}: {e}")))?;
            }
            reader.partitions.insert(p, state);
        }
        consumer
            .assign(&assignment)
            .map_err(|e| read_error(config, format!("assigning partitions {mine:?}: {e}")))?;
        reader.consumer = Some(consumer);
        Ok(reader)
    }

    fn all_finished(&self) -> bool {
        self.partitions.values().all(|s| s.finished)
    }

    fn empty_batch(&self) -> SourceBatch {
        SourceBatch::new(RecordBatch::new_empty(self.schema.clone()), Vec::new())
    }

    /// Polls until a batch is full, the linger time has passed, or (with `stop_at_end`) every
    /// partition is done.
    fn fill(&mut self, consumer: &BaseConsumer<SourceContext>) -> Pending {
        let mut pending = Pending::default();
        let keep_headers_json = self.value_schema.is_none();
        let deadline = Instant::now() + self.linger;
        while pending.messages.len() < self.config.batch_size {
            if self.config.stop_at_end && self.all_finished() {
                break;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            match consumer.poll(remaining.min(POLL_SLICE)) {
                None => {}
                Some(Ok(message)) => {
                    let Some(state) = self.partitions.get_mut(&message.partition()) else {
                        continue;
                    };
                    if state.finished {
                        continue;
                    }
                    let offset = message.offset();
                    if let Some(end) = state.end {
                        // Written after the run started: beyond this run's end.
                        if offset >= end {
                            state.finished = true;
                            pause(consumer, &self.config, message.partition());
                            continue;
                        }
                    }
                    state.next = Some(offset + 1);
                    if state.end.is_some_and(|end| offset + 1 >= end) {
                        state.finished = true;
                    }
                    pending.push(&message, &self.header_columns, keep_headers_json);
                }
                // Only a run that stops at the end cares; otherwise more messages may come.
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    let stop_at_end = self.config.stop_at_end;
                    if let Some(state) = self.partitions.get_mut(&p).filter(|_| stop_at_end) {
                        state.finished = true;
                    }
                }
                // Transient (a broker restarting, a leader moving): librdkafka retries itself.
                Some(Err(e)) => warn!(
                    topic = %self.config.topic,
                    brokers = %self.config.brokers,
                    "kafka source: {e}"
                ),
            }
        }
        pending
    }

    /// The value columns of the messages that decode, with the indices of those messages and
    /// dead letters for the others.
    fn decode(&self, pending: &Pending) -> DataflowResult<Decoded> {
        let all: Vec<usize> = (0..pending.messages.len()).collect();
        let Some(schema) = &self.value_schema else {
            return Ok((None, all, Vec::new()));
        };
        let values: Vec<&[u8]> = pending.messages.iter().map(|m| pending.value(m)).collect();
        let decode = |values: &[&[u8]]| match self.config.format {
            MessageFormat::Csv => decode_csv(schema, values),
            _ => decode_json(schema, values),
        };
        if let Ok(batch) = decode(&values) {
            return Ok((Some(batch), all, Vec::new()));
        }
        // Something in the chunk is bad: decode message by message to reject only those.
        let mut good_batches = Vec::with_capacity(values.len());
        let mut good = Vec::with_capacity(values.len());
        let mut rejected = Vec::new();
        for (i, value) in values.iter().enumerate() {
            match decode(std::slice::from_ref(value)) {
                Ok(batch) => {
                    good_batches.push(batch);
                    good.push(i);
                }
                Err(e) => {
                    let m = &pending.messages[i];
                    rejected.push(DeadLetter {
                        stage: "source".to_string(),
                        reason: e.to_string(),
                        record: serde_json::json!({
                            "topic": self.config.topic,
                            "partition": m.partition,
                            "offset": m.offset,
                        })
                        .to_string(),
                    });
                }
            }
        }
        let batch = arrow_select::concat::concat_batches(schema, &good_batches)?;
        Ok((Some(batch), good, rejected))
    }

    /// The output batch: value columns (or `bytes` and the message fields) and the key and
    /// header columns of messages `rows`.
    fn assemble(
        &self,
        pending: &Pending,
        values: Option<RecordBatch>,
        rows: &[usize],
    ) -> DataflowResult<RecordBatch> {
        let messages: Vec<&Received> = rows.iter().map(|&i| &pending.messages[i]).collect();
        let raw = values.is_none();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        match values {
            Some(values) => columns.extend(values.columns().iter().cloned()),
            None => {
                let mut bytes = BinaryBuilder::with_capacity(messages.len(), pending.values.len());
                for m in &messages {
                    bytes.append_value(pending.value(m));
                }
                columns.push(Arc::new(bytes.finish()));
            }
        }
        if self.config.key.is_some() {
            columns.push(Arc::new(StringArray::from_iter(
                messages.iter().map(|m| m.key.as_deref()),
            )));
        }
        if raw {
            columns.push(Arc::new(Int32Array::from_iter_values(
                messages.iter().map(|m| m.partition),
            )));
            columns.push(Arc::new(Int64Array::from_iter_values(
                messages.iter().map(|m| m.offset),
            )));
            columns.push(Arc::new(Int64Array::from_iter(
                messages.iter().map(|m| m.timestamp),
            )));
            columns.push(Arc::new(StringArray::from_iter(
                messages.iter().map(|m| m.headers_json.as_deref()),
            )));
        }
        for (i, (_, t)) in self.header_columns.iter().enumerate() {
            let texts = messages.iter().map(|m| m.header_values[i].as_deref());
            let column: ArrayRef = match t {
                ColumnType::String => Arc::new(StringArray::from_iter(texts)),
                ColumnType::Int64 => Arc::new(Int64Array::from_iter(
                    texts.map(|s| s.and_then(|s| s.trim().parse::<i64>().ok())),
                )),
                ColumnType::Float64 => Arc::new(Float64Array::from_iter(
                    texts.map(|s| s.and_then(|s| s.trim().parse::<f64>().ok())),
                )),
                ColumnType::Bool => Arc::new(BooleanArray::from_iter(texts.map(|s| {
                    s.and_then(|s| match s.trim().to_ascii_lowercase().as_str() {
                        "true" => Some(true),
                        "false" => Some(false),
                        _ => None,
                    })
                }))),
            };
            columns.push(column);
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }

    /// Advisory bookkeeping after a batch: lag gauges and an asynchronous commit of the next
    /// offsets (for lag tools only; Riffle's checkpoints own the offsets).
    fn after_batch(&self, consumer: &BaseConsumer<SourceContext>, touched: &[i32]) {
        let high_watermarks = lock(&consumer.context().high_watermarks).clone();
        for (p, state) in &self.partitions {
            let hw = high_watermarks.get(p).copied().max(state.end);
            if let (Some(hw), Some(next)) = (hw, state.next) {
                state.lag.set((hw - next).max(0));
            }
        }
        let mut commit = TopicPartitionList::new();
        for p in touched {
            if let Some(next) = self.partitions.get(p).and_then(|s| s.next) {
                if let Err(e) =
                    commit.add_partition_offset(&self.config.topic, *p, Offset::Offset(next))
                {
                    debug!(topic = %self.config.topic, partition = p, "kafka source: commit list: {e}");
                }
            }
        }
        if commit.count() > 0 {
            if let Err(e) = consumer.commit(&commit, CommitMode::Async) {
                debug!(topic = %self.config.topic, "kafka source: advisory commit failed: {e}");
            }
        }
    }
}

type Decoded = (Option<RecordBatch>, Vec<usize>, Vec<DeadLetter>);

fn pause(consumer: &BaseConsumer<SourceContext>, config: &KafkaSourceConfig, partition: i32) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&config.topic, partition);
    // Only saves fetching messages this run will not read; failing is harmless.
    if let Err(e) = consumer.pause(&tpl) {
        debug!(topic = %config.topic, partition, "kafka source: pausing: {e}");
    }
}

impl Source for KafkaReader {
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        let Some(consumer) = self.consumer.take() else {
            if self.config.stop_at_end {
                return Ok(None);
            }
            // Nothing to read, ever: pace the worker loop instead of spinning.
            std::thread::sleep(self.linger.max(Duration::from_millis(10)));
            return Ok(Some(self.empty_batch()));
        };
        // The consumer is taken out while filling so that partition state can be updated.
        let result = self.next_from(&consumer);
        self.consumer = Some(consumer);
        if let (Some(rate), Ok(Some(batch))) = (self.config.max_records_per_second, &result) {
            let (since, read) = self.paced.get_or_insert_with(|| (Instant::now(), 0));
            *read += (batch.records.num_rows() + batch.rejected.len()) as u64;
            let due = Duration::from_secs_f64(*read as f64 / rate.max(f64::MIN_POSITIVE));
            if let Some(wait) = due.checked_sub(since.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        result
    }
}

impl KafkaReader {
    fn next_from(
        &mut self,
        consumer: &BaseConsumer<SourceContext>,
    ) -> DataflowResult<Option<SourceBatch>> {
        if self.config.stop_at_end && self.all_finished() {
            return Ok(None);
        }
        let pending = self.fill(consumer);
        if pending.messages.is_empty() {
            if self.config.stop_at_end && self.all_finished() {
                return Ok(None);
            }
            return Ok(Some(self.empty_batch()));
        }
        let (values, rows, rejected) = self.decode(&pending)?;
        let records = self.assemble(&pending, values, &rows)?;

        let mut ranges: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
        let mut bytes = 0u64;
        for m in &pending.messages {
            let range = ranges.entry(m.partition).or_insert((m.offset, m.offset));
            range.0 = range.0.min(m.offset);
            range.1 = range.1.max(m.offset);
            bytes += m.size as u64;
        }
        self.records_in.inc_by(pending.messages.len() as u64);
        self.bytes_in.inc_by(bytes);
        let touched: Vec<i32> = ranges.keys().copied().collect();
        self.after_batch(consumer, &touched);
        Ok(Some(SourceBatch {
            records,
            rejected,
            positions: ranges
                .into_iter()
                .map(|(partition, (first_offset, last_offset))| SourcePosition {
                    partition,
                    first_offset,
                    last_offset,
                })
                .collect(),
        }))
    }
}

/// A message copied out of librdkafka's buffers.
struct Received {
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<String>,
    /// Where the value lies in [`Pending::values`].
    value: Range<usize>,
    /// Key and value bytes, for the byte counter.
    size: usize,
    headers_json: Option<String>,
    /// The text of each configured header column's header (last one of that name).
    header_values: Vec<Option<String>>,
}

/// The messages of the batch being filled; values are stored back to back.
#[derive(Default)]
struct Pending {
    messages: Vec<Received>,
    values: Vec<u8>,
}

impl Pending {
    fn push(
        &mut self,
        message: &BorrowedMessage<'_>,
        header_columns: &[(String, ColumnType)],
        keep_headers_json: bool,
    ) {
        let payload = message.payload().unwrap_or_default();
        let key = message.key();
        let start = self.values.len();
        self.values.extend_from_slice(payload);
        let mut header_values = vec![None; header_columns.len()];
        let mut json = keep_headers_json.then(serde_json::Map::new);
        if let Some(headers) = message.headers() {
            for header in headers.iter() {
                let text = header
                    .value
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                if let Some(i) = header_columns.iter().position(|(n, _)| n == header.key) {
                    header_values[i] = text.clone();
                }
                if let Some(map) = json.as_mut() {
                    map.insert(
                        header.key.to_string(),
                        text.map_or(Value::Null, Value::String),
                    );
                }
            }
        }
        self.messages.push(Received {
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            key: key.map(|k| String::from_utf8_lossy(k).into_owned()),
            value: start..self.values.len(),
            size: payload.len() + key.map_or(0, <[u8]>::len),
            headers_json: json
                .filter(|m| !m.is_empty())
                .map(|m| Value::Object(m).to_string()),
            header_values,
        });
    }

    fn value(&self, message: &Received) -> &[u8] {
        &self.values[message.value.clone()]
    }
}

/// Decodes one JSON object per message; fails if any message holds anything else.
fn decode_json(schema: &SchemaRef, values: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
    // One spare row, so a second value in the last message is seen rather than left unread.
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(values.len() + 1)
        .build_decoder()?;
    for (i, value) in values.iter().enumerate() {
        let read = decoder.decode(value)?;
        if decoder.has_partial_record() {
            return Err(ArrowError::JsonError(
                "incomplete JSON value in the message".to_string(),
            ));
        }
        let rows = decoder.len();
        if rows <= i {
            return Err(ArrowError::JsonError(
                "the message holds no JSON value".to_string(),
            ));
        }
        if rows > i + 1 || read < value.len() {
            return Err(ArrowError::JsonError(
                "the message holds more than one JSON value".to_string(),
            ));
        }
    }
    Ok(decoder
        .flush()?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
}

/// Decodes one CSV record (no header) per message; fails if any message holds anything else.
fn decode_csv(schema: &SchemaRef, values: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
    let capacity = values.len() + 1;
    let mut decoder = arrow_csv::ReaderBuilder::new(schema.clone())
        .with_header(false)
        .with_batch_size(capacity)
        .build_decoder();
    for (i, value) in values.iter().enumerate() {
        let record = trim_line_end(value);
        if record.is_empty() {
            return Err(ArrowError::CsvError(
                "the message holds no CSV record".to_string(),
            ));
        }
        feed_csv(&mut decoder, record)?;
        feed_csv(&mut decoder, b"\n")?;
        let rows = capacity - decoder.capacity();
        if rows <= i {
            return Err(ArrowError::CsvError(
                "the message's CSV record does not end (unbalanced quote?)".to_string(),
            ));
        }
        if rows > i + 1 {
            return Err(ArrowError::CsvError(
                "the message holds more than one CSV record".to_string(),
            ));
        }
    }
    // An empty buffer tells the parser the input has ended.
    decoder.decode(&[])?;
    Ok(decoder
        .flush()?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
}

fn feed_csv(decoder: &mut arrow_csv::reader::Decoder, mut buf: &[u8]) -> Result<(), ArrowError> {
    while !buf.is_empty() {
        let n = decoder.decode(buf)?;
        if n == 0 {
            // Only a full batch stops the parser: more records than messages.
            return Err(ArrowError::CsvError(
                "the message holds more than one CSV record".to_string(),
            ));
        }
        buf = &buf[n..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ]))
    }

    #[test]
    fn json_needs_exactly_one_object_per_message() {
        let s = schema();
        let batch = decode_json(&s, &[b"{\"a\":1,\"b\":\"x\"}\n", b" {\"a\":2} "]).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert!(decode_json(&s, &[b"{\"a\":1}{\"a\":2}"]).is_err());
        assert!(decode_json(&s, &[b"{\"a\":1", b"}"]).is_err());
        assert!(decode_json(&s, &[b""]).is_err());
        assert!(decode_json(&s, &[b"5"]).is_err());
        assert!(decode_json(&s, &[b"{\"a\":\"nope\"}"]).is_err());
    }

    #[test]
    fn csv_needs_exactly_one_record_per_message() {
        let s = schema();
        let batch = decode_csv(&s, &[b"1,x", b"2,\"y\nz\"\r\n"]).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert!(decode_csv(&s, &[b"1,x\n2,y"]).is_err());
        assert!(decode_csv(&s, &[b"1,\"x", b"2,y"]).is_err());
        assert!(decode_csv(&s, &[b"1"]).is_err());
        assert!(decode_csv(&s, &[b"q,x"]).is_err());
        assert!(decode_csv(&s, &[b"\n"]).is_err());
    }

    #[test]
    fn csv_inference_names_columns_by_position() {
        let schema = infer_csv(&[b"1,x\n".to_vec(), b"2,y".to_vec()]).unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["column_1", "column_2"]);
        assert_eq!(schema.field(0).data_type(), &DataType::Int64);
    }
}
