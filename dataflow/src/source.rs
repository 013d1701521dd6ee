//! Where records come from.

use arrow_schema::SchemaRef;

use crate::dead_letter::DeadLetter;
use crate::error::DataflowResult;
use crate::observe::registry::Metrics;
use arrow_array::RecordBatch;

/// One batch read by a source, with the inputs it could not read.
#[derive(Debug)]
pub struct SourceBatch {
    pub records: RecordBatch,
    pub rejected: Vec<DeadLetter>,
    /// The input positions this batch covers (a partitioned log's offsets), for checkpoints.
    pub positions: Vec<SourcePosition>,
    /// When the oldest record became ready to read (ns since the Unix epoch: a camera frame's
    /// capture), if the source knows: its wait in the source's queue starts the latency
    /// breakdown.
    pub ready_ns: Option<u64>,
}

impl SourceBatch {
    /// A batch from a source without positions (files).
    pub fn new(records: RecordBatch, rejected: Vec<DeadLetter>) -> Self {
        SourceBatch {
            records,
            rejected,
            positions: Vec::new(),
            ready_ns: None,
        }
    }
}

/// A contiguous range of one partition's offsets, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourcePosition {
    pub partition: i32,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// Wakes a parked worker: its source has records again.
#[derive(Clone, Debug)]
pub struct Wake {
    thread: std::thread::Thread,
    rung: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Wake {
    /// Wakes the calling thread when woken.
    pub fn current() -> Self {
        Wake {
            thread: std::thread::current(),
            rung: std::sync::Arc::default(),
        }
    }

    pub fn wake(&self) {
        self.rung.store(true, std::sync::atomic::Ordering::Release);
        self.thread.unpark();
    }

    /// Whether [`Wake::wake`] was called since the last look (and forgets it).
    pub fn take(&self) -> bool {
        self.rung.swap(false, std::sync::atomic::Ordering::AcqRel)
    }
}

/// The part of a source that one worker reads.
pub trait Source: Send {
    /// The next batch, or `None` once this partition is exhausted.
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>>;

    /// When the next batch becomes available, if not now: a live source (a paced camera)
    /// says so instead of sleeping in `next_batch`, so the worker runs its stages meanwhile.
    fn next_due(&self) -> Option<std::time::Instant> {
        None
    }

    /// Whether records come on the wall clock (live or paced cameras): the worker then numbers
    /// epochs by when they close (ms since the workers started), so every worker's epochs
    /// closed at the same moment share a number and one worker's results never wait for
    /// another worker to count as many epochs (which a busy worker, reading several frames an
    /// epoch, would only do later). Replayed files keep counted epochs: a replay after a
    /// restart splits the same records into the same epochs.
    fn clocked(&self) -> bool {
        false
    }

    /// Asks the source to call `wake` whenever records arrive after a read that found none, and
    /// says whether it will: the worker then parks between reads (its stages still run) instead
    /// of polling. A source that returns `false` (the default) may block briefly in
    /// [`Source::next_batch`] instead.
    fn wake_with(&mut self, _wake: Wake) -> bool {
        false
    }

    /// Keys whose state downstream is finished with since the last call (cameras removed
    /// while running), as one column named as the key column (`camera_id`); sent on after
    /// the batch just read, so keyed stages drop them once their last rows are through.
    fn retired(&mut self) -> Option<RecordBatch> {
        None
    }
}

/// A configured source, able to describe its output and to split itself across workers.
pub trait SourceFactory: Send + Sync {
    /// Schema of every batch the source emits.
    fn schema(&self) -> DataflowResult<SchemaRef>;

    /// The partition that worker `index` of `peers` reads. Partitions are disjoint and together
    /// cover the whole input, for any number of peers.
    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>>;

    /// Total number of records across all partitions, when known (progress display).
    fn total_records(&self) -> Option<u64> {
        None
    }

    /// Names the source in checkpoints when its positions (partition offsets) can be resumed
    /// from; `None` for sources that cannot seek.
    fn checkpoint_id(&self) -> Option<String> {
        None
    }

    /// The same source starting at checkpointed positions (partition → next offset); `None` for
    /// sources that cannot seek. Called by the runtime when it resumes from a checkpoint.
    fn resume(
        &self,
        _offsets: &std::collections::BTreeMap<i32, i64>,
    ) -> DataflowResult<Option<std::sync::Arc<dyn SourceFactory>>> {
        Ok(None)
    }

    /// Registers the source's own metrics (lag, bytes) with the process's registry
    /// ([`Metrics::register`]); called by the runtime before every run.
    fn attach_metrics(&self, _metrics: &Metrics) -> DataflowResult<()> {
        Ok(())
    }

    /// The handle that adds and removes inputs while the source runs, for sources whose inputs
    /// can change (cameras); shared by every partition of this factory and its resumed copies.
    fn control(&self) -> Option<std::sync::Arc<dyn crate::control::InputControl>> {
        None
    }

    /// What a checkpoint keeps of the source besides offsets (the camera set of a source
    /// changed at run time); read by worker 0 as each checkpoint is written.
    fn checkpoint_state(&self) -> Option<String> {
        None
    }

    /// Takes back what [`SourceFactory::checkpoint_state`] gave, before
    /// [`SourceFactory::resume`] is called with the same checkpoint's offsets.
    fn restore_state(&self, _state: &str) -> DataflowResult<()> {
        Ok(())
    }
}
