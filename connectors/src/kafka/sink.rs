//! Kafka sink: an idempotent producer (`acks=all`) writing one JSON message per row or one
//! Arrow IPC message per batch. A message Kafka fails to deliver fails the next write or the
//! flush: deliveries are never dropped silently.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arrow_array::{Array, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use prometheus::IntCounter;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientConfig;
use riffle_dataflow::metrics::Metrics;
use riffle_dataflow::sink::{Committer, Recovery, Sink, SinkFactory};
use riffle_dataflow::{DataflowError, DataflowResult};
use tracing::warn;

use super::client::{drain, Role};
use super::config::{ExactlyOnce, KafkaSinkConfig, SinkFormat};
use super::metrics::{self, kafka_metrics};
use super::transactions::{
    brokers_support_transactions, commit_log_topic, last_commit, recovery, InitError, Transaction,
    TransactionCommitter, COMMIT_RECORD,
};

/// Wait between polls while librdkafka's queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(50);

/// A configured Kafka sink; each `open` creates its own producer.
pub struct KafkaSinkFactory {
    config: KafkaSinkConfig,
    /// How this run's output is exactly-once, settled by `recover` (runs with checkpoints).
    mode: Mutex<Mode>,
}

/// A run's exactly-once mode.
#[derive(Clone)]
enum Mode {
    /// Not settled (a run without checkpoints, or a direct user of the factory): results are
    /// stamped for commit markers if the runtime asks for it.
    Unsettled,
    Off,
    Markers,
    /// `transaction` is the leader's initialised producer (other processes hold none).
    Transactions {
        transaction: Option<Arc<Transaction>>,
    },
}

impl std::fmt::Debug for KafkaSinkFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSinkFactory")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// How long a restarted process waits for a pending transaction on the commit log to be
/// resolved by the process that opens the sink.
const PENDING_WAIT: Duration = Duration::from_secs(90);

impl KafkaSinkFactory {
    /// Checks the configuration (including that librdkafka accepts every option).
    pub fn new(config: &KafkaSinkConfig) -> DataflowResult<Self> {
        if config.topic.is_empty() {
            return Err(config_error(config, "`topic` is empty"));
        }
        if config.delivery_timeout_ms == 0 {
            return Err(config_error(config, "delivery_timeout_ms must be positive"));
        }
        client_config(config)
            .create_native_config()
            .map_err(|e| config_error(config, e))?;
        Ok(KafkaSinkFactory {
            config: config.clone(),
            mode: Mutex::new(Mode::Unsettled),
        })
    }

    /// The producer's `transactional.id` in `transactions` mode.
    pub fn transactional_id(&self) -> String {
        self.config
            .transactional_id
            .clone()
            .unwrap_or_else(|| format!("riffle-{}", self.config.topic))
    }

    /// The commit log topic and the leader's initialised transactional producer.
    fn initialise(&self, id: &str) -> Result<Arc<Transaction>, InitError> {
        let log = commit_log_topic(&self.config.topic);
        let compact = BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]);
        self.ensure_topic(&log, 1, &compact)?;
        let (context, _) = sink_context(&self.config)?;
        Transaction::init(&self.config, id, context).map(Arc::new)
    }

    fn mode(&self) -> Mode {
        lock(&self.mode).clone()
    }

    /// Creates `name` unless it exists, through the sink's client options (SASL, TLS) and with
    /// its replication factor; `config`: topic configs (the results topic's `topic_config`).
    fn ensure_topic(
        &self,
        name: &str,
        partitions: i32,
        config: &BTreeMap<String, String>,
    ) -> DataflowResult<()> {
        super::replay::ensure_topic(
            &self.config.brokers,
            &self.config.options,
            &super::replay::TopicSpec {
                name: name.to_string(),
                partitions,
                replication_factor: self.config.replication_factor,
                config: config.clone(),
            },
        )
    }
}

impl SinkFactory for KafkaSinkFactory {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        // Brokers differ on auto-creating topics; create ours explicitly, at run time only.
        if self.config.create_topic {
            self.ensure_topic(
                &self.config.topic,
                self.config.partitions,
                &self.config.topic_config,
            )?;
        }
        let sink = match self.mode() {
            Mode::Transactions {
                transaction: Some(t),
            } => KafkaSink::transactional(&self.config, t)?,
            Mode::Transactions { transaction: None } => {
                return Err(config_error(
                    &self.config,
                    "the sink opened in a process that did not initialise its transactions",
                ))
            }
            Mode::Off => KafkaSink::open(&self.config, false)?,
            Mode::Unsettled | Mode::Markers => KafkaSink::open(&self.config, true)?,
        };
        Ok(Box::new(sink))
    }

    fn attach_metrics(&self, metrics: &Metrics) -> DataflowResult<()> {
        metrics::attach(metrics)
    }

    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        Ok(match self.mode() {
            Mode::Off => None,
            Mode::Transactions { transaction } => {
                let transaction = transaction.ok_or_else(|| {
                    config_error(&self.config, "no transactional producer in this process")
                })?;
                Some(Box::new(TransactionCommitter { transaction }))
            }
            Mode::Unsettled | Mode::Markers => Some(Box::new(MarkerWriter::open(&self.config)?)),
        })
    }

    fn recover(&self, leader: bool) -> DataflowResult<Recovery> {
        let id = self.transactional_id();
        // The leader's own initialisation tells whether the brokers have transactions; other
        // processes ask with a throw-away id (the real one would fence the leader).
        let mut initialised = None;
        let transactions = match self.config.exactly_once {
            ExactlyOnce::Transactions => true,
            ExactlyOnce::Auto => {
                let supported = if leader {
                    match self.initialise(&id) {
                        Ok(t) => {
                            initialised = Some(t);
                            true
                        }
                        Err(e) if e.unsupported => false,
                        Err(e) => return Err(e.error),
                    }
                } else {
                    brokers_support_transactions(&self.config, &id)?
                };
                if !supported {
                    tracing::warn!(
                        topic = %self.config.topic,
                        "the brokers have no transactions: exactly-once output uses commit \
                         markers, which only `riffle consume` applies"
                    );
                }
                supported
            }
            ExactlyOnce::Markers | ExactlyOnce::Off => false,
        };
        if !transactions {
            if let Some(group) = &self.config.source_group {
                return Err(config_error(
                    &self.config,
                    format!(
                        "consumer group `{}` commits its offsets in this sink's transactions, \
                         and these brokers have none",
                        group.group_id
                    ),
                ));
            }
            *lock(&self.mode) = match self.config.exactly_once {
                ExactlyOnce::Off => Mode::Off,
                _ => Mode::Markers,
            };
            return Ok(Recovery::Latest);
        }
        let transaction = match (leader, initialised) {
            (true, Some(t)) => Some(t),
            (true, None) => Some(self.initialise(&id).map_err(|e| e.error)?),
            (false, _) => None,
        };
        let last = last_commit(&self.config, &id, PENDING_WAIT)?;
        tracing::info!(
            topic = %self.config.topic,
            transactional_id = %id,
            "last committed transaction: {}",
            last.map_or("none".to_string(), |c| format!("epoch {} of run {}", c.epoch, c.generation))
        );
        *lock(&self.mode) = Mode::Transactions { transaction };
        Ok(recovery(last))
    }
}

/// Header naming the generation (run) that wrote a result, in exactly-once runs.
pub const GENERATION_HEADER: &str = "riffle.generation";
/// Header naming the epoch of a result.
pub const EPOCH_HEADER: &str = "riffle.epoch";
/// Header of a commit marker: `generation:epoch`, everything of that generation up to that
/// epoch is final.
pub const COMMIT_HEADER: &str = "riffle.commit";
/// Header of a fence marker: a generation; results of older generations not committed before
/// it are void.
pub const FENCE_HEADER: &str = "riffle.fence";

/// Writes commit and fence markers to every partition of the results topic, after the results
/// they cover are acknowledged (a checkpoint waits for that), so each partition's reader sees
/// a marker after the results it covers.
struct MarkerWriter {
    config: KafkaSinkConfig,
    producer: BaseProducer,
    partitions: Vec<i32>,
}

impl MarkerWriter {
    fn open(config: &KafkaSinkConfig) -> DataflowResult<Self> {
        let producer: BaseProducer = client_config(config)
            .create()
            .map_err(|e| config_error(config, format!("creating a marker producer: {e}")))?;
        let timeout = Duration::from_millis(config.delivery_timeout_ms);
        let metadata = producer
            .client()
            .fetch_metadata(Some(&config.topic), timeout)
            .map_err(|e| config_error(config, format!("reading the topic's partitions: {e}")))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(config_error(config, "the topic has no partitions"));
        }
        Ok(MarkerWriter {
            config: config.clone(),
            producer,
            partitions,
        })
    }

    fn mark(&mut self, header: &str, value: &str) -> DataflowResult<()> {
        for &partition in &self.partitions {
            let headers = OwnedHeaders::new().insert(Header {
                key: header,
                value: Some(value.as_bytes()),
            });
            let record = BaseRecord::<[u8], [u8]>::to(&self.config.topic)
                .partition(partition)
                .payload(&[][..])
                .headers(headers);
            self.producer.send(record).map_err(|(e, _)| {
                sink_error(&self.config, format!("writing a {header} marker: {e}"))
            })?;
        }
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        if drain(&self.producer, timeout) {
            Ok(())
        } else {
            Err(sink_error(
                &self.config,
                format!(
                    "{header} markers undelivered after {} ms",
                    timeout.as_millis()
                ),
            ))
        }
    }
}

impl Committer for MarkerWriter {
    fn commit(&mut self, generation: u64, through: riffle_dataflow::Epoch) -> DataflowResult<()> {
        self.mark(COMMIT_HEADER, &format!("{generation}:{through}"))
    }

    fn fence(&mut self, generation: u64) -> DataflowResult<()> {
        self.mark(FENCE_HEADER, &generation.to_string())
    }
}

fn config_error(config: &KafkaSinkConfig, message: impl std::fmt::Display) -> DataflowError {
    DataflowError::Config(format!(
        "kafka sink (topic `{}` on {}): {message}",
        config.topic, config.brokers
    ))
}

fn sink_error(config: &KafkaSinkConfig, message: impl std::fmt::Display) -> DataflowError {
    DataflowError::stage(
        "sink",
        format!(
            "kafka topic `{}` on {}: {message}",
            config.topic, config.brokers
        ),
    )
}

fn client_config(config: &KafkaSinkConfig) -> ClientConfig {
    super::client::client_config(&config.brokers, &config.options, Role::SinkProducer)
}

/// Delivery outcomes, written by librdkafka's callbacks and read by the sink.
#[derive(Default)]
pub(super) struct DeliveryState {
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// Messages numbered in the order they were produced, and those not yet acknowledged.
    sequence: Mutex<Sequence>,
    /// Every message numbered below this is acknowledged by the broker.
    durable: Arc<AtomicU64>,
}

#[derive(Default)]
struct Sequence {
    next: u64,
    outstanding: BTreeSet<u64>,
}

impl DeliveryState {
    pub(super) fn number(&self) -> u64 {
        let mut s = lock(&self.sequence);
        let n = s.next;
        s.next += 1;
        s.outstanding.insert(n);
        n
    }

    fn acknowledged(&self, n: u64) {
        let mut s = lock(&self.sequence);
        s.outstanding.remove(&n);
        let durable = s.outstanding.first().copied().unwrap_or(s.next);
        self.durable.store(durable, Ordering::Release);
    }
}

pub(super) struct SinkContext {
    pub(super) state: Arc<DeliveryState>,
    records_out: IntCounter,
    bytes_out: IntCounter,
    produce_errors: IntCounter,
}

impl ClientContext for SinkContext {}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, n: usize) {
        match result {
            // The commit record's fate is the commit's own outcome.
            _ if n == COMMIT_RECORD => {}
            Ok(message) => {
                self.state.acknowledged(n as u64);
                self.records_out.inc();
                let size = message.payload_len() + message.key_len();
                self.bytes_out.inc_by(size as u64);
            }
            Err((error, _)) => {
                self.produce_errors.inc();
                self.state.failed.fetch_add(1, Ordering::Relaxed);
                lock(&self.state.first_error).get_or_insert_with(|| error.to_string());
            }
        }
    }
}

// A poisoned lock only means another thread panicked mid-update; the value is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The context of a sink's producer: its delivery state and metrics.
fn sink_context(config: &KafkaSinkConfig) -> DataflowResult<(SinkContext, Arc<DeliveryState>)> {
    let m = kafka_metrics()?;
    let topic = [config.topic.as_str()];
    let state = Arc::new(DeliveryState::default());
    let context = SinkContext {
        state: state.clone(),
        records_out: m.records_out.with_label_values(&topic),
        bytes_out: m.bytes_out.with_label_values(&topic),
        produce_errors: m.produce_errors.with_label_values(&topic),
    };
    Ok((context, state))
}

/// A sink's producer: its own, or the transactional one it shares with the committer.
enum Writer {
    Plain(BaseProducer<SinkContext>),
    Transactional(Arc<Transaction>),
}

/// An open Kafka sink. Delivery reports are served whenever it writes or flushes.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    writer: Writer,
    state: Arc<DeliveryState>,
    /// Stamp results for commit markers when the runtime announces epochs.
    markers: bool,
    /// `(generation, epoch)` headers for the results being written, in marker runs.
    stamp: Option<(String, String)>,
}

impl KafkaSink {
    fn open(config: &KafkaSinkConfig, markers: bool) -> DataflowResult<Self> {
        let (context, state) = sink_context(config)?;
        let producer = client_config(config)
            .create_with_context(context)
            .map_err(|e| config_error(config, format!("creating a producer: {e}")))?;
        Ok(KafkaSink {
            config: config.clone(),
            writer: Writer::Plain(producer),
            state,
            markers,
            stamp: None,
        })
    }

    fn transactional(
        config: &KafkaSinkConfig,
        transaction: Arc<Transaction>,
    ) -> DataflowResult<Self> {
        let state = transaction.producer.context().state.clone();
        Ok(KafkaSink {
            config: config.clone(),
            writer: Writer::Transactional(transaction),
            state,
            markers: false,
            stamp: None,
        })
    }

    fn producer(&self) -> &BaseProducer<SinkContext> {
        match &self.writer {
            Writer::Plain(p) => p,
            Writer::Transactional(t) => &t.producer,
        }
    }

    /// Encodes and sends one batch.
    fn write_rows(&self, batch: &RecordBatch) -> DataflowResult<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match self.config.format {
            SinkFormat::Json => self.write_json(batch),
            SinkFormat::Ipc => self.write_ipc(batch),
        }
    }

    /// The error of any failed delivery so far.
    fn check_deliveries(&self) -> DataflowResult<()> {
        let failed = self.state.failed.load(Ordering::Relaxed);
        if failed == 0 {
            return Ok(());
        }
        let first = lock(&self.state.first_error).clone().unwrap_or_default();
        Err(sink_error(
            &self.config,
            format!("{failed} message(s) not delivered; first error: {first}"),
        ))
    }

    /// Queues one message, waiting for room when librdkafka's queue is full.
    fn send(
        &self,
        key: Option<&[u8]>,
        payload: &[u8],
        mut headers: Option<OwnedHeaders>,
    ) -> DataflowResult<()> {
        if let Some((generation, epoch)) = &self.stamp {
            let h = headers
                .take()
                .unwrap_or_else(|| OwnedHeaders::new_with_capacity(2));
            headers = Some(
                h.insert(Header {
                    key: GENERATION_HEADER,
                    value: Some(generation.as_bytes()),
                })
                .insert(Header {
                    key: EPOCH_HEADER,
                    value: Some(epoch.as_bytes()),
                }),
            );
        }
        if let Writer::Transactional(t) = &self.writer {
            if t.hold(key, payload, headers.as_ref())? {
                return Ok(());
            }
        }
        let n = self.state.number() as usize;
        let mut record =
            BaseRecord::<[u8], [u8], usize>::with_opaque_to(&self.config.topic, n).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(headers) = headers {
            record = record.headers(headers);
        }
        loop {
            match self.producer().send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    // Backpressure: serve delivery reports until messages leave the queue.
                    record = returned;
                    self.producer().poll(QUEUE_FULL_WAIT);
                    self.check_deliveries()?;
                }
                Err((e, _)) => {
                    return Err(sink_error(
                        &self.config,
                        format!("producing a message: {e}"),
                    ))
                }
            }
        }
    }

    /// The column named by the config for `role`, or an error naming it.
    fn column<'b>(
        &self,
        batch: &'b RecordBatch,
        name: &str,
        role: &str,
    ) -> DataflowResult<&'b dyn Array> {
        batch
            .column_by_name(name)
            .map(|c| c.as_ref())
            .ok_or_else(|| {
                let columns: Vec<String> = batch
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                config_error(
                    &self.config,
                    format!("{role} column `{name}` is not in the results (columns: {columns:?})"),
                )
            })
    }

    fn write_json(&self, batch: &RecordBatch) -> DataflowResult<()> {
        let options = FormatOptions::default();
        let key = match &self.config.key {
            Some(name) => Some(Rendered::new(self.column(batch, name, "key")?, &options)?),
            None => None,
        };
        let mut headers = Vec::with_capacity(self.config.headers.len());
        for (header, column) in &self.config.headers {
            let array = self.column(batch, column, &format!("header `{header}`"))?;
            headers.push((header.as_str(), Rendered::new(array, &options)?));
        }
        let lines = crate::jsonl::json_lines(batch)
            .map_err(|e| sink_error(&self.config, format!("encoding rows as JSON: {e}")))?;
        let rows: Vec<&[u8]> = lines
            .split(|&b| b == b'\n')
            .take(batch.num_rows())
            .collect();
        if rows.len() != batch.num_rows() {
            return Err(sink_error(
                &self.config,
                format!(
                    "JSON encoding gave {} lines for {} rows",
                    rows.len(),
                    batch.num_rows()
                ),
            ));
        }
        for (row, value) in rows.into_iter().enumerate() {
            let key = key.as_ref().and_then(|k| k.get(row));
            let mut owned = None;
            for (name, rendered) in &headers {
                // A null value sends no header rather than an empty one.
                if let Some(text) = rendered.get(row) {
                    let current = owned
                        .take()
                        .unwrap_or_else(|| OwnedHeaders::new_with_capacity(headers.len()));
                    owned = Some(current.insert(Header {
                        key: name,
                        value: Some(text.as_bytes()),
                    }));
                }
            }
            self.send(key.as_deref().map(str::as_bytes), value, owned)?;
        }
        Ok(())
    }

    fn write_ipc(&self, batch: &RecordBatch) -> DataflowResult<()> {
        let options = FormatOptions::default();
        let key = match &self.config.key {
            Some(name) => Rendered::new(self.column(batch, name, "key")?, &options)?.get(0),
            None => None,
        };
        let bytes = riffle_dataflow::batch::to_ipc_bytes(batch)?;
        self.send(key.as_deref().map(str::as_bytes), &bytes, None)
    }
}

/// A column's values as strings (nulls as `None`).
struct Rendered<'a> {
    array: &'a dyn Array,
    formatter: ArrayFormatter<'a>,
}

impl<'a> Rendered<'a> {
    fn new(array: &'a dyn Array, options: &'a FormatOptions<'a>) -> DataflowResult<Self> {
        Ok(Rendered {
            array,
            formatter: ArrayFormatter::try_new(array, options)?,
        })
    }

    fn get(&self, row: usize) -> Option<String> {
        if self.array.is_null(row) {
            return None;
        }
        Some(self.formatter.value(row).to_string())
    }
}

impl Sink for KafkaSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        // Serve delivery reports so that an earlier failure stops the run here.
        self.producer().poll(Duration::ZERO);
        self.check_deliveries()?;
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.write_rows(batch)?;
        self.producer().poll(Duration::ZERO);
        self.check_deliveries()
    }

    /// Called as epochs complete: serves delivery reports and surfaces failures without
    /// waiting for the broker, so worker 0 keeps running the model meanwhile.
    fn flush(&mut self) -> DataflowResult<()> {
        self.producer().poll(Duration::ZERO);
        self.check_deliveries()
    }

    fn position(&self) -> Option<u64> {
        Some(lock(&self.state.sequence).next)
    }

    /// Transactions need no acknowledged position: the commit waits for every delivery.
    fn durable(&self) -> Option<Arc<AtomicU64>> {
        match self.writer {
            Writer::Plain(_) => Some(self.state.durable.clone()),
            Writer::Transactional(_) => None,
        }
    }

    fn begin_epoch(&mut self, generation: u64, epoch: riffle_dataflow::Epoch) {
        match &self.writer {
            Writer::Transactional(t) => t.enter_epoch(epoch),
            Writer::Plain(_) if self.markers => {
                self.stamp = Some((generation.to_string(), epoch.to_string()));
            }
            Writer::Plain(_) => {}
        }
    }

    /// End of the run: waits for every delivery report (a transaction commits with the last
    /// checkpoint).
    fn finish(&mut self) -> DataflowResult<()> {
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        let flushed = drain(self.producer(), timeout);
        self.check_deliveries()?;
        if flushed {
            return Ok(());
        }
        Err(sink_error(
            &self.config,
            format!(
                "{} message(s) still undelivered after {} ms",
                self.producer().in_flight_count(),
                self.config.delivery_timeout_ms
            ),
        ))
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Best effort: a run that ends without `flush` still gets its messages out.
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        if !drain(self.producer(), timeout) {
            warn!(
                topic = %self.config.topic,
                "kafka sink: {} message(s) undelivered at shutdown",
                self.producer().in_flight_count()
            );
        }
        if let Err(e) = self.check_deliveries() {
            warn!(topic = %self.config.topic, "{e}");
        }
    }
}
