//! Where results go.

use arrow_array::RecordBatch;

use crate::error::DataflowResult;
use crate::metrics::Metrics;

/// A destination for result (or dead-letter) batches.
pub trait Sink: Send {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()>;
    /// Makes what was written so far visible; called whenever an epoch completes, so it
    /// should not block for long.
    fn flush(&mut self) -> DataflowResult<()>;

    /// Bytes made visible so far, for sinks that can resume at a checkpointed position.
    fn position(&self) -> Option<u64> {
        None
    }

    /// Makes everything written durable; called once when the input ends.
    fn finish(&mut self) -> DataflowResult<()> {
        self.flush()
    }
}

/// A configured sink that can be opened once per process.
pub trait SinkFactory: Send + Sync {
    fn open(&self) -> DataflowResult<Box<dyn Sink>>;

    /// Reopens after a restart, at the position a checkpoint recorded. Sinks without a
    /// position (topics, standard output) just open.
    fn open_at(&self, _position: u64) -> DataflowResult<Box<dyn Sink>> {
        self.open()
    }

    /// Registers the sink's own metrics (bytes, produce errors) once per process.
    fn attach_metrics(&self, _metrics: &Metrics) -> DataflowResult<()> {
        Ok(())
    }
}
