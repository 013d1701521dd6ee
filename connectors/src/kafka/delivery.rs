//! What librdkafka reports of a sink's deliveries: which messages the brokers acknowledged
//! (a checkpoint waits for them), the first failure, and the sink's metrics. Shared by the
//! plain writer and the transactional producer.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus::IntCounter;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use riffle_dataflow::DataflowResult;

use super::client::Diagnosed;
use super::config::KafkaSinkConfig;
use super::metrics::kafka_metrics;

/// The delivery number (opaque) of a transaction's commit record: not a result, so not
/// counted as one.
pub(super) const COMMIT_RECORD: usize = usize::MAX;

/// Delivery outcomes, written by librdkafka's callbacks and read by the sink.
#[derive(Default)]
pub(super) struct DeliveryState {
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// Messages numbered in the order they were produced, and those not yet acknowledged.
    sequence: Mutex<Sequence>,
    /// Every message numbered below this is acknowledged by the broker.
    durable: Arc<AtomicU64>,
    /// The client's own errors (authentication, TLS, unreachable brokers): what a delivery
    /// timeout names as its likely cause.
    pub(super) client: Diagnosed,
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

    /// Messages numbered so far.
    pub(super) fn produced(&self) -> u64 {
        lock(&self.sequence).next
    }

    /// Every message numbered below its value is acknowledged by the broker.
    pub(super) fn durable(&self) -> Arc<AtomicU64> {
        self.durable.clone()
    }

    /// What the client reported while messages waited, if it reported anything: the likely
    /// cause of a delivery timeout.
    pub(super) fn client_error(&self) -> Option<String> {
        self.client
            .first()
            .map(|_| self.client.explain(&"no client error"))
    }

    /// How many deliveries failed and the first failure's error, if any did.
    pub(super) fn failures(&self) -> Option<(u64, String)> {
        let failed = self.failed.load(Ordering::Relaxed);
        (failed > 0).then(|| (failed, lock(&self.first_error).clone().unwrap_or_default()))
    }

    fn acknowledged(&self, n: u64) {
        let mut s = lock(&self.sequence);
        s.outstanding.remove(&n);
        let durable = s.outstanding.first().copied().unwrap_or(s.next);
        self.durable.store(durable, Ordering::Release);
    }
}

pub(super) struct DeliveryContext {
    pub(super) state: Arc<DeliveryState>,
    records_out: IntCounter,
    bytes_out: IntCounter,
    produce_errors: IntCounter,
}

impl ClientContext for DeliveryContext {
    // Logged as rdkafka's default context does; the first error is also kept for the sink's
    // messages.
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.state.client.log(level, facility, message);
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::error!("librdkafka: {error}: {reason}");
        self.state.client.error(error, reason);
    }
}

impl ProducerContext for DeliveryContext {
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
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The context of a sink's producer: its delivery state and metrics.
pub(super) fn delivery_context(
    config: &KafkaSinkConfig,
) -> DataflowResult<(DeliveryContext, Arc<DeliveryState>)> {
    let m = kafka_metrics()?;
    let topic = [config.topic.as_str()];
    let state = Arc::new(DeliveryState::default());
    let context = DeliveryContext {
        state: state.clone(),
        records_out: m.records_out.with_label_values(&topic),
        bytes_out: m.bytes_out.with_label_values(&topic),
        produce_errors: m.produce_errors.with_label_values(&topic),
    };
    Ok((context, state))
}
