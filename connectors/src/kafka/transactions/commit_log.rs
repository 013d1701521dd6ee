//! The commit log: which checkpoint the committed output matches.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};
use riffle_dataflow::DataflowResult;

use super::{commit_log_topic, error, Commit};
use crate::kafka::client::{client_config, Diagnosed, Role};
use crate::kafka::config::KafkaSinkConfig;

/// A reader of a sink's commit log, connected. Connecting needs neither settled transactions
/// nor the log itself, so it runs beside `init_transactions` and the log's creation;
/// [`CommitLog::last_commit`] must come after both: it reads the last commit once no
/// transaction is pending (the leader's `init_transactions` resolves one a crash left behind;
/// other processes wait for that, so every process resumes from the same checkpoint).
pub struct CommitLog<'a> {
    config: &'a KafkaSinkConfig,
    id: &'a str,
    committed: BaseConsumer<Diagnosed>,
}

impl<'a> CommitLog<'a> {
    pub fn connect(config: &'a KafkaSinkConfig, id: &'a str) -> DataflowResult<Self> {
        let committed = commit_log_reader(config, id, "read_committed")?;
        // A first request brings the connection up now, so the reads later don't wait for
        // it; its answer (the log may not exist yet) is not used.
        let _ = committed.fetch_metadata(
            Some(&commit_log_topic(&config.topic)),
            Duration::from_millis(config.delivery_timeout_ms),
        );
        Ok(Self {
            config,
            id,
            committed,
        })
    }

    /// The last commit recorded for the sink's transactional id (`None`: no log, or nothing
    /// of this id in it), once no transaction on the log is pending (or an error after `wait`).
    pub fn last_commit(self, wait: Duration) -> DataflowResult<Option<Commit>> {
        let topic = commit_log_topic(&self.config.topic);
        if !self.exists(&topic)? {
            return Ok(None);
        }
        let uncommitted = commit_log_reader(self.config, self.id, "read_uncommitted")?;
        let end = self.settled_end(&uncommitted, &topic, wait)?;
        let (low, _) = self
            .committed
            .fetch_watermarks(&topic, 0, self.timeout())
            .map_err(|e| error(self.config, format!("reading `{topic}`'s start: {e}")))?;
        if low >= end {
            return Ok(None);
        }
        self.read_through(&topic, end)
    }

    /// How long one request to the brokers may take.
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.delivery_timeout_ms)
    }

    /// Whether the log exists (with a partition).
    fn exists(&self, topic: &str) -> DataflowResult<bool> {
        let metadata = self
            .committed
            .fetch_metadata(Some(topic), self.timeout())
            .map_err(|e| error(self.config, format!("reading `{topic}`'s metadata: {e}")))?;
        Ok(metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
    }

    /// The log's end once no transaction on it is pending, as `uncommitted` (a
    /// `read_uncommitted` reader) sees it; an error after `wait`.
    fn settled_end(
        &self,
        uncommitted: &BaseConsumer<Diagnosed>,
        topic: &str,
        wait: Duration,
    ) -> DataflowResult<i64> {
        let (config, timeout) = (self.config, self.timeout());
        let started = Instant::now();
        // With read_committed, the end offset is the last stable offset: it equals the high
        // watermark once no transaction on the log is pending.
        loop {
            let (_, stable) = self
                .committed
                .fetch_watermarks(topic, 0, timeout)
                .map_err(|e| error(config, format!("reading `{topic}`'s end: {e}")))?;
            let (_, high) = uncommitted
                .fetch_watermarks(topic, 0, timeout)
                .map_err(|e| error(config, format!("reading `{topic}`'s end: {e}")))?;
            if stable >= high {
                return Ok(high);
            }
            if started.elapsed() > wait {
                return Err(error(
                    config,
                    format!(
                        "a transaction on `{topic}` is still pending after {} s (is another run \
                         of this pipeline writing?)",
                        wait.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Reads the log from its start up to `end`: the last commit of this id in it.
    fn read_through(&self, topic: &str, end: i64) -> DataflowResult<Option<Commit>> {
        let (config, committed) = (self.config, &self.committed);
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, 0, Offset::Beginning)
            .map_err(|e| error(config, e))?;
        committed
            .assign(&assignment)
            .map_err(|e| error(config, format!("reading `{topic}`: {e}")))?;
        let mut last = None;
        let deadline = Instant::now() + self.timeout();
        loop {
            match committed.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    if m.key() == Some(self.id.as_bytes()) {
                        if let Some(commit) =
                            m.payload().and_then(|p| serde_json::from_slice(p).ok())
                        {
                            last = Some(commit);
                        }
                    }
                    if m.offset() + 1 >= end {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(error(config, format!("reading `{topic}`: {e}"))),
                None if Instant::now() > deadline => {
                    return Err(error(
                        config,
                        format!("reading `{topic}` timed out before its end ({end})"),
                    ))
                }
                None => {}
            }
        }
        Ok(last)
    }
}

fn commit_log_reader(
    config: &KafkaSinkConfig,
    id: &str,
    isolation: &str,
) -> DataflowResult<BaseConsumer<Diagnosed>> {
    let mut c = client_config(&config.brokers, &config.options, Role::Admin);
    c.set("group.id", format!("riffle-commits-{id}"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        // The log is small and read once: don't let the broker hold fetches for more.
        .set("fetch.wait.max.ms", "10")
        .set("isolation.level", isolation);
    c.create_with_context(Diagnosed::default())
        .map_err(|e| error(config, format!("reading the commit log: {e}")))
}
