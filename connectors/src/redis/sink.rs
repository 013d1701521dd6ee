//! The Redis sink's factory: it checks the configuration, and in runs with checkpoints reads
//! the position key (where to resume) and opens the transaction the sink and committer share.

use std::sync::{Arc, Mutex, MutexGuard};

use riffle_dataflow::sink::{Committer, Recovery, Sink, SinkFactory};
use riffle_dataflow::DataflowResult;

use super::client::Connection;
use super::config::RedisSinkConfig;
use super::template::KeyTemplate;
use super::transaction::{recovery, RedisCommitter, Transaction};
use super::writer::RedisSink;

/// A configured Redis sink. Each `open` connects (and checks the credentials).
pub struct RedisSinkFactory {
    config: RedisSinkConfig,
    template: KeyTemplate,
    /// Set by `recover` in the process that opens the sink, in runs with checkpoints.
    transaction: Mutex<Option<Arc<Transaction>>>,
}

impl std::fmt::Debug for RedisSinkFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSinkFactory")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RedisSinkFactory {
    /// Checks the configuration; connects only when opened.
    pub fn new(config: &RedisSinkConfig) -> DataflowResult<Self> {
        let template = config.check()?;
        Ok(RedisSinkFactory {
            config: config.clone(),
            template,
            transaction: Mutex::new(None),
        })
    }

    fn open_from(&self, position: u64) -> DataflowResult<Box<dyn Sink>> {
        let template = self.template.clone();
        let sink = match lock(&self.transaction).clone() {
            Some(t) => RedisSink::transactional(&self.config, template, t, position),
            None => RedisSink::direct(&self.config, template, Connection::open(&self.config)?),
        };
        Ok(Box::new(sink))
    }
}

impl SinkFactory for RedisSinkFactory {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        self.open_from(0)
    }

    fn open_at(&self, position: u64) -> DataflowResult<Box<dyn Sink>> {
        self.open_from(position)
    }

    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        Ok(lock(&self.transaction)
            .clone()
            .map(|transaction| Box::new(RedisCommitter { transaction }) as Box<dyn Committer>))
    }

    /// Reads the position key: the run resumes from the checkpoint whose results Redis holds.
    fn recover(&self, leader: bool) -> DataflowResult<Recovery> {
        let mut connection = Connection::open(&self.config)?;
        let key = self.config.position_key();
        let value = connection.get(&key)?;
        let recovery = recovery(&self.config, &key, value.as_deref())?;
        tracing::info!(
            redis = %self.config.label(),
            position_key = %key,
            "last commit: {}",
            match recovery {
                Recovery::Committed(Some((g, e))) => format!("epoch {e} of run {g}"),
                _ => "none".to_string(),
            }
        );
        *lock(&self.transaction) =
            leader.then(|| Arc::new(Transaction::new(&self.config, connection, value)));
        Ok(recovery)
    }
}
