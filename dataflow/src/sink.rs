//! Where results go.

use arrow_array::RecordBatch;

use crate::error::DataflowResult;
use crate::metrics::Metrics;

/// A destination for result (or dead-letter) batches.
pub trait Sink: Send {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()>;
    /// Makes everything written so far durable/visible; called at the end of the run.
    fn flush(&mut self) -> DataflowResult<()>;
}

/// A configured sink that can be opened once per process.
pub trait SinkFactory: Send + Sync {
    fn open(&self) -> DataflowResult<Box<dyn Sink>>;

    /// Registers the sink's own metrics (bytes, produce errors) once per process.
    fn attach_metrics(&self, _metrics: &Metrics) -> DataflowResult<()> {
        Ok(())
    }
}
