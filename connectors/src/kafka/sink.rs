//! Kafka sink: the factory. It creates the results topic, settles how a run's output is
//! exactly-once (transactions, commit markers or neither) and opens the writer
//! ([`super::writer`]) and the committer that goes with the mode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use rdkafka::error::RDKafkaErrorCode;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::sink::{Committer, Recovery, Sink, SinkFactory};
use riffle_dataflow::DataflowResult;

use super::client::{
    check_files, client_config, creation_error, fetch_metadata, sink_producer_config, Diagnosed,
    Role,
};
use super::config::{ExactlyOnce, KafkaSinkConfig};
use super::delivery::{delivery_context, lock};
use super::markers::MarkerWriter;
use super::metrics;
use super::topics::{ensure_topic, TopicSpec};
use super::transactions::{
    brokers_support_transactions, commit_log_topic, recovery, CommitLog, InitError, Transaction,
    TransactionCommitter,
};
use super::writer::KafkaSink;

/// A configured Kafka sink; each `open` creates its own producer.
pub struct KafkaSinkFactory {
    config: KafkaSinkConfig,
    /// How this run's output is exactly-once, settled by `recover` (runs with checkpoints).
    mode: Mutex<Mode>,
    /// The brokers answered with the sink's credentials (checked once, by `recover` or
    /// `open`).
    connected: Mutex<bool>,
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

/// Longest wait for the brokers when the sink checks its connection at the start of a run
/// (as the source waits for its topic's metadata).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl KafkaSinkFactory {
    /// Checks the configuration (including that librdkafka accepts every option).
    pub fn new(config: &KafkaSinkConfig) -> DataflowResult<Self> {
        if config.topic.is_empty() {
            return Err(config.config_error("`topic` is empty"));
        }
        if config.delivery_timeout_ms == 0 {
            return Err(config.config_error("delivery_timeout_ms must be positive"));
        }
        sink_producer_config(config)
            .create_native_config()
            .map_err(|e| config.config_error(e))?;
        check_files(&config.options).map_err(|e| config.config_error(e))?;
        Ok(KafkaSinkFactory {
            config: config.clone(),
            mode: Mutex::new(Mode::Unsettled),
            connected: Mutex::new(false),
        })
    }

    /// Connects as the sink's clients do (its brokers and `options`: security protocol,
    /// SASL, TLS) and reads the topic's metadata, once per factory. Wrong credentials, a SASL
    /// mechanism the brokers do not offer or a failed TLS handshake then stop the run at its
    /// start, naming the cause, within a second; a producer would only report them as
    /// undelivered messages once its delivery timeout had passed.
    fn check_connection(&self) -> DataflowResult<()> {
        let mut connected = lock(&self.connected);
        if *connected {
            return Ok(());
        }
        let config = &self.config;
        // A consumer: a producer's metadata request may create the topic with the brokers'
        // defaults, before `ensure_topic` creates it as configured.
        let consumer: BaseConsumer<Diagnosed> =
            client_config(&config.brokers, &config.options, Role::Admin)
                .create_with_context(Diagnosed::default())
                .map_err(|e| {
                    config.config_error(format!(
                        "creating a client: {}",
                        creation_error(&config.options, &e)
                    ))
                })?;
        let metadata = fetch_metadata(&consumer, Some(&config.topic), CONNECT_TIMEOUT)
            .map_err(|e| config.config_error(format!("cannot connect: {e}")))?;
        let error = metadata
            .topics()
            .iter()
            .find(|t| t.name() == config.topic)
            .and_then(|t| t.error())
            .map(RDKafkaErrorCode::from);
        match error {
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                return Err(config.config_error(
                    "the brokers refuse this client the topic (TopicAuthorizationFailed): \
                     check the ACLs of sasl.username",
                ))
            }
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) if !config.create_topic => {
                tracing::warn!(
                    topic = %config.topic,
                    "kafka sink: the topic does not exist and `create_topic` is false: results \
                     wait until the brokers create it (auto.create.topics.enable)"
                );
            }
            _ => {}
        }
        *connected = true;
        Ok(())
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
        let (context, _) = delivery_context(&self.config)?;
        // Creating the log (~150 ms for a new topic) and initialising the producer don't
        // depend on each other: the log is first written at the first commit.
        std::thread::scope(|scope| {
            let created = scope.spawn(|| self.ensure_topic(&log, 1, &compact));
            let transaction = Transaction::init(&self.config, id, context).map(Arc::new);
            let created = created.join().map_err(|_| {
                self.config
                    .config_error(format!("creating `{log}` panicked"))
            })?;
            created?;
            transaction
        })
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
        ensure_topic(
            &self.config.brokers,
            &self.config.options,
            &TopicSpec {
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
        self.check_connection()?;
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
                return Err(self.config.config_error(
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
                    self.config
                        .config_error("no transactional producer in this process")
                })?;
                Some(Box::new(TransactionCommitter { transaction }))
            }
            Mode::Unsettled | Mode::Markers => Some(Box::new(MarkerWriter::open(&self.config)?)),
        })
    }

    fn recover(&self, leader: bool) -> DataflowResult<Recovery> {
        let id = self.transactional_id();
        let started = std::time::Instant::now();
        // First, so that wrong credentials or TLS fail here, naming the cause, and no
        // client below is left waiting out its timeout against brokers that refuse it.
        self.check_connection()?;
        let connected = started.elapsed();
        std::thread::scope(|scope| {
            // Connecting the commit log's reader needs no settled transactions and no log:
            // beside `init_transactions` and the log's creation.
            let log = matches!(
                self.config.exactly_once,
                ExactlyOnce::Transactions | ExactlyOnce::Auto
            )
            .then(|| scope.spawn(|| CommitLog::connect(&self.config, &id)));
            self.recover_with(leader, &id, log, (started, connected))
        })
    }
}

impl KafkaSinkFactory {
    fn recover_with(
        &self,
        leader: bool,
        id: &str,
        log: Option<std::thread::ScopedJoinHandle<'_, DataflowResult<CommitLog<'_>>>>,
        (started, connected): (std::time::Instant, Duration),
    ) -> DataflowResult<Recovery> {
        // The leader's own initialisation tells whether the brokers have transactions; other
        // processes ask with a throw-away id (the real one would fence the leader).
        let mut initialised = None;
        let transactions = match self.config.exactly_once {
            ExactlyOnce::Transactions => true,
            ExactlyOnce::Auto => {
                let supported = if leader {
                    match self.initialise(id) {
                        Ok(t) => {
                            initialised = Some(t);
                            true
                        }
                        Err(e) if e.unsupported => false,
                        Err(e) => return Err(e.error),
                    }
                } else {
                    brokers_support_transactions(&self.config, id)?
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
                return Err(self.config.config_error(format!(
                    "consumer group `{}` commits its offsets in this sink's transactions, \
                         and these brokers have none",
                    group.group_id
                )));
            }
            *lock(&self.mode) = match self.config.exactly_once {
                ExactlyOnce::Off => Mode::Off,
                _ => Mode::Markers,
            };
            return Ok(Recovery::Latest);
        }
        let transaction = match (leader, initialised) {
            (true, Some(t)) => Some(t),
            (true, None) => Some(self.initialise(id).map_err(|e| e.error)?),
            (false, _) => None,
        };
        let initialised_at = started.elapsed();
        let log = match log {
            Some(handle) => handle.join().map_err(|_| {
                self.config
                    .config_error("connecting to the commit log panicked")
            })??,
            None => CommitLog::connect(&self.config, id)?,
        };
        let last = log.last_commit(PENDING_WAIT)?;
        tracing::debug!(
            "kafka sink recovery: connection checked at {:.0} ms, transactions initialised at \
             {:.0} ms, last commit read at {:.0} ms",
            connected.as_secs_f64() * 1e3,
            initialised_at.as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3
        );
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
