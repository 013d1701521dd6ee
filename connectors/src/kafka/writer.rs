//! The Kafka sink's writer: one JSON, Avro or Protobuf message per row or one Arrow IPC message
//! per batch, with the key and headers from columns. A message Kafka fails to deliver fails the next write or
//! the flush: deliveries are never dropped silently.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use riffle_dataflow::sink::Sink;
use riffle_dataflow::DataflowResult;
use tracing::warn;

use super::client::{creation_error, drain, sink_producer_config};
use super::config::{KafkaSinkConfig, SinkFormat};
use super::delivery::{delivery_context, DeliveryContext, DeliveryState};
use super::markers::{EPOCH_HEADER, GENERATION_HEADER};
use super::transactions::Transaction;
use crate::formats::value::ValueEncoder;

/// Wait between polls while librdkafka's queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(50);

/// A sink's producer: its own, or the transactional one it shares with the committer.
enum Writer {
    Plain(BaseProducer<DeliveryContext>),
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
    /// Avro/Protobuf values: made (and the schema registered) with the first batch, when the
    /// results' columns are known; again if they change.
    encoder: Option<(arrow_schema::SchemaRef, ValueEncoder)>,
    /// `finish` failed (a delivery failed, or it waited out the delivery timeout): dropping
    /// the sink waits no second time.
    gave_up: bool,
}

impl KafkaSink {
    pub(super) fn open(config: &KafkaSinkConfig, markers: bool) -> DataflowResult<Self> {
        let (context, state) = delivery_context(config)?;
        let producer = sink_producer_config(config)
            .create_with_context(context)
            .map_err(|e| {
                config.config_error(format!(
                    "creating a producer: {}",
                    creation_error(&config.options, &e)
                ))
            })?;
        Ok(KafkaSink {
            config: config.clone(),
            writer: Writer::Plain(producer),
            state,
            markers,
            stamp: None,
            encoder: None,
            gave_up: false,
        })
    }

    pub(super) fn transactional(
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
            encoder: None,
            gave_up: false,
        })
    }

    fn producer(&self) -> &BaseProducer<DeliveryContext> {
        match &self.writer {
            Writer::Plain(p) => p,
            Writer::Transactional(t) => &t.producer,
        }
    }

    /// Encodes and sends one batch.
    fn write_rows(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match self.config.format {
            SinkFormat::Json => self.write_json(batch),
            SinkFormat::Ipc => self.write_ipc(batch),
            SinkFormat::Avro | SinkFormat::Protobuf => self.write_schemaful(batch),
        }
    }

    /// One Avro or Protobuf message per row, framed with the registered schema's id.
    fn write_schemaful(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let Some(format) = self.config.format.schemaful() else {
            return Ok(());
        };
        let schema = batch.schema();
        let mut encoder = match self.encoder.take() {
            Some((s, e)) if s == schema => e,
            _ => self
                .config
                .schema_settings()
                .encoder(format, &schema)
                .map_err(|e| self.config.config_error(e))?,
        };
        let payloads = encoder.encode(batch);
        self.encoder = Some((schema, encoder));
        let payloads = payloads.map_err(|e| self.config.sink_error(e))?;
        self.send_rows(batch, payloads.iter().map(|p| p.as_ref()))
    }

    /// The error of any failed delivery so far.
    fn check_deliveries(&self) -> DataflowResult<()> {
        let Some((failed, first)) = self.state.failures() else {
            return Ok(());
        };
        Err(self.config.sink_error(format!(
            "{failed} message(s) not delivered; first error: {first}"
        )))
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
                    return Err(self.config.sink_error(format!("producing a message: {e}")))
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
                self.config.config_error(format!(
                    "{role} column `{name}` is not in the results (columns: {columns:?})"
                ))
            })
    }

    fn write_json(&self, batch: &RecordBatch) -> DataflowResult<()> {
        let lines = crate::lines::json_lines(batch).map_err(|e| {
            self.config
                .sink_error(format!("encoding rows as JSON: {e}"))
        })?;
        let rows: Vec<&[u8]> = lines
            .split(|&b| b == b'\n')
            .take(batch.num_rows())
            .collect();
        if rows.len() != batch.num_rows() {
            return Err(self.config.sink_error(format!(
                "JSON encoding gave {} lines for {} rows",
                rows.len(),
                batch.num_rows()
            )));
        }
        self.send_rows(batch, rows.into_iter())
    }

    /// Sends one message per row of `batch`, with the values given and the key and headers
    /// from its columns.
    fn send_rows<'v>(
        &self,
        batch: &RecordBatch,
        values: impl Iterator<Item = &'v [u8]>,
    ) -> DataflowResult<()> {
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
        for (row, value) in values.enumerate() {
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
        Some(self.state.produced())
    }

    /// Transactions need no acknowledged position: the commit waits for every delivery.
    fn durable(&self) -> Option<Arc<AtomicU64>> {
        match self.writer {
            Writer::Plain(_) => Some(self.state.durable()),
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
        self.gave_up = true;
        self.check_deliveries()?;
        if flushed {
            self.gave_up = false;
            return Ok(());
        }
        let cause = self
            .state
            .client_error()
            .map_or(String::new(), |c| format!("; the client reported: {c}"));
        Err(self.config.sink_error(format!(
            "{} message(s) still undelivered after {} ms (delivery_timeout_ms){cause}",
            self.producer().in_flight_count(),
            self.config.delivery_timeout_ms
        )))
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // A failed run's results are not covered by its checkpoints: waiting again for them
        // would only delay the failure.
        if self.gave_up || self.state.failures().is_some() {
            return;
        }
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
