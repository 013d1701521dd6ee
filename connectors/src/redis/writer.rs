//! The Redis sink's writer: each row becomes its key's latest write. With checkpoints the
//! writes wait for the committer ([`super::transaction`]); without, each flush (an epoch
//! completing) sends what arrived since the last one in one `MULTI`/`EXEC`.

use std::sync::Arc;

use arrow_array::RecordBatch;
use riffle_dataflow::sink::Sink;
use riffle_dataflow::{DataflowResult, Epoch};

use super::client::Connection;
use super::config::RedisSinkConfig;
use super::render::{render, Rendered};
use super::template::KeyTemplate;
use super::transaction::Transaction;
use super::writes::Writes;

/// Where the writes go.
enum Target {
    /// Runs without checkpoints (and live sinks): written at each flush.
    Direct {
        connection: Box<Connection>,
        pending: Writes,
    },
    /// Runs with checkpoints: held until the committer commits them with a checkpoint.
    Transactional(Arc<Transaction>),
}

/// An open Redis sink.
pub struct RedisSink {
    config: RedisSinkConfig,
    template: KeyTemplate,
    target: Target,
    /// Rows taken so far (from the checkpoint's position after a restart).
    rows: u64,
    /// Rows without a key (a null key column), left out.
    keyless: u64,
    /// The batch being written; its buffers are reused by the next.
    rendered: Rendered,
}

impl RedisSink {
    pub(super) fn direct(
        config: &RedisSinkConfig,
        template: KeyTemplate,
        connection: Connection,
    ) -> RedisSink {
        RedisSink::new(
            config,
            template,
            Target::Direct {
                connection: Box::new(connection),
                pending: Writes::default(),
            },
            0,
        )
    }

    pub(super) fn transactional(
        config: &RedisSinkConfig,
        template: KeyTemplate,
        transaction: Arc<Transaction>,
        position: u64,
    ) -> RedisSink {
        RedisSink::new(
            config,
            template,
            Target::Transactional(transaction),
            position,
        )
    }

    fn new(config: &RedisSinkConfig, template: KeyTemplate, target: Target, rows: u64) -> Self {
        RedisSink {
            config: config.clone(),
            template,
            target,
            rows,
            keyless: 0,
            rendered: Rendered::default(),
        }
    }
}

impl Sink for RedisSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        render(
            batch,
            &self.template,
            &self.config.value,
            &mut self.rendered,
        )
        .map_err(|e| self.config.sink_error(e))?;
        self.rows += self.rendered.len() as u64;
        let keyless = self.rendered.keyless() as u64;
        if keyless > 0 && self.keyless == 0 {
            tracing::warn!(
                key = %self.config.key,
                "redis sink: a row with a null key column has no key and is left out (the \
                 total is logged at the end)"
            );
        }
        self.keyless += keyless;
        match &mut self.target {
            Target::Direct { pending, .. } => pending.add(&mut self.rendered),
            Target::Transactional(t) => t.write(&mut self.rendered),
        }
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        match &mut self.target {
            Target::Direct {
                connection,
                pending,
            } => {
                connection.apply(pending, self.config.ttl_s, None)?;
                pending.clear();
                Ok(())
            }
            Target::Transactional(_) => Ok(()),
        }
    }

    /// Rows so far, for checkpoints (which only runs with a committer take).
    fn position(&self) -> Option<u64> {
        match self.target {
            Target::Transactional(_) => Some(self.rows),
            Target::Direct { .. } => None,
        }
    }

    fn begin_epoch(&mut self, _generation: u64, epoch: Epoch) {
        if let Target::Transactional(t) = &self.target {
            t.enter_epoch(epoch);
        }
    }

    /// Without checkpoints, the last writes; with them, the last checkpoint commits them.
    fn finish(&mut self) -> DataflowResult<()> {
        if self.keyless > 0 {
            tracing::warn!(
                key = %self.config.key,
                "redis sink: {} row(s) with a null key column were left out",
                self.keyless
            );
        }
        self.flush()
    }
}
