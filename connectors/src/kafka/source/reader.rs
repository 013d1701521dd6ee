//! One worker's share of the topic: its consumer, the state of each of its partitions, and
//! the loop that fills a batch.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use prometheus::{IntCounter, IntGauge};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use riffle_dataflow::{DataflowResult, Source, SourceBatch, SourcePosition};
use serde_json::Value;
use tracing::{debug, warn};

use super::assignment::{start_offsets, watermarks};
use super::group::Feed;
use super::messages::{Layout, Pending};
use super::{consumer_config, read_error, KafkaSourceFactory, BATCH_VALUE_BYTES, POLL_SLICE};
use crate::kafka::config::KafkaSourceConfig;
use crate::kafka::metrics::{kafka_metrics, KafkaMetrics};

/// Keeps the high watermarks that librdkafka reports in its statistics.
struct SourceContext {
    topic: String,
    high_watermarks: Mutex<HashMap<i32, i64>>,
    /// A fetch too large to receive: retrying cannot help, so the next batch fails with it.
    oversized_fetch: Mutex<Option<String>>,
}

impl ClientContext for SourceContext {
    // The end of a partition is expected (`stop_at_end`) and comes through `poll` too; other
    // client errors are transient and retried by librdkafka.
    fn error(&self, error: KafkaError, reason: &str) {
        if !crate::kafka::client::is_partition_eof(&error) {
            warn!(topic = %self.topic, "kafka source: {error}: {reason}");
        }
        if super::is_oversized_fetch(reason) {
            lock(&self.oversized_fetch).get_or_insert_with(|| reason.to_string());
        }
    }

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
pub(super) struct KafkaReader {
    pub(super) config: KafkaSourceConfig,
    /// `None` when this worker has no partitions (more workers than partitions).
    consumer: Option<BaseConsumer<SourceContext>>,
    /// How its messages become batches.
    layout: Layout,
    linger: Duration,
    partitions: BTreeMap<i32, PartitionState>,
    records_in: IntCounter,
    bytes_in: IntCounter,
    /// When pacing: the first read, and the messages read since.
    paced: Option<crate::pace::Pacer>,
    /// When the last advisory commit was sent.
    advised: Option<Instant>,
    /// Value bytes of the last batch.
    last_bytes: usize,
    /// Consumer-group mode: batches from the group consumer's thread.
    feed: Option<Feed>,
}

impl KafkaReader {
    pub(super) fn open(factory: &KafkaSourceFactory, mine: &[i32]) -> DataflowResult<Self> {
        let config = &factory.config;
        let m = kafka_metrics()?;
        let mut reader = Self::unconnected(factory, m);
        if let Some(group) = &config.group_id {
            reader.feed = Some(Feed::start(
                config,
                group,
                &factory.partitions,
                reader.layout.header_columns.clone(),
                reader.layout.decoder.is_none(),
                reader.linger,
            )?);
            return Ok(reader);
        }
        if mine.is_empty() {
            return Ok(reader);
        }
        let context = SourceContext {
            topic: config.topic.clone(),
            high_watermarks: Mutex::new(HashMap::new()),
            oversized_fetch: Mutex::new(None),
        };
        // The statistics carry each partition's high watermark: consumer lag for free.
        let consumer: BaseConsumer<SourceContext> =
            consumer_config(config, config.stop_at_end, true)
                .create_with_context(context)
                .map_err(|e| read_error(config, format!("creating a consumer: {e}")))?;
        reader.assign_partitions(&consumer, mine, m)?;
        reader.consumer = Some(consumer);
        Ok(reader)
    }

    /// A reader with no consumer nor partitions yet.
    fn unconnected(factory: &KafkaSourceFactory, m: &KafkaMetrics) -> Self {
        let config = &factory.config;
        KafkaReader {
            config: config.clone(),
            consumer: None,
            layout: Layout {
                topic: config.topic.clone(),
                max_message_bytes: config.max_message_bytes,
                key: config.key.is_some(),
                decoder: factory.decoder.clone(),
                schema: factory.schema.clone(),
                header_columns: config
                    .header_columns
                    .iter()
                    .map(|(name, t)| (name.clone(), *t))
                    .collect(),
            },
            linger: Duration::from_millis(config.linger_ms),
            partitions: BTreeMap::new(),
            records_in: m.records_in.with_label_values(&[config.topic.as_str()]),
            bytes_in: m.bytes_in.with_label_values(&[config.topic.as_str()]),
            paced: config.max_records_per_second.map(crate::pace::Pacer::new),
            advised: None,
            last_bytes: 0,
            feed: None,
        }
    }

    /// Assigns the partitions `mine` to `consumer` from where each starts; with
    /// `stop_at_end`, those with nothing to read are left out (and finished).
    fn assign_partitions(
        &mut self,
        consumer: &BaseConsumer<SourceContext>,
        mine: &[i32],
        m: &KafkaMetrics,
    ) -> DataflowResult<()> {
        let config = &self.config;
        let mut assignment = TopicPartitionList::new();
        for (p, start) in start_offsets(consumer, config, mine)? {
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
                let (low, high) = watermarks(consumer, config, p)?;
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
            self.partitions.insert(p, state);
        }
        consumer
            .assign(&assignment)
            .map_err(|e| read_error(config, format!("assigning partitions {mine:?}: {e}")))
    }

    fn all_finished(&self) -> bool {
        self.partitions.values().all(|s| s.finished)
    }

    fn empty_batch(&self) -> SourceBatch {
        SourceBatch::new(
            RecordBatch::new_empty(self.layout.schema.clone()),
            Vec::new(),
        )
    }

    /// Polls until a batch is full, the linger time has passed, or (with `stop_at_end`) every
    /// partition is done.
    fn fill(&mut self, consumer: &BaseConsumer<SourceContext>) -> Pending {
        // Sized like the last batch: growing by doubling would copy the values again.
        let mut pending = Pending::with_capacity(self.config.batch_size, self.last_bytes);
        let keep_headers_json = self.layout.decoder.is_none();
        let deadline = Instant::now() + self.linger;
        // Messages already fetched are taken without a timed wait: reading the clock and
        // arming a timeout per message cost more than copying a small one.
        let mut ready = true;
        while pending.messages.len() < self.config.batch_size
            && pending.values.len() < BATCH_VALUE_BYTES
        {
            if self.config.stop_at_end && self.all_finished() {
                break;
            }
            // A steady stream never runs dry: the clock is still read every so often.
            if ready && pending.messages.len() % 256 == 255 && Instant::now() >= deadline {
                break;
            }
            let wait = if ready {
                Duration::ZERO
            } else {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    break;
                }
                remaining.min(POLL_SLICE)
            };
            let polled = consumer.poll(wait);
            ready = polled.is_some();
            match polled {
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
                    pending.push(
                        &message,
                        &self.layout.header_columns,
                        keep_headers_json,
                        self.layout.key,
                        self.config.max_message_bytes,
                    );
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
}

impl KafkaReader {
    /// Advisory bookkeeping after a batch: lag gauges and an asynchronous commit of the next
    /// offsets (for lag tools only; Riffle's checkpoints own the offsets).
    fn after_batch(&mut self, consumer: &BaseConsumer<SourceContext>) {
        let high_watermarks = lock(&consumer.context().high_watermarks).clone();
        for (p, state) in &self.partitions {
            let hw = high_watermarks.get(p).copied().max(state.end);
            if let (Some(hw), Some(next)) = (hw, state.next) {
                state.lag.set((hw - next).max(0));
            }
        }
        // At most once a second: each commit is a request the broker serves, and lag tools
        // sample far less often than batches arrive.
        if self
            .advised
            .is_some_and(|t| t.elapsed() < ADVISORY_COMMIT_EVERY)
        {
            return;
        }
        self.advised = Some(Instant::now());
        let mut commit = TopicPartitionList::new();
        for p in self.partitions.keys() {
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

/// How often the source commits its read position to Kafka for lag tools.
const ADVISORY_COMMIT_EVERY: Duration = Duration::from_secs(1);

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
        if self.feed.is_some() {
            let result = self.next_from_feed();
            self.pace(&result);
            return result;
        }
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
        self.pace(&result);
        result
    }
}

impl KafkaReader {
    /// Replay pace: sleeps until `max_records_per_second` allows what was read.
    fn pace(&mut self, result: &DataflowResult<Option<SourceBatch>>) {
        if let (Some(pacer), Ok(Some(batch))) = (self.paced.as_mut(), result) {
            pacer.admit((batch.records.num_rows() + batch.rejected.len()) as u64);
        }
    }

    fn next_from_feed(&mut self) -> DataflowResult<Option<SourceBatch>> {
        let wait = self.linger.max(Duration::from_millis(10));
        let Some(feed) = self.feed.as_mut() else {
            return Ok(None);
        };
        let pending = match feed.next(wait) {
            Err(why) => return Err(read_error(&self.config, why)),
            Ok(Some(pending)) => pending,
            Ok(None) => {
                if self.config.stop_at_end && feed.finished() {
                    // Stops the consumer thread: the whole topic is committed.
                    self.feed = None;
                    return Ok(None);
                }
                return Ok(Some(self.empty_batch()));
            }
        };
        self.batch_of(pending).map(Some)
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
        if let Some(reason) = lock(&consumer.context().oversized_fetch).clone() {
            return Err(read_error(
                &self.config,
                super::oversized_fetch_error(self.config.max_message_bytes, &reason),
            ));
        }
        let pending = self.fill(consumer);
        self.last_bytes = pending.values.len();
        if pending.messages.is_empty() {
            if self.config.stop_at_end && self.all_finished() {
                return Ok(None);
            }
            return Ok(Some(self.empty_batch()));
        }
        let batch = self.batch_of(pending)?;
        self.after_batch(consumer);
        Ok(Some(batch))
    }

    /// The source batch of `pending`'s messages.
    fn batch_of(&self, mut pending: Pending) -> DataflowResult<SourceBatch> {
        let (values, rows, rejected) = self.layout.decode(&pending)?;
        let records = self.layout.assemble(&mut pending, values, &rows)?;

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
        let batch = SourceBatch {
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
            ready_ns: None,
        };
        Ok(batch)
    }
}
