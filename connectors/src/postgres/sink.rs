//! The sink the runtime writes batches to (worker 0): with checkpoints it only buffers each
//! epoch's rows for the committer ([`super::commit`]); without, each flush writes what came
//! since the last in one transaction (at-least-once).

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use riffle_dataflow::sink::Sink;
use riffle_dataflow::{DataflowResult, Epoch};

use super::commit::{lock, Shared};
use super::writer::{Rows, Writer};

/// The sink the runtime writes to (worker 0).
pub struct PostgresSink {
    mode: Mode,
    /// Rows taken so far (the checkpoint's sink position).
    rows: u64,
}

enum Mode {
    /// Without checkpoints: each flush writes the rows since the last in one transaction.
    Direct { writer: Box<Writer>, pending: Rows },
    /// With checkpoints: rows wait, per epoch, for the committer's transaction.
    Buffered(Arc<Mutex<Shared>>),
}

impl PostgresSink {
    pub(super) fn direct(writer: Writer, rows: u64) -> Self {
        PostgresSink {
            mode: Mode::Direct {
                writer: Box::new(writer),
                pending: Vec::new(),
            },
            rows,
        }
    }

    pub(super) fn buffered(shared: Arc<Mutex<Shared>>, rows: u64) -> Self {
        PostgresSink {
            mode: Mode::Buffered(shared),
            rows,
        }
    }
}

impl Sink for PostgresSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match &mut self.mode {
            Mode::Direct { writer, pending } => {
                let plan = writer.plan(&batch.schema())?;
                pending.push((plan, batch.clone()));
            }
            Mode::Buffered(shared) => lock(shared).buffer(batch)?,
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        let Mode::Direct { writer, pending } = &mut self.mode else {
            // The committer writes, when a checkpoint covers the rows.
            return Ok(());
        };
        if pending.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(pending);
        writer.transaction(|tx| tx.write(&rows).map(|_| ()))
    }

    fn position(&self) -> Option<u64> {
        Some(self.rows)
    }

    fn begin_epoch(&mut self, _generation: u64, epoch: Epoch) {
        if let Mode::Buffered(shared) = &self.mode {
            lock(shared).begin_epoch(epoch);
        }
    }
}
