//! The run loop: a [`Job`] (source → steps → sink, with its epoch and checkpoint policies) run
//! on timely workers across threads and processes.
//!
//! ```text
//!            worker i of n (every process runs the same dataflow)
//! source ─partition(i, n)─▶ epochs ─▶ steps (stages, exchanges) ─▶ sink (worker 0)
//!    │                         │ flow control: ≤ max_in_flight epochs ahead of the sink
//!    └─ positions ─────────────┴─▶ checkpointer (worker 0): when the sink's and the
//!                                  positions' frontiers pass epoch e, write positions,
//!                                  stateful steps' state and the sink's position for e
//! ```
//! - [`step`]: what a job is made of ([`JobStep`], [`Step`], [`Route`], [`StatefulStep`]).
//! - `chain`: the operators one worker builds from the steps.
//! - [`checkpointing`]: progress-driven checkpoints and where a run starts.
//! - `liveness`: heartbeats between workers, so a lost peer fails the run instead of hanging it.
//! - `worker`: one worker's loop (read, epoch, flow control, checkpoint, liveness).
//!
//! The runtime knows no pipeline file: `riffle-pipelines` turns YAML into a [`Job`].

mod chain;
pub mod checkpointing;
mod liveness;
pub mod step;
#[cfg(test)]
mod tests;
mod worker;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use chain::Restored;
pub use step::{BuildStep, JobStep, Route, StatefulStep, Step, StepKind};

use crate::cluster::ClusterConfig;
use crate::metrics::{Metrics, Summary};
use crate::sink::SinkFactory;
use crate::{DataflowError, SourceFactory};

/// A dataflow-level job: everything the runtime needs to run, nothing about files it came from.
pub struct Job {
    /// Shown in logs and errors.
    pub name: String,
    pub source: Arc<dyn SourceFactory>,
    pub steps: Vec<JobStep>,
    pub sink: Arc<dyn SinkFactory>,
    pub dead_letter: Arc<dyn SinkFactory>,
    pub epochs: EpochPolicy,
    pub checkpoint: Option<CheckpointPolicy>,
    /// Adds a column of this name to every result: its end-to-end latency in milliseconds.
    pub latency_column: Option<String>,
    /// A peer worker silent this long fails the run (so supervisors restart the cluster).
    pub peer_timeout: Duration,
    /// Testing and demos: one worker's batched stages are slower by a fixed delay per batch.
    pub slow_worker: Option<SlowWorker>,
}

/// How records are grouped into epochs, the unit of progress tracking and checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochPolicy {
    /// Records each source worker puts in one epoch.
    pub records: usize,
    /// Epochs a source may run ahead of the sink before it waits (bounds memory).
    pub max_in_flight: u64,
}

/// Where checkpoints go and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    pub dir: PathBuf,
    /// Checkpoints kept (older ones are deleted).
    pub keep: usize,
    /// At most one checkpoint per interval (zero: at every completed epoch).
    pub interval: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowWorker {
    pub worker: usize,
    pub delay: Duration,
}

/// What a run did (this process's view).
#[derive(Debug)]
pub struct RunReport {
    pub summary: Summary,
    pub workers: usize,
}

/// Runs the job to the end of its sources. Worker errors (a sink that cannot write, a source
/// that fails) end the run and are returned; bad records never do: they go to the dead-letter
/// sink.
pub fn run(
    job: Arc<Job>,
    cluster: &ClusterConfig,
    metrics: Arc<Metrics>,
) -> Result<RunReport, DataflowError> {
    let started = Instant::now();
    // Registered up front so the summary lists stages in pipeline order.
    metrics.stage("source")?;
    for step in &job.steps {
        // Exchanges only move rows; they have no per-batch work to report.
        if matches!(step.kind, StepKind::Stage(_)) {
            metrics.stage(&step.name)?;
        }
    }
    metrics.stage("sink")?;
    metrics.stage("dead-letters")?;
    job.source.attach_metrics(&metrics)?;
    job.sink.attach_metrics(&metrics)?;
    job.dead_letter.attach_metrics(&metrics)?;
    let start = Arc::new(checkpointing::start(&job)?);
    let (builders, communication) = cluster.build().map_err(DataflowError::Cluster)?;
    let errors: Arc<Mutex<Vec<DataflowError>>> = Arc::default();
    let worker_errors = errors.clone();
    let worker_metrics = metrics.clone();
    let guards = timely::execute::execute_from(
        builders,
        communication,
        timely::WorkerConfig::default(),
        move |worker| {
            let result = worker::run_worker(worker, &job, &start, &worker_metrics, &worker_errors);
            if let Err(e) = result {
                tracing::error!(worker = worker.index(), "{e}");
                if let Ok(mut errs) = worker_errors.lock() {
                    errs.push(e);
                }
            }
            // After a failure the dataflows can never complete (a peer stopped feeding them);
            // timely would wait for them forever, so drop them.
            if !worker::healthy(&worker_errors) {
                for id in worker.installed_dataflows() {
                    worker.drop_dataflow(id);
                }
            }
        },
    )
    .map_err(DataflowError::Cluster)?;
    // A lost peer makes timely's network threads panic, its workers follow, and joining the
    // network threads panics in turn: all of it is one error here.
    // (The panic payloads say nothing more: the network thread's message was logged.)
    let lost = || {
        DataflowError::Cluster(
            "lost the connection to another process of the cluster (it exited, or its host is \
             unreachable)"
                .into(),
        )
    };
    let outcomes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guards.join()))
        .map_err(|_| lost())?;
    for outcome in outcomes {
        outcome.map_err(|e| DataflowError::Cluster(format!("a worker thread panicked: {e}")))?;
    }
    let mut errors = errors
        .lock()
        .map_err(|_| DataflowError::Cluster("a worker panicked".into()))?;
    if let Some(e) = errors.drain(..).next() {
        return Err(e);
    }
    Ok(RunReport {
        summary: metrics.summary(started.elapsed()),
        workers: cluster.total_workers(),
    })
}
