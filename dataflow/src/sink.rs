//! Where results go.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::error::DataflowResult;
use crate::observe::registry::Metrics;
use crate::Epoch;

/// A destination for result (or dead-letter) batches.
pub trait Sink: Send {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()>;
    /// Makes what was written so far visible; called whenever an epoch completes, so it
    /// should not block for long.
    fn flush(&mut self) -> DataflowResult<()>;

    /// Bytes (or messages) handed to the destination so far, for checkpoints.
    fn position(&self) -> Option<u64> {
        None
    }

    /// For sinks that make writes durable asynchronously (a topic producer): the position up
    /// to which everything is durable, updated as acknowledgements arrive. A checkpoint only
    /// covers an epoch once this has reached the epoch's position.
    fn durable(&self) -> Option<Arc<AtomicU64>> {
        None
    }

    /// Called before the results of `epoch` are written, by runs with exactly-once output:
    /// `generation` identifies this run (see [`Committer`]).
    fn begin_epoch(&mut self, _generation: u64, _epoch: Epoch) {}

    /// Makes everything written durable; called once when the input ends.
    fn finish(&mut self) -> DataflowResult<()> {
        self.flush()
    }
}

/// A configured sink that can be opened once per process.
pub trait SinkFactory: Send + Sync {
    fn open(&self) -> DataflowResult<Box<dyn Sink>>;

    /// The folder where the sink keeps a live stream per camera (`<camera>/live/index.m3u8`,
    /// HLS), which the live view serves and plays; `None` for sinks that write no stream.
    fn live_stream_dir(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// Reopens after a restart, at the position a checkpoint recorded. Sinks without a
    /// position (topics, standard output) just open.
    fn open_at(&self, _position: u64) -> DataflowResult<Box<dyn Sink>> {
        self.open()
    }

    /// Registers the sink's own metrics (bytes, produce errors) with the process's registry
    /// ([`Metrics::register`]); called by the runtime before every run.
    fn attach_metrics(&self, _metrics: &Metrics) -> DataflowResult<()> {
        Ok(())
    }

    /// For destinations that cannot take back what a failed run wrote (topics): the writer of
    /// commit and fence markers that lets readers see each result once.
    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        Ok(None)
    }

    /// Called once per process before a run with checkpoints starts. A transactional
    /// destination answers with what it last committed: the run then resumes from exactly the
    /// checkpoint that commit recorded (newer checkpoints belong to transactions that never
    /// committed). `leader`: this process opens the sink (and may fence older writers).
    fn recover(&self, _leader: bool) -> DataflowResult<Recovery> {
        Ok(Recovery::Latest)
    }
}

/// Where a run with checkpoints resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// From the newest intact checkpoint.
    Latest,
    /// From the checkpoint written by this generation for this epoch (`None`: nothing was
    /// ever committed, so from the start).
    Committed(Option<(u64, Epoch)>),
}

/// Exactly-once output without broker transactions. Every result is written with its run's
/// generation and its epoch; once a checkpoint covers epoch `e`, `commit(g, e)` tells readers
/// that generation `g`'s results up to `e` are final. A restarted run first re-commits what the
/// checkpoint it resumes from covers, then `fence`s: every result of an older generation not
/// committed by then is void (it will be produced again). A committed reader releases a result
/// when its commit arrives and drops those a fence voids.
///
/// A transactional committer (topic transactions) instead commits exactly what was written up
/// to a cut: the checkpointer first [`seal`](Committer::seal)s the open transaction at the
/// newest epoch the sink has written (later epochs wait outside it), writes the checkpoint for
/// that epoch, then commits; the commit itself records the checkpoint's epoch, so a restart
/// knows which checkpoint matches the output (see [`SinkFactory::recover`]).
pub trait Committer: Send {
    fn commit(&mut self, generation: u64, through: Epoch) -> DataflowResult<()>;
    fn fence(&mut self, generation: u64) -> DataflowResult<()>;

    /// Whether commits are transactions that must match a sealed cut exactly.
    fn transactional(&self) -> bool {
        false
    }

    /// Transactional: close the open transaction to epochs after `through`; `false`: not now
    /// (results held back by the previous seal are not written yet), try again later.
    fn seal(&mut self, _through: Epoch) -> bool {
        true
    }

    /// Transactional: the epoch the open transaction is sealed at, if any.
    fn sealed(&self) -> Option<Epoch> {
        None
    }

    /// Called before `commit` with the source positions the checkpoint records (partition →
    /// next offset), for destinations that commit a consumer group's offsets with the output.
    fn source_offsets(&mut self, _offsets: &std::collections::BTreeMap<i32, i64>) {}

    /// Called before `commit` with the results sink's position the checkpoint records
    /// ([`Sink::position`]), for destinations that publish what was written up to a position
    /// (a file's bytes).
    fn sink_position(&mut self, _at: u64) {}

    /// Transactional: lift a seal without committing (the checkpoint turned out unchanged, so
    /// the transaction holds nothing new).
    fn release(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}
