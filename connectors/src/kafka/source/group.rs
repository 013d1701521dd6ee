//! Consumer-group mode (`group_id:`): every worker of every process joins the group and Kafka
//! assigns the topic's partitions, moving them as clusters join and leave (cooperative-sticky,
//! so a rebalance only moves what it must).
//!
//! Offsets are the group's, committed inside the Kafka sink's transactions together with the
//! results they produced (`send_offsets_to_transaction`), so a partition's committed offset is
//! always exactly what its committed output covers. A new owner starts from it (`read_committed`
//! consumers fetch only stable offsets). Handing a partition over without loss or duplicates
//! then needs one rule: the old owner lets it go only once the group's committed offset has
//! reached everything it read. A dedicated thread owns the consumer so that its rebalance
//! callback can wait for that while the worker keeps the dataflow (and its checkpoints)
//! moving.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use riffle_dataflow::{DataflowError, DataflowResult};
use tracing::{info, warn};

use super::messages::Pending;
use super::{read_error, with_fetch_settings, BATCH_VALUE_BYTES, METADATA_TIMEOUT, POLL_SLICE};
use crate::formats::ColumnType;
use crate::kafka::client::{client_config, Role};
use crate::kafka::config::KafkaSourceConfig;

/// Longest a revoked partition waits for its offsets to be committed (Kafka's default
/// rebalance timeout is 5 minutes).
const HANDOVER_WAIT: Duration = Duration::from_secs(240);
/// How often the committed offsets are read while waiting.
const COMMITTED_POLL: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A client of `group` with the source's brokers and options.
fn group_config(config: &KafkaSourceConfig, group: &str) -> rdkafka::ClientConfig {
    client_config(
        &config.brokers,
        &config.options,
        Role::GroupConsumer {
            group,
            start: &config.start,
        },
    )
}

/// A client of the group that never joins it: it reads the group's committed offsets.
fn watcher(config: &KafkaSourceConfig, group: &str) -> DataflowResult<BaseConsumer> {
    group_config(config, group)
        .create()
        .map_err(|e| read_error(config, format!("creating a group client: {e}")))
}

/// The group's committed offsets of `partitions` (stable ones only: a pending transaction's
/// offsets are waited for by the broker).
fn committed(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: impl IntoIterator<Item = i32>,
) -> Result<BTreeMap<i32, i64>, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer.committed_offsets(tpl, METADATA_TIMEOUT)?;
    Ok(got
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// The consumer thread's state, shared with its rebalance callback.
struct GroupContext {
    topic: String,
    header_columns: Vec<(String, ColumnType)>,
    keep_headers_json: bool,
    max_message_bytes: usize,
    /// The batch being filled, handed to the worker when full, late, or before a revoke.
    current: Mutex<Pending>,
    sender: SyncSender<Pending>,
    /// Per partition, the next offset after the messages handed to the worker.
    handed: Mutex<HashMap<i32, i64>>,
    watcher: BaseConsumer,
    stop: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<String>>>,
}

impl ClientContext for GroupContext {
    fn error(&self, error: KafkaError, reason: &str) {
        warn!(topic = %self.topic, "kafka group consumer: {error}: {reason}");
        // Retrying cannot fetch it: the worker fails saying so instead of stalling.
        if super::is_oversized_fetch(reason) {
            lock(&self.failed).get_or_insert_with(|| {
                super::oversized_fetch_error(self.max_message_bytes, reason)
            });
        }
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(topic = %self.topic, "kafka group: assigned partitions {partitions:?}");
            }
            Rebalance::Revoke(tpl) => {
                // What was read so far goes to the worker first, then the partitions wait until
                // the group's offsets cover it.
                self.hand_over();
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(
                    topic = %self.topic,
                    "kafka group: revoked partitions {partitions:?}: handing them over once \
                     their offsets are committed"
                );
                self.wait_for_commits(&partitions);
            }
            Rebalance::Error(e) => warn!(topic = %self.topic, "kafka group: rebalance: {e}"),
        }
    }
}

impl GroupContext {
    /// Sends the batch being filled to the worker (waiting for room), and notes how far each
    /// partition was handed.
    fn hand_over(&self) {
        let pending = std::mem::take(&mut *lock(&self.current));
        if pending.messages.is_empty() {
            return;
        }
        let mut next = HashMap::new();
        for m in &pending.messages {
            let at = next.entry(m.partition).or_insert(m.offset + 1);
            *at = (*at).max(m.offset + 1);
        }
        let mut batch = pending;
        loop {
            match self.sender.try_send(batch) {
                Ok(()) => break,
                Err(TrySendError::Full(b)) => {
                    if self.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    batch = b;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
        let mut handed = lock(&self.handed);
        for (p, n) in next {
            let at = handed.entry(p).or_insert(n);
            *at = (*at).max(n);
        }
    }

    fn wait_for_commits(&self, partitions: &[i32]) {
        let mut waiting: BTreeMap<i32, i64> = {
            let mut handed = lock(&self.handed);
            partitions
                .iter()
                .filter_map(|p| handed.remove(p).map(|n| (*p, n)))
                .collect()
        };
        let started = Instant::now();
        while !waiting.is_empty() && !self.stop.load(Ordering::Relaxed) {
            match committed(&self.watcher, &self.topic, waiting.keys().copied()) {
                Ok(done) => waiting.retain(|p, n| done.get(p).is_none_or(|c| c < n)),
                Err(e) => warn!(topic = %self.topic, "kafka group: reading committed offsets: {e}"),
            }
            if waiting.is_empty() {
                break;
            }
            if started.elapsed() > HANDOVER_WAIT {
                let message = format!(
                    "partitions {waiting:?} were revoked but their offsets were not committed \
                     within {} s (checkpoints stalled?)",
                    HANDOVER_WAIT.as_secs()
                );
                lock(&self.failed).get_or_insert(message);
                return;
            }
            std::thread::sleep(COMMITTED_POLL);
        }
        info!(topic = %self.topic, "kafka group: handed over partitions {partitions:?}");
    }
}

/// A worker's share of the group: batches from the consumer thread.
pub(super) struct Feed {
    receiver: Receiver<Pending>,
    stop: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
    /// With `stop_at_end`: where each partition of the topic ends, and a client to read the
    /// group's committed offsets.
    ends: Option<(BTreeMap<i32, i64>, BaseConsumer)>,
    last_check: Instant,
    topic: String,
}

impl Feed {
    pub(super) fn start(
        config: &KafkaSourceConfig,
        group: &str,
        partitions: &[i32],
        header_columns: Vec<(String, ColumnType)>,
        keep_headers_json: bool,
        linger: Duration,
    ) -> DataflowResult<Feed> {
        let (sender, receiver) = sync_channel(2);
        let stop = Arc::new(AtomicBool::new(false));
        let failed: Arc<Mutex<Option<String>>> = Arc::default();
        let ends = if config.stop_at_end {
            let reader = watcher(config, group)?;
            let mut ends = BTreeMap::new();
            for &p in partitions {
                let (_, high) = reader
                    .fetch_watermarks(&config.topic, p, METADATA_TIMEOUT)
                    .map_err(|e| read_error(config, format!("partition {p}'s end: {e}")))?;
                ends.insert(p, high);
            }
            Some((ends, reader))
        } else {
            None
        };
        let context = GroupContext {
            topic: config.topic.clone(),
            header_columns,
            keep_headers_json,
            max_message_bytes: config.max_message_bytes,
            current: Mutex::default(),
            sender,
            handed: Mutex::default(),
            watcher: watcher(config, group)?,
            stop: stop.clone(),
            failed: failed.clone(),
        };
        let consumer: BaseConsumer<GroupContext> =
            with_fetch_settings(config, group_config(config, group))
                .create_with_context(context)
                .map_err(|e| read_error(config, format!("creating a group consumer: {e}")))?;
        consumer
            .subscribe(&[&config.topic])
            .map_err(|e| read_error(config, format!("joining group `{group}`: {e}")))?;
        let batch_size = config.batch_size;
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kafka-group".into())
            .spawn(move || consume(consumer, batch_size, linger, thread_stop))
            .map_err(|e| DataflowError::io("starting the group consumer thread", e))?;
        Ok(Feed {
            receiver,
            stop,
            failed,
            thread: Some(thread),
            ends,
            last_check: Instant::now(),
            topic: config.topic.clone(),
        })
    }

    /// The next batch of messages; `Ok(None)` while none came within `wait`.
    pub(super) fn next(&mut self, wait: Duration) -> Result<Option<Pending>, String> {
        if let Some(why) = lock(&self.failed).clone() {
            return Err(why);
        }
        match self.receiver.recv_timeout(wait) {
            Ok(p) => Ok(Some(p)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(lock(&self.failed)
                .clone()
                .unwrap_or_else(|| "the group consumer stopped".into())),
        }
    }

    /// With `stop_at_end`: whether the group has committed every partition of the topic up to
    /// its end (read at most twice a second). The run's own checkpoints commit its share, so
    /// the clusters of a group end together once the whole topic is done.
    pub(super) fn finished(&mut self) -> bool {
        let Some((ends, reader)) = &self.ends else {
            return false;
        };
        if self.last_check.elapsed() < Duration::from_millis(500) {
            return false;
        }
        self.last_check = Instant::now();
        match committed(reader, &self.topic, ends.keys().copied()) {
            Ok(done) => ends
                .iter()
                .all(|(p, end)| *end == 0 || done.get(p).is_some_and(|c| c >= end)),
            Err(e) => {
                warn!(topic = %self.topic, "kafka group: reading committed offsets: {e}");
                false
            }
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Unblocks a consumer waiting for room.
        while self.receiver.try_recv().is_ok() {}
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The consumer thread: fills batches and hands them over until told to stop.
fn consume(
    consumer: BaseConsumer<GroupContext>,
    batch_size: usize,
    linger: Duration,
    stop: Arc<AtomicBool>,
) {
    let context = consumer.context().clone();
    let mut deadline = Instant::now() + linger;
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(POLL_SLICE) {
            None => {}
            Some(Ok(message)) => {
                let mut current = lock(&context.current);
                current.push(
                    &message,
                    &context.header_columns,
                    context.keep_headers_json,
                    true,
                    context.max_message_bytes,
                );
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => warn!(topic = %context.topic, "kafka group consumer: {e}"),
        }
        let full = {
            let current = lock(&context.current);
            current.messages.len() >= batch_size || current.values.len() >= BATCH_VALUE_BYTES
        };
        if full || Instant::now() >= deadline {
            context.hand_over();
            deadline = Instant::now() + linger;
        }
    }
    // Leaving the group revokes what is held; the callback returns at once on `stop`.
    consumer.unsubscribe();
}
