//! Reading a results topic exactly once: what a downstream consumer applies to the messages
//! of each partition, in offset order, to see every result of an exactly-once run once.
//!
//! The sink stamps results with `riffle.generation` and `riffle.epoch`; after a checkpoint it
//! writes `riffle.commit: G:E` to every partition (generation `G` is final up to epoch `E`), and
//! a restarted run writes `riffle.fence: G'` (results of generations before `G'` that are not
//! committed yet are void: the new run produces them again). Messages without these headers
//! (runs without checkpoints, other producers) pass straight through.
//!
//! [`Committed`] is the view itself; [`read_to_end`] reads a whole topic through it
//! (`riffle consume`).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::{Offset, TopicPartitionList};
use riffle_dataflow::{DataflowError, DataflowResult, Epoch};

use super::client::{client_config, ReadsToEnd, Role};
use super::markers::{COMMIT_HEADER, EPOCH_HEADER, FENCE_HEADER, GENERATION_HEADER};
use super::topics::kafka_error;

/// What one message is, from its headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// Not from an exactly-once run: deliver as is.
    Plain,
    Result {
        generation: u64,
        epoch: Epoch,
    },
    Commit {
        generation: u64,
        through: Epoch,
    },
    Fence {
        generation: u64,
    },
}

impl Message {
    /// Classifies a message by its headers (name, value).
    pub fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Message {
        let mut generation = None;
        let mut epoch = None;
        for (key, value) in headers {
            let text = std::str::from_utf8(value).unwrap_or_default();
            match key {
                GENERATION_HEADER => generation = text.parse().ok(),
                EPOCH_HEADER => epoch = text.parse().ok(),
                COMMIT_HEADER => {
                    if let Some((g, e)) = text.split_once(':') {
                        if let (Ok(generation), Ok(through)) = (g.parse(), e.parse()) {
                            return Message::Commit {
                                generation,
                                through,
                            };
                        }
                    }
                }
                FENCE_HEADER => {
                    if let Ok(generation) = text.parse() {
                        return Message::Fence { generation };
                    }
                }
                _ => {}
            }
        }
        match (generation, epoch) {
            (Some(generation), Some(epoch)) => Message::Result { generation, epoch },
            _ => Message::Plain,
        }
    }
}

#[derive(Debug)]
struct Partition<T> {
    /// Generations below this are fenced: their uncommitted results are void.
    fenced_below: u64,
    /// Per generation: how far it is committed, and its results waiting for a commit.
    committed: HashMap<u64, Epoch>,
    waiting: BTreeMap<u64, Vec<(Epoch, T)>>,
}

impl<T> Default for Partition<T> {
    fn default() -> Self {
        Partition {
            fenced_below: 0,
            committed: HashMap::new(),
            waiting: BTreeMap::new(),
        }
    }
}

/// The committed view of a results topic, fed message by message.
///
/// # Examples
/// ```
/// use riffle_connectors::kafka::committed::{Committed, Message};
///
/// let mut view = Committed::default();
/// let result = |epoch| Message::Result { generation: 1, epoch };
/// assert!(view.push(0, result(0), "a").is_empty());
/// assert!(view.push(0, result(1), "b").is_empty());
/// // The run checkpointed epoch 0, then died; its restart fences generation 1 and redoes epoch 1.
/// assert_eq!(view.push(0, Message::Commit { generation: 1, through: 0 }, "") , vec!["a"]);
/// assert!(view.push(0, Message::Fence { generation: 2 }, "").is_empty());
/// assert!(view.push(0, Message::Result { generation: 2, epoch: 1 }, "b").is_empty());
/// assert_eq!(view.push(0, Message::Commit { generation: 2, through: 1 }, ""), vec!["b"]);
/// ```
#[derive(Debug)]
pub struct Committed<T> {
    partitions: HashMap<i32, Partition<T>>,
}

impl<T> Default for Committed<T> {
    fn default() -> Self {
        Committed {
            partitions: HashMap::new(),
        }
    }
}

impl<T> Committed<T> {
    /// Takes the next message of `partition` (in offset order) and returns the results it
    /// makes visible, in order.
    pub fn push(&mut self, partition: i32, message: Message, item: T) -> Vec<T> {
        let p = self.partitions.entry(partition).or_default();
        match message {
            Message::Plain => vec![item],
            Message::Result { generation, epoch } => {
                if generation < p.fenced_below {
                    // A zombie of a fenced run: its work is being redone.
                    return Vec::new();
                }
                if p.committed.get(&generation).is_some_and(|c| epoch <= *c) {
                    return vec![item];
                }
                p.waiting.entry(generation).or_default().push((epoch, item));
                Vec::new()
            }
            Message::Commit {
                generation,
                through,
            } => {
                let c = p.committed.entry(generation).or_insert(through);
                *c = (*c).max(through);
                let Some(waiting) = p.waiting.get_mut(&generation) else {
                    return Vec::new();
                };
                let (ready, rest): (Vec<_>, Vec<_>) =
                    waiting.drain(..).partition(|(e, _)| *e <= through);
                *waiting = rest;
                ready.into_iter().map(|(_, item)| item).collect()
            }
            Message::Fence { generation } => {
                p.fenced_below = p.fenced_below.max(generation);
                let fenced_below = p.fenced_below;
                p.waiting.retain(|g, _| *g >= fenced_below);
                Vec::new()
            }
        }
    }

    /// Results seen but not (yet) committed.
    pub fn uncommitted(&self) -> usize {
        self.partitions
            .values()
            .flat_map(|p| p.waiting.values())
            .map(Vec::len)
            .sum()
    }
}

/// What [`read_to_end`] read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadSummary {
    /// Messages read, markers included.
    pub messages: u64,
    /// Values passed on.
    pub shown: u64,
    /// Results seen but never committed, held back (0 when reading raw).
    pub uncommitted: usize,
}

/// Longest wait for metadata and watermarks.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Reading gives up after this long without a message or an end of partition.
const STALL_LIMIT: Duration = Duration::from_secs(120);

/// Reads every partition of `topic` from the beginning to the end it has now, and passes each
/// visible value to `show`, in order per partition: through the committed view, or with `raw`
/// every message but the commit and fence markers. `options` are librdkafka consumer options,
/// applied over Riffle's.
pub fn read_to_end(
    brokers: &str,
    options: &BTreeMap<String, String>,
    topic: &str,
    raw: bool,
    mut show: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> DataflowResult<ReadSummary> {
    let consumer: BaseConsumer<ReadsToEnd> = client_config(brokers, options, Role::ResultsReader)
        .create_with_context(ReadsToEnd)
        .map_err(|e| kafka_error(brokers, topic, e))?;
    let ends = assign_from_start(&consumer, brokers, topic)?;
    let mut pass = ReadPass::new(ends, raw);
    while pass.unfinished() {
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            pass.check_stall(topic)?;
            continue;
        };
        match message {
            Ok(m) => pass.take(&m, &mut show)?,
            // The broker says a partition ends here (its high watermark may be read differently
            // by list-offsets and fetch): take that as its end.
            Err(KafkaError::PartitionEOF(p)) => pass.ended(p),
            // Transient (a broker restarting): librdkafka retries itself.
            Err(e) => tracing::warn!("consume: {e}"),
        }
    }
    Ok(pass.finish())
}

/// Assigns every partition of `topic` from its beginning, and returns the end each has now.
fn assign_from_start(
    consumer: &BaseConsumer<ReadsToEnd>,
    brokers: &str,
    topic: &str,
) -> DataflowResult<BTreeMap<i32, i64>> {
    let error = |e| kafka_error(brokers, topic, e);
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(error)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(DataflowError::Config(format!(
            "topic `{topic}` has no partitions on {brokers}"
        )));
    }
    let mut ends = BTreeMap::new();
    let mut list = TopicPartitionList::new();
    for p in &partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, *p, METADATA_TIMEOUT)
            .map_err(error)?;
        ends.insert(*p, high);
        list.add_partition_offset(topic, *p, Offset::Beginning)
            .map_err(error)?;
    }
    consumer.assign(&list).map_err(error)?;
    Ok(ends)
}

/// Where one [`read_to_end`] stands: each partition's next offset against its end, and what
/// was shown.
struct ReadPass {
    ends: BTreeMap<i32, i64>,
    next: BTreeMap<i32, i64>,
    raw: bool,
    view: Committed<Vec<u8>>,
    summary: ReadSummary,
    last_progress: Instant,
}

impl ReadPass {
    fn new(ends: BTreeMap<i32, i64>, raw: bool) -> Self {
        ReadPass {
            next: ends.keys().map(|p| (*p, 0)).collect(),
            ends,
            raw,
            view: Committed::default(),
            summary: ReadSummary::default(),
            last_progress: Instant::now(),
        }
    }

    fn unfinished(&self) -> bool {
        self.next
            .iter()
            .any(|(p, n)| self.ends.get(p).is_some_and(|end| n < end))
    }

    /// Fails when nothing came for [`STALL_LIMIT`].
    fn check_stall(&self, topic: &str) -> DataflowResult<()> {
        if self.last_progress.elapsed() > STALL_LIMIT {
            let (next, ends) = (&self.next, &self.ends);
            return Err(DataflowError::stage(
                "consume",
                format!(
                    "no progress for {} s reading `{topic}`: at {next:?} of {ends:?}",
                    STALL_LIMIT.as_secs()
                ),
            ));
        }
        Ok(())
    }

    /// Partition `p` ends where the pass meant to stop.
    fn ended(&mut self, p: i32) {
        if let Some(end) = self.ends.get(&p).copied() {
            self.next.insert(p, end);
        }
        self.last_progress = Instant::now();
    }

    /// Takes one message and shows the values it makes visible.
    fn take(
        &mut self,
        message: &BorrowedMessage<'_>,
        show: &mut impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> DataflowResult<()> {
        self.last_progress = Instant::now();
        self.next.insert(message.partition(), message.offset() + 1);
        self.summary.messages += 1;
        let kind = message.headers().map_or(Message::Plain, |h| {
            Message::from_headers(h.iter().map(|h| (h.key, h.value.unwrap_or_default())))
        });
        let payload = message.payload().unwrap_or_default().to_vec();
        let visible = if self.raw {
            match kind {
                Message::Commit { .. } | Message::Fence { .. } => Vec::new(),
                _ => vec![payload],
            }
        } else {
            self.view.push(message.partition(), kind, payload)
        };
        for value in visible {
            show(&value).map_err(|e| DataflowError::io("writing a result", e))?;
            self.summary.shown += 1;
        }
        Ok(())
    }

    fn finish(mut self) -> ReadSummary {
        self.summary.uncommitted = self.view.uncommitted();
        self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_messages_pass_and_uncommitted_results_wait() {
        let mut view = Committed::default();
        assert_eq!(view.push(0, Message::Plain, 1), vec![1]);
        let r = |epoch| Message::Result {
            generation: 5,
            epoch,
        };
        assert!(view.push(0, r(0), 2).is_empty());
        assert!(view.push(1, r(0), 3).is_empty());
        assert_eq!(view.uncommitted(), 2);
        // Markers are per partition.
        let commit = Message::Commit {
            generation: 5,
            through: 0,
        };
        assert_eq!(view.push(1, commit, 0), vec![3]);
        assert_eq!(view.uncommitted(), 1);
    }

    #[test]
    fn a_fence_voids_uncommitted_results_and_later_zombie_writes() {
        let mut view = Committed::default();
        let r = |generation, epoch| Message::Result { generation, epoch };
        assert!(view.push(0, r(1, 0), "kept").is_empty());
        assert!(view.push(0, r(1, 1), "redone").is_empty());
        let commit = |generation, through| Message::Commit {
            generation,
            through,
        };
        assert_eq!(view.push(0, commit(1, 0), ""), vec!["kept"]);
        assert!(view
            .push(0, Message::Fence { generation: 2 }, "")
            .is_empty());
        assert!(view.push(0, r(1, 2), "zombie").is_empty());
        assert!(view.push(0, r(2, 1), "again").is_empty());
        assert_eq!(view.push(0, commit(2, 5), ""), vec!["again"]);
        assert_eq!(view.uncommitted(), 0);
    }

    #[test]
    fn headers_classify_messages() {
        let m = |h: &[(&'static str, &'static str)]| {
            Message::from_headers(h.iter().map(|(k, v)| (*k, v.as_bytes())))
        };
        assert_eq!(m(&[]), Message::Plain);
        assert_eq!(
            m(&[("riffle.generation", "7"), ("riffle.epoch", "3")]),
            Message::Result {
                generation: 7,
                epoch: 3
            }
        );
        assert_eq!(
            m(&[("riffle.commit", "7:3")]),
            Message::Commit {
                generation: 7,
                through: 3
            }
        );
        assert_eq!(
            m(&[("riffle.fence", "8")]),
            Message::Fence { generation: 8 }
        );
        assert_eq!(m(&[("riffle.commit", "junk")]), Message::Plain);
    }
}
