//! Kafka sink: an idempotent producer (`acks=all`) writing one JSON message per row or one
//! Arrow IPC message per batch. A message Kafka fails to deliver fails the next write or the
//! flush: deliveries are never dropped silently.

use std::collections::BTreeSet;
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
use riffle_dataflow::sink::{Committer, Sink, SinkFactory};
use riffle_dataflow::{DataflowError, DataflowResult};
use tracing::warn;

use super::client::Role;
use super::config::{KafkaSinkConfig, SinkFormat};
use super::metrics::{self, kafka_metrics};

/// Wait between polls while librdkafka's queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(50);

/// A configured Kafka sink; each `open` creates its own producer.
#[derive(Debug)]
pub struct KafkaSinkFactory {
    config: KafkaSinkConfig,
}

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
        })
    }
}

impl SinkFactory for KafkaSinkFactory {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        // Brokers differ on auto-creating topics; create ours explicitly, at run time only.
        if self.config.create_topic {
            super::replay::ensure_topic(
                &self.config.brokers,
                &self.config.topic,
                self.config.partitions,
            )?;
        }
        Ok(Box::new(KafkaSink::open(&self.config)?))
    }

    fn attach_metrics(&self, metrics: &Metrics) -> DataflowResult<()> {
        metrics::attach(metrics)
    }

    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        Ok(Some(Box::new(MarkerWriter::open(&self.config)?)))
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
        self.producer
            .flush(Duration::from_millis(self.config.delivery_timeout_ms))
            .map_err(|e| sink_error(&self.config, format!("writing {header} markers: {e}")))
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
struct DeliveryState {
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
    fn number(&self) -> u64 {
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

struct SinkContext {
    state: Arc<DeliveryState>,
    records_out: IntCounter,
    bytes_out: IntCounter,
    produce_errors: IntCounter,
}

impl ClientContext for SinkContext {}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, n: usize) {
        match result {
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

/// An open Kafka sink. Delivery reports are served whenever it writes or flushes.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    producer: BaseProducer<SinkContext>,
    state: Arc<DeliveryState>,
    /// `(generation, epoch)` headers for the results being written, in exactly-once runs.
    stamp: Option<(String, String)>,
}

impl KafkaSink {
    fn open(config: &KafkaSinkConfig) -> DataflowResult<Self> {
        let m = kafka_metrics()?;
        let topic = [config.topic.as_str()];
        let state = Arc::new(DeliveryState::default());
        let context = SinkContext {
            state: state.clone(),
            records_out: m.records_out.with_label_values(&topic),
            bytes_out: m.bytes_out.with_label_values(&topic),
            produce_errors: m.produce_errors.with_label_values(&topic),
        };
        let producer = client_config(config)
            .create_with_context(context)
            .map_err(|e| config_error(config, format!("creating a producer: {e}")))?;
        Ok(KafkaSink {
            config: config.clone(),
            producer,
            state,
            stamp: None,
        })
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
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    // Backpressure: serve delivery reports until messages leave the queue.
                    record = returned;
                    self.producer.poll(QUEUE_FULL_WAIT);
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
        self.producer.poll(Duration::ZERO);
        self.check_deliveries()?;
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match self.config.format {
            SinkFormat::Json => self.write_json(batch)?,
            SinkFormat::Ipc => self.write_ipc(batch)?,
        }
        self.producer.poll(Duration::ZERO);
        self.check_deliveries()
    }

    /// Called as epochs complete: serves delivery reports and surfaces failures without
    /// waiting for the broker, so worker 0 keeps running the model meanwhile.
    fn flush(&mut self) -> DataflowResult<()> {
        self.producer.poll(Duration::ZERO);
        self.check_deliveries()
    }

    fn position(&self) -> Option<u64> {
        Some(lock(&self.state.sequence).next)
    }

    fn durable(&self) -> Option<Arc<AtomicU64>> {
        Some(self.state.durable.clone())
    }

    fn begin_epoch(&mut self, generation: u64, epoch: riffle_dataflow::Epoch) {
        self.stamp = Some((generation.to_string(), epoch.to_string()));
    }

    /// End of the run: waits for every delivery report.
    fn finish(&mut self) -> DataflowResult<()> {
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        let flushed = self.producer.flush(timeout);
        self.check_deliveries()?;
        flushed.map_err(|e| {
            sink_error(
                &self.config,
                format!(
                    "{} message(s) still undelivered after {} ms: {e}",
                    self.producer.in_flight_count(),
                    self.config.delivery_timeout_ms
                ),
            )
        })
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Best effort: a run that ends without `flush` still gets its messages out.
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        if let Err(e) = self.producer.flush(timeout) {
            warn!(
                topic = %self.config.topic,
                "kafka sink: {} message(s) undelivered at shutdown: {e}",
                self.producer.in_flight_count()
            );
        }
        if let Err(e) = self.check_deliveries() {
            warn!(topic = %self.config.topic, "{e}");
        }
    }
}
