//! What a job is made of: the steps between its source and its sink.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::observe::registry::StageMetrics;
use crate::operators::{
    service, BatchPolicy, BatchStream, Keyed, KeyedLogic, KeyedRecord, KeyedState, ServiceCell,
    StateUpdates,
};
use crate::state::{SavedState, StateRecord};
use crate::{Compression, DataflowResult, Epoch, Stage, StageOutput};

/// One step of a job, as declared: a stage every worker builds for itself, or a move of
/// batches between workers.
pub struct JobStep {
    /// Name in metrics and the summary (unique within the job).
    pub name: String,
    /// Where the step was declared, for errors (`stages[2].exchange`).
    pub at: String,
    pub kind: StepKind,
}

pub enum StepKind {
    /// Built once per worker, on that worker (a model loads here: once per worker, never at
    /// validation).
    Stage(Arc<dyn BuildStep>),
    /// Re-shard, deal round-robin, place the following stages, or balance by measured delay;
    /// batches crossing processes are encoded with `Compression`.
    Exchange(Route, Compression),
}

/// Builds a stage's per-worker instance.
pub trait BuildStep: Send + Sync {
    fn build(&self, worker: usize, peers: usize) -> DataflowResult<Step>;
}

impl<F> BuildStep for F
where
    F: Fn(usize, usize) -> DataflowResult<Step> + Send + Sync,
{
    fn build(&self, worker: usize, peers: usize) -> DataflowResult<Step> {
        self(worker, peers)
    }
}

/// A stage as one worker runs it.
pub enum Step {
    /// Batch by batch, where the data is.
    Apply(Box<dyn Stage>),
    /// On dynamically merged batches (models).
    Batched(Box<dyn Stage>, BatchPolicy),
    /// An operator with state of its own, checkpointed through [`StatefulStep`].
    Stateful(Box<dyn StatefulStep>),
}

/// A stage that keeps state across batches (features over a sliding window, tracks). The
/// runtime checkpoints its state with every checkpoint and restores it, with any worker count,
/// on resume. State is a multiset of typed records ([`StateRecord`]), reported as changes
/// (`+1` in, `-1` out) at the epoch they happen; the runtime consolidates them up to each
/// checkpointed epoch and writes them in [`crate::state`]'s versioned envelope.
pub trait StatefulStep: Send {
    /// The [`StateRecord::KIND`] of its records, written with them.
    fn state_kind(&self) -> &'static str;

    /// Attaches the operator to `stream`. `state` holds every record of the checkpoint resumed
    /// from (all workers' state: each worker keeps the records it owns), to be in place before
    /// `first_epoch`; empty on a fresh start. Returns the output and the state's changes.
    ///
    /// A run's checkpoints consolidate that run's changes only, so the changes must start by
    /// re-announcing the restored records the worker keeps (`+1` at an epoch before
    /// `first_epoch`, such as `first_epoch - 1`); otherwise the next checkpoint loses them.
    fn attach<'scope>(
        self: Box<Self>,
        stream: BatchStream<'scope>,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>);
}

/// State per key: [`KeyedState::keyed`] as a step.
impl<L: KeyedLogic> StatefulStep for Keyed<L> {
    fn state_kind(&self) -> &'static str {
        KeyedRecord::<L::State>::KIND
    }

    fn attach<'scope>(
        self: Box<Self>,
        stream: BatchStream<'scope>,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>) {
        let Keyed { logic, key } = *self;
        stream.keyed(&key, logic, metrics, state, first_epoch)
    }
}

/// Where an exchange sends rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// To the worker owning each row's key (a string or integer column).
    Key(String),
    /// Whole batches round-robin to all workers.
    All,
    /// Whole batches to these workers, which alone run the stages up to the next exchange.
    Workers(Vec<usize>),
    /// To the least delayed of these workers (empty: all), keeping a key's rows together.
    Balance(Vec<usize>, Option<String>),
    /// Every batch cut into one slice per worker, runs of equal values in the column kept whole.
    Spread(Option<String>),
}

/// A stage with instrumentation around it: a fixed delay per batch (a stand-in for a worker
/// on a loaded or slower machine) and/or its busy time added to its worker's load (for
/// balanced exchanges).
pub(crate) struct Instrumented {
    pub(crate) inner: Box<dyn Stage>,
    pub(crate) delay: Duration,
    pub(crate) service: Option<ServiceCell>,
}

impl Instrumented {
    pub(crate) fn timed(inner: Box<dyn Stage>, service: &ServiceCell) -> Box<dyn Stage> {
        Box::new(Instrumented {
            inner,
            delay: Duration::ZERO,
            service: Some(service.clone()),
        })
    }
}

impl Stage for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.inner.output_schema(input)
    }

    fn preserves_rows(&self) -> bool {
        self.inner.preserves_rows()
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let started = Instant::now();
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let out = self.inner.process_batch(batch);
        if let Some(cell) = &self.service {
            let mut s = service(cell);
            s.busy_ns += started.elapsed().as_nanos() as u64;
            s.busy_rows += batch.num_rows() as u64;
            // Rows this stage let go (filtered, dead letters) are done here: they would
            // otherwise count as waiting on this worker for good.
            if let Ok(o) = &out {
                let dropped = batch.num_rows().saturating_sub(o.records.num_rows());
                s.done_rows += dropped as u64;
            }
        }
        out
    }
}
