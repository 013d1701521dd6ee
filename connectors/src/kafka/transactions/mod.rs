//! Exactly-once output through Kafka transactions, in step with checkpoints.
//!
//! One producer (worker 0's sink) writes results inside a transaction. When a checkpoint is
//! due the runtime seals the transaction at the newest epoch the sink has written (results of
//! later epochs are held back), writes the checkpoint of that epoch, then commits. The commit
//! carries one record to the commit log `<topic>.riffle-commits` (keyed by the
//! `transactional.id`, compacted): `{"generation": G, "epoch": E}`. The results topic holds
//! results only, so any `read_committed` consumer sees each one once.
//!
//! After a crash, `init_transactions` with the same `transactional.id` fences the old producer
//! and completes or aborts its pending transaction; the commit log then names the one
//! checkpoint that matches the committed output, and the run resumes from it (newer
//! checkpoints are discarded: their transactions never committed).
//!
//! This module holds the producer's transactions and the committer; `commit_log` reads the
//! commit log, `clean_up` finds the partitions a crash left a transaction open on, and
//! `clients` makes the other clients (group metadata, the probe for transactions).

mod clean_up;
mod clients;
mod commit_log;

pub use clean_up::CLEAN_UP_HEADER;
pub use clients::brokers_support_transactions;
pub use commit_log::CommitLog;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use riffle_dataflow::sink::{Committer, Recovery};
use riffle_dataflow::{DataflowError, DataflowResult, Epoch};
use serde::{Deserialize, Serialize};

use super::client::drain;
use super::config::KafkaSinkConfig;
use super::delivery::{DeliveryContext, COMMIT_RECORD};
use clean_up::open_partitions;
use clients::{group_metadata, transactional_config, unsupported};

/// The commit log of a results topic.
pub fn commit_log_topic(topic: &str) -> String {
    format!("{topic}.riffle-commits")
}

/// What one committed transaction recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    pub generation: u64,
    pub epoch: Epoch,
}

/// The transactional producer shared by the sink (writes) and the committer (seals, commits).
pub(super) struct Transaction {
    pub producer: BaseProducer<DeliveryContext>,
    pub id: String,
    /// The results topic.
    topic: String,
    log_topic: String,
    timeout: Duration,
    control: Mutex<Control>,
    /// A `group_id:` source's group, whose offsets each transaction commits.
    group: Option<GroupOffsets>,
}

/// The consumer group a transaction commits offsets for, and what it committed last.
struct GroupOffsets {
    topic: String,
    metadata: ConsumerGroupMetadata,
    committed: Mutex<BTreeMap<i32, i64>>,
    pending: Mutex<BTreeMap<i32, i64>>,
}

#[derive(Default)]
struct Control {
    open: bool,
    sealed: Option<Epoch>,
    /// The epoch the sink is writing.
    epoch: Option<Epoch>,
    /// Messages of epochs after the seal, sent as soon as the sealed transaction commits (or
    /// the seal is lifted), by the commit itself: the sink may have finished by then.
    held: Vec<Held>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Transaction {
    /// A producer with this sink's `transactional.id`, initialised: older producers with that
    /// id are fenced and their pending transaction completed or aborted.
    pub fn init(
        config: &KafkaSinkConfig,
        id: &str,
        context: DeliveryContext,
    ) -> Result<Transaction, InitError> {
        let timeout = Duration::from_millis(config.delivery_timeout_ms);
        let started = Instant::now();
        let producer: BaseProducer<DeliveryContext> = transactional_config(config, id)
            .create_with_context(context)
            .map_err(|e| error(config, format!("creating a transactional producer: {e}")))?;
        // librdkafka looks for the transaction coordinator as soon as the producer exists; with
        // no broker connected yet that query fails and is retried only 500 ms later. A metadata
        // request first brings a connection up, so the first query finds the coordinator.
        let connected = producer
            .client()
            .fetch_metadata(Some(&config.topic), timeout)
            .is_ok();
        let ready = started.elapsed();
        producer.init_transactions(timeout).map_err(|e| InitError {
            unsupported: unsupported(e.rdkafka_error_code()),
            error: error(config, format!("initialising transactions of `{id}`: {e}")),
        })?;
        tracing::debug!(
            "kafka transactions of `{id}`: producer connected ({connected}) at {:.0} ms, \
             initialised at {:.0} ms",
            ready.as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3
        );
        let group = match &config.source_group {
            Some(g) => Some(GroupOffsets {
                topic: g.topic.clone(),
                metadata: group_metadata(config, &g.group_id)?,
                committed: Mutex::default(),
                pending: Mutex::default(),
            }),
            None => None,
        };
        let transaction = Transaction {
            producer,
            id: id.to_string(),
            topic: config.topic.clone(),
            log_topic: commit_log_topic(&config.topic),
            timeout,
            control: Mutex::new(Control::default()),
            group,
        };
        transaction.abort_left_open(config)?;
        Ok(transaction)
    }

    /// Aborts a transaction of this producer id that a partition still holds open after
    /// `init_transactions` resolved the coordinator's. A broker restarted (`kill -9`) within
    /// its session timeout completes the abort of a timed-out transaction without writing the
    /// marker to partitions whose leader is not registered again yet ("Couldn't find leader
    /// endpoint … skipped"); the partition keeps the transaction open, and the next commit
    /// under this id would commit those results as well as their replay. One record to each
    /// such partition in a transaction that is then aborted closes it: markers end whatever
    /// this producer id has open there, whatever its epoch.
    fn abort_left_open(&self, config: &KafkaSinkConfig) -> DataflowResult<()> {
        let open = open_partitions(config, &[&self.topic, &self.log_topic])?;
        if open.is_empty() {
            return Ok(());
        }
        self.producer
            .begin_transaction()
            .map_err(|e| self.failed("beginning a transaction", e))?;
        let headers = OwnedHeaders::new().insert(rdkafka::message::Header {
            key: CLEAN_UP_HEADER,
            value: Some("abort"),
        });
        for p in &open {
            let record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(&p.topic, COMMIT_RECORD)
                .partition(p.partition)
                .payload(&[])
                .headers(headers.clone());
            self.producer
                .send(record)
                .map_err(|(e, _)| self.failed("writing a clean-up record", e))?;
        }
        // Sent, not only queued: an abort purges what is queued, and a partition the
        // transaction never reached gets no marker.
        self.drain()?;
        self.producer
            .abort_transaction(self.timeout)
            .map_err(|e| self.failed("aborting the clean-up transaction", e))?;
        for p in &open {
            tracing::info!(
                topic = %p.topic,
                partition = p.partition,
                transactional_id = %self.id,
                "a transaction was left open there (last stable offset {}, end {}): aborted \
                 what this producer id had open, so the next commit does not commit it",
                p.stable,
                p.end
            );
        }
        Ok(())
    }

    /// Makes sure a transaction is open.
    fn begin(&self, control: &mut Control) -> DataflowResult<()> {
        if !control.open {
            self.producer
                .begin_transaction()
                .map_err(|e| self.failed("beginning a transaction", e))?;
            control.open = true;
        }
        Ok(())
    }

    /// Called by the sink before it writes the results of `epoch`.
    pub fn enter_epoch(&self, epoch: Epoch) {
        lock(&self.control).epoch = Some(epoch);
    }

    /// Holds a message of an epoch past the seal (`true`), or makes sure a transaction is open
    /// for it (`false`: the sink sends it).
    pub fn hold(
        &self,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: Option<&OwnedHeaders>,
    ) -> DataflowResult<bool> {
        let mut control = lock(&self.control);
        if let (Some(cut), Some(epoch)) = (control.sealed, control.epoch) {
            if epoch > cut {
                control.held.push(Held {
                    key: key.map(<[u8]>::to_vec),
                    payload: payload.to_vec(),
                    headers: headers.cloned(),
                });
                return Ok(true);
            }
        }
        self.begin(&mut control)?;
        Ok(false)
    }

    /// Sends the held messages into a new transaction.
    fn send_held(&self, control: &mut Control) -> DataflowResult<()> {
        if control.held.is_empty() {
            return Ok(());
        }
        self.begin(control)?;
        let state = &self.producer.context().state;
        for m in std::mem::take(&mut control.held) {
            let n = state.number() as usize;
            let mut record =
                BaseRecord::<[u8], [u8], usize>::with_opaque_to(&self.topic, n).payload(&m.payload);
            if let Some(key) = &m.key {
                record = record.key(key);
            }
            if let Some(headers) = m.headers {
                record = record.headers(headers);
            }
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        self.producer.poll(Duration::from_millis(5));
                    }
                    Err((e, _)) => return Err(self.failed("sending held results", e)),
                }
            }
        }
        Ok(())
    }

    /// Waits for every delivery report: `commit_transaction` starts with rdkafka's `flush`,
    /// which polls in 100 ms steps; with nothing in flight it returns at once.
    fn drain(&self) -> DataflowResult<()> {
        if drain(&self.producer, self.timeout) {
            return Ok(());
        }
        let cause = self
            .producer
            .context()
            .state
            .client_error()
            .map_or(String::new(), |c| format!("; the client reported: {c}"));
        Err(DataflowError::stage(
            "sink",
            format!(
                "kafka transaction `{}`: {} message(s) undelivered after {} ms{cause}",
                self.id,
                self.producer.in_flight_count(),
                self.timeout.as_millis()
            ),
        ))
    }

    fn commit(&self, commit: Commit) -> DataflowResult<()> {
        let mut control = lock(&self.control);
        self.begin(&mut control)?;
        let value = serde_json::to_vec(&commit)
            .map_err(|e| DataflowError::stage("sink", format!("encoding a commit: {e}")))?;
        let record = BaseRecord::<str, [u8], usize>::with_opaque_to(&self.log_topic, COMMIT_RECORD)
            .partition(0)
            .key(self.id.as_str())
            .payload(&value);
        self.producer
            .send(record)
            .map_err(|(e, _)| self.failed("writing the commit record", e))?;
        let offsets = self.group_offsets()?;
        let started = std::time::Instant::now();
        self.drain()?;
        let drained = started.elapsed();
        let committed = self.producer.commit_transaction(self.timeout);
        tracing::debug!(
            "kafka transaction `{}` through epoch {}: deliveries drained in {:.1} ms, \
             committed in {:.1} ms",
            self.id,
            commit.epoch,
            drained.as_secs_f64() * 1e3,
            (started.elapsed() - drained).as_secs_f64() * 1e3
        );
        if let Err(e) = committed {
            // An abortable failure leaves the producer usable for the restart's sake; the run
            // still fails, and resumes from the previous commit.
            if let KafkaError::Transaction(t) = &e {
                if t.txn_requires_abort() {
                    let _ = self.producer.abort_transaction(self.timeout);
                }
            }
            control.open = false;
            return Err(self.failed("committing a transaction", e));
        }
        control.open = false;
        control.sealed = None;
        if let (Some(group), Some(offsets)) = (&self.group, offsets) {
            lock(&group.committed).extend(offsets);
        }
        self.send_held(&mut control)
    }

    /// Adds the group offsets that moved since the last commit to the open transaction (only
    /// those: a partition handed to another member must not get an old offset back).
    fn group_offsets(&self) -> DataflowResult<Option<BTreeMap<i32, i64>>> {
        let Some(group) = &self.group else {
            return Ok(None);
        };
        let committed = lock(&group.committed).clone();
        let moved: BTreeMap<i32, i64> = lock(&group.pending)
            .iter()
            .filter(|(p, o)| committed.get(p).is_none_or(|c| c < o))
            .map(|(p, o)| (*p, *o))
            .collect();
        if moved.is_empty() {
            return Ok(Some(moved));
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &moved {
            tpl.add_partition_offset(&group.topic, *p, Offset::Offset(*o))
                .map_err(|e| self.failed("listing group offsets", e))?;
        }
        self.producer
            .send_offsets_to_transaction(&tpl, &group.metadata, self.timeout)
            .map_err(|e| self.failed("adding the group's offsets", e))?;
        Ok(Some(moved))
    }

    fn set_source_offsets(&self, offsets: &BTreeMap<i32, i64>) {
        if let Some(group) = &self.group {
            *lock(&group.pending) = offsets.clone();
        }
    }

    fn failed(&self, what: &str, e: KafkaError) -> DataflowError {
        let fenced = matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::InvalidProducerEpoch | RDKafkaErrorCode::ProducerFenced)
        );
        let hint = if fenced {
            " (another producer with this transactional.id took over: is a second run of this \
             pipeline writing to the topic?)"
        } else {
            ""
        };
        DataflowError::stage(
            "sink",
            format!("kafka transaction `{}`: {what}: {e}{hint}", self.id),
        )
    }
}

/// A failed initialisation, and whether it failed because the brokers have no transactions.
pub(super) struct InitError {
    pub unsupported: bool,
    pub error: DataflowError,
}

impl From<DataflowError> for InitError {
    fn from(error: DataflowError) -> Self {
        InitError {
            unsupported: false,
            error,
        }
    }
}

/// A message held back by a seal.
struct Held {
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    headers: Option<OwnedHeaders>,
}

/// The committer side of a transactional sink.
pub(super) struct TransactionCommitter {
    pub transaction: Arc<Transaction>,
}

impl Committer for TransactionCommitter {
    fn source_offsets(&mut self, offsets: &BTreeMap<i32, i64>) {
        self.transaction.set_source_offsets(offsets);
    }

    fn commit(&mut self, generation: u64, through: Epoch) -> DataflowResult<()> {
        self.transaction.commit(Commit {
            generation,
            epoch: through,
        })
    }

    /// `init_transactions` fenced older producers already.
    fn fence(&mut self, _generation: u64) -> DataflowResult<()> {
        Ok(())
    }

    fn transactional(&self) -> bool {
        true
    }

    fn seal(&mut self, through: Epoch) -> bool {
        let mut control = lock(&self.transaction.control);
        // Held messages are sent when a seal ends: none are left by now.
        debug_assert!(control.held.is_empty());
        control.sealed = Some(through);
        true
    }

    fn sealed(&self) -> Option<Epoch> {
        lock(&self.transaction.control).sealed
    }

    fn release(&mut self) -> DataflowResult<()> {
        let mut control = lock(&self.transaction.control);
        control.sealed = None;
        self.transaction.send_held(&mut control)
    }
}

fn error(config: &KafkaSinkConfig, message: impl std::fmt::Display) -> DataflowError {
    DataflowError::Config(format!(
        "kafka sink (topic `{}` on {}): {message}",
        config.topic, config.brokers
    ))
}

/// The recovery a transactional sink reports.
pub fn recovery(last: Option<Commit>) -> Recovery {
    Recovery::Committed(last.map(|c| (c.generation, c.epoch)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_transactions_are_told_apart_from_failures() {
        assert!(unsupported(Some(RDKafkaErrorCode::UnsupportedFeature)));
        assert!(unsupported(Some(RDKafkaErrorCode::UnsupportedVersion)));
        assert!(!unsupported(Some(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed
        )));
        assert!(!unsupported(Some(RDKafkaErrorCode::BrokerTransportFailure)));
        assert!(!unsupported(None));
    }

    #[test]
    fn a_commit_is_a_small_json_record() {
        let c = Commit {
            generation: 7,
            epoch: 42,
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"generation":7,"epoch":42}"#);
        assert_eq!(serde_json::from_str::<Commit>(&text).unwrap(), c);
        assert_eq!(commit_log_topic("detections"), "detections.riffle-commits");
    }
}
