//! The live hook: whoever watches a running pipeline (a live view) is offered what passes,
//! from the side of the dataflow, without holding anything up in it. The engine knows nothing
//! of what the batches hold; the watcher picks what it shows.
//!
//! A watcher puts itself in the run's [`RunContext::live`](super::RunContext::live); the
//! runtime offers it each batch a source step reads (`runtime/worker.rs`) and each batch of
//! results and dead letters the sink operator receives, before its epoch commits
//! (`operators/write_to_sink.rs`). Each call runs on a worker thread: a watcher copies what
//! it keeps and returns at once, bounded in time and memory.

use std::any::Any;
use std::sync::Arc;

use arrow_array::RecordBatch;

/// See the [module documentation](self).
pub trait LiveObserver: Send + Sync {
    /// A batch a source step read, before any stage.
    fn source_batch(&self, batch: &RecordBatch);
    /// Results as they reach the sink.
    fn results(&self, batch: &RecordBatch);
    /// Dead letters as they reach the sink (in [`crate::dead_letter::schema`]).
    fn dead_letters(&self, batch: &RecordBatch);
    /// The watcher itself, for its owner to find it again in a context it was handed.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}
