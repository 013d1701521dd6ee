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

mod agree;
mod chain;
pub mod checkpointing;
mod epochs;
mod liveness;
mod pending;
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
use crate::observe::summary::Summary;
use crate::observe::RunContext;
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
    /// Results as they exist, before their epoch commits: uncommitted, written on worker 0 as
    /// they reach the sink operator.
    pub live_sink: Option<Arc<dyn SinkFactory>>,
    /// Events taken out of the results (one row per entry of their list columns), written to
    /// a sink of their own on worker 0 as each epoch's results are.
    pub events: Option<EventsOutput>,
    pub epochs: EpochPolicy,
    pub checkpoint: Option<CheckpointPolicy>,
    /// Adds a column of this name to every result: its end-to-end latency in milliseconds.
    pub latency_column: Option<String>,
    /// A peer worker silent this long fails the run (so supervisors restart the cluster).
    pub peer_timeout: Duration,
    /// Testing and demos: one worker's batched stages are slower by a fixed delay per batch.
    pub slow_worker: Option<SlowWorker>,
}

/// The `events:` output of a job.
#[derive(Clone)]
pub struct EventsOutput {
    pub spec: crate::events::EventsSpec,
    /// The event rows' schema, from [`crate::events::EventsSpec::schema`].
    pub schema: arrow_schema::SchemaRef,
    pub sink: Arc<dyn SinkFactory>,
}

/// How records are grouped into epochs, the unit of progress tracking and checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochPolicy {
    /// Records each source worker puts in one epoch.
    pub records: usize,
    /// An epoch also closes once it has been open this long with records in it, so a slow
    /// source's results complete (and reach committed sinks) after at most this wait.
    pub max_duration: Option<Duration>,
    /// Epochs a source may run ahead of the sink before it waits (bounds memory).
    pub max_in_flight: u64,
}

/// Where checkpoints go and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    pub at: CheckpointTarget,
    /// Checkpoints kept (older ones are deleted).
    pub keep: usize,
    /// At most one checkpoint per interval (zero: at every completed epoch).
    pub interval: Duration,
    /// An object store failing for this long fails the run; until then its checkpoints are
    /// only delayed (retried). A local directory's failure fails the run at once.
    pub give_up: Duration,
    /// An object store's lease ([`crate::checkpoint::lease`]): a holder that has not renewed
    /// it for this long is taken over.
    pub lease_timeout: Duration,
}

/// A local (or shared) directory, or an object store's prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointTarget {
    Dir(PathBuf),
    /// `s3://bucket/prefix` with its connection settings.
    Store {
        url: String,
        options: riffle_storage::StoreOptions,
    },
}

impl CheckpointPolicy {
    /// Checkpoints in `dir`, at every completed epoch, keeping 3.
    pub fn dir(dir: impl Into<PathBuf>) -> Self {
        Self::at(CheckpointTarget::Dir(dir.into()))
    }

    /// Checkpoints under an object store's `url`, at every completed epoch, keeping 3.
    pub fn store(url: impl Into<String>, options: riffle_storage::StoreOptions) -> Self {
        Self::at(CheckpointTarget::Store {
            url: url.into(),
            options,
        })
    }

    fn at(at: CheckpointTarget) -> Self {
        CheckpointPolicy {
            at,
            keep: 3,
            interval: Duration::ZERO,
            give_up: Duration::from_secs(300),
            lease_timeout: Duration::from_secs(30),
        }
    }

    /// The directory or the URL, for messages.
    pub fn describe(&self) -> String {
        match &self.at {
            CheckpointTarget::Dir(dir) => dir.display().to_string(),
            CheckpointTarget::Store { url, .. } => url.clone(),
        }
    }
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

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks every worker of this process to stop reading: the input ends where each worker is,
/// the epochs already read complete, are written and checkpointed, and [`run`] returns as at
/// the end of the input. A worker stuck in one call (a sink waiting for its brokers, a source
/// blocked in a read) for [`STOP_STALL`] after the request does not hold the run: [`run`] then
/// returns an error naming it, and a restart resumes from the last checkpoint; if no worker
/// had read anything yet (one still loading a model), [`run`] returns as at the end of the
/// input instead. Safe to call from a signal handler's thread.
pub fn request_stop() {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Withdraws a [`request_stop`], so that a program running pipelines one after another (the
/// Python package) starts the next one unstopped.
pub fn clear_stop_request() {
    STOP.store(false, std::sync::atomic::Ordering::SeqCst);
}

/// Whether [`request_stop`] was called.
pub fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}

/// Runs the job to the end of its sources. Worker errors (a sink that cannot write, a source
/// that fails) end the run and are returned; bad records never do: they go to the dead-letter
/// sink. The run reports to `context` (an `Arc<Metrics>` converts into one without a live tap):
/// stage metrics, readiness, dead-letter reasons, and the live tap when a viewer put one there.
///
/// # Examples
/// The numbers 0..100 over two worker threads, doubled by one stage, collected by a sink
/// (which worker 0 opens and writes).
/// ```
/// # use std::sync::{Arc, Mutex};
/// # use arrow_array::{cast::AsArray, types::Int64Type, ArrayRef, Int64Array, RecordBatch};
/// # use arrow_schema::{DataType, Field, Schema, SchemaRef};
/// # use riffle_dataflow::{cluster::ClusterConfig, observe::RunContext, sink::SinkFactory};
/// # use riffle_dataflow::{DataflowResult, Sink, Source, SourceBatch, SourceFactory, Stage, StageOutput};
/// use riffle_dataflow::runtime::{run, EpochPolicy, Job, JobStep, Step, StepKind};
/// # fn numbers(v: Vec<i64>) -> RecordBatch {
/// #     RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(v)) as ArrayRef)]).unwrap()
/// # }
/// # fn column(b: &RecordBatch) -> &[i64] { b.column(0).as_primitive::<Int64Type>().values() }
/// /// Worker `i` of `n` reads the numbers ≡ i (mod n), in one batch (`Part`, hidden).
/// struct Numbers;
/// impl SourceFactory for Numbers {
///     fn schema(&self) -> DataflowResult<SchemaRef> {
///         Ok(Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)])))
///     }
///     fn partition(&self, i: usize, n: usize) -> DataflowResult<Box<dyn Source>> {
///         Ok(Box::new(Part(Some((0..100).filter(|x| *x as usize % n == i).collect()))))
///     }
/// }
/// # struct Part(Option<Vec<i64>>);
/// # impl Source for Part {
/// #     fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
/// #         Ok(self.0.take().map(|v| SourceBatch::new(numbers(v), Vec::new())))
/// #     }
/// # }
/// struct Double;
/// impl Stage for Double {
///     fn name(&self) -> &str { "double" }
///     fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> { Ok(input.clone()) }
///     fn process_batch(&mut self, b: &RecordBatch) -> DataflowResult<StageOutput> {
///         Ok(StageOutput::all(numbers(column(b).iter().map(|x| x * 2).collect())))
///     }
/// }
/// /// A `SinkFactory` whose sinks append every result here (impls hidden).
/// #[derive(Clone, Default)]
/// struct Collect(Arc<Mutex<Vec<i64>>>);
/// # impl SinkFactory for Collect {
/// #     fn open(&self) -> DataflowResult<Box<dyn Sink>> { Ok(Box::new(self.clone())) }
/// # }
/// # impl Sink for Collect {
/// #     fn write_batch(&mut self, b: &RecordBatch) -> DataflowResult<()> {
/// #         Ok(self.0.lock().unwrap().extend(column(b)))
/// #     }
/// #     fn flush(&mut self) -> DataflowResult<()> { Ok(()) }
/// # }
///
/// let results = Collect::default();
/// let job = Job {
///     name: "double".into(),
///     source: Arc::new(Numbers),
///     steps: vec![JobStep {
///         name: "double".into(),
///         at: "stages[0]".into(),
///         kind: StepKind::Stage(Arc::new(|_worker, _peers| Ok(Step::Apply(Box::new(Double))))),
///     }],
///     sink: Arc::new(results.clone()),
///     dead_letter: Arc::new(Collect::default()),
///     live_sink: None,
///     events: None,
///     epochs: EpochPolicy { records: 10, max_duration: None, max_in_flight: 4 },
///     checkpoint: None,
///     latency_column: None,
///     peer_timeout: std::time::Duration::from_secs(30),
///     slow_worker: None,
/// };
/// let report = run(Arc::new(job), &ClusterConfig::single_process(2), RunContext::new()?)?;
/// assert_eq!(report.workers, 2);
/// let mut doubled = results.0.lock().unwrap().clone();
/// doubled.sort();
/// assert_eq!(doubled, (0..100).map(|x| x * 2).collect::<Vec<_>>());
/// # Ok::<(), riffle_dataflow::DataflowError>(())
/// ```
/// This process's workers start reading together: an epoch completes only once every worker
/// has passed it, so one that read while another still loaded its models would only see its
/// results wait (and a throughput clock would count the loading).
pub(crate) struct StartGate {
    pub(crate) ready: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) workers: usize,
    /// When the first worker went on: the origin of epochs numbered by time.
    pub(crate) released: Arc<std::sync::OnceLock<Instant>>,
    /// When each worker of this process was last in its loop (the run's watch reads them).
    pub(crate) pulses: Arc<liveness::Pulses>,
    /// The workers of this process, waking each other when an idle one holds an epoch back.
    pub(crate) local: Arc<epochs::LocalPeers>,
}

/// How long a run with a failed worker waits for its other workers to wind down before it
/// returns the error anyway: one may be stuck in a call (a sink waiting out its delivery
/// timeout) and would hold the failure back for as long.
const FAILED_GRACE: Duration = Duration::from_secs(5);

/// After a stop request, how long a worker may stay in one call (away from its loop) before
/// the run ends without it.
pub const STOP_STALL: Duration = Duration::from_secs(10);

/// Why the run stopped waiting for its workers before they all finished.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A worker failed, and the others did not finish within [`FAILED_GRACE`].
    Failed,
    /// A stop was requested, and worker `worker` (its index in the cluster) has not been back
    /// in its loop for `away`, [`STOP_STALL`] of it since the request.
    Stuck { worker: usize, away: Duration },
    /// As `Stuck`, but before any worker of this process went on to read (worker `worker` was
    /// still loading its stages or opening its source): nothing was read, so the run ends as
    /// cleanly as a finished one would.
    NotStarted { worker: usize, away: Duration },
}

/// What the thread that waits for the workers has seen: when a failure, and a stop request,
/// first showed.
#[derive(Default)]
struct Watch {
    failed_at: Option<Instant>,
    stop_at: Option<Instant>,
}

impl Watch {
    /// Whether to stop waiting at `now`. `unfinished`: each worker of this process still
    /// running, as its index in the cluster and when it was last in its loop. `started`: a
    /// worker of this process has gone on to read.
    fn check(
        &mut self,
        now: Instant,
        failed: bool,
        stop: bool,
        started: bool,
        unfinished: impl IntoIterator<Item = (usize, Instant)>,
    ) -> Option<Verdict> {
        if failed {
            let at = *self.failed_at.get_or_insert(now);
            return (now.saturating_duration_since(at) >= FAILED_GRACE).then_some(Verdict::Failed);
        }
        if !stop {
            return None;
        }
        let at = *self.stop_at.get_or_insert(now);
        unfinished.into_iter().find_map(|(worker, last)| {
            let away = now.saturating_duration_since(last);
            (now.saturating_duration_since(last.max(at)) >= STOP_STALL).then_some(if started {
                Verdict::Stuck { worker, away }
            } else {
                Verdict::NotStarted { worker, away }
            })
        })
    }
}

pub fn run(
    job: Arc<Job>,
    cluster: &ClusterConfig,
    context: impl Into<RunContext>,
) -> Result<RunReport, DataflowError> {
    let started = Instant::now();
    let context: RunContext = context.into();
    let metrics = &context.metrics;
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
    // Sources and sinks register their own metrics with the registry.
    job.source.attach_metrics(metrics)?;
    job.sink.attach_metrics(metrics)?;
    job.dead_letter.attach_metrics(metrics)?;
    // Worker 0, which opens the sink, lives in process 0. Made beside the workers' model
    // loading; they wait for it before building their dataflows.
    let start = Arc::new(pending::PendingStart::spawn(
        job.clone(),
        cluster.process == 0,
    )?);
    let (builders, communication) = cluster.build().map_err(DataflowError::Cluster)?;
    let errors: Arc<Mutex<Vec<DataflowError>>> = Arc::default();
    let worker_errors = errors.clone();
    let worker_context = context.clone();
    let pulses = Arc::new(liveness::Pulses::new(cluster.threads));
    let gate = StartGate {
        ready: Arc::default(),
        workers: cluster.threads,
        released: Arc::default(),
        pulses: pulses.clone(),
        local: Arc::default(),
    };
    let released = gate.released.clone();
    let guards = timely::execute::execute_from(
        builders,
        communication,
        timely::WorkerConfig::default(),
        move |worker| {
            let result =
                worker::run_worker(worker, &job, &start, &worker_context, &worker_errors, &gate);
            if let Err(e) = result {
                tracing::error!(worker = worker.index(), "{e}");
                if let Ok(mut errs) = worker_errors.lock() {
                    errs.push(e);
                }
            }
            worker::wind_down(worker, &worker_errors, &gate);
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
    // Joining also joins the network threads, which wait for every peer to hang up. After a
    // failure here the peers would wait for this process until their peer timeout: once the
    // workers are done, the error is returned with those threads left to the process's exit,
    // which closes the connections and tells the peers at once.
    // A worker that failed stops the run within seconds, and a stop request always stops it:
    // a worker stuck in a call is left behind (the process's exit ends it).
    let mut watch = Watch::default();
    let first_worker = cluster.process * cluster.threads;
    while !guards.guards().iter().all(|g| g.is_finished()) {
        let unfinished = guards
            .guards()
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.is_finished())
            .map(|(local, _)| (first_worker + local, pulses.last(local)));
        let verdict = watch.check(
            Instant::now(),
            !worker::healthy(&errors),
            stop_requested(),
            released.get().is_some(),
            unfinished,
        );
        if let Some(Verdict::NotStarted { worker, away }) = verdict {
            // A model that takes minutes to load should not turn Ctrl-C into a failed run.
            tracing::warn!(
                "stopped on request before reading anything: worker {worker} has been starting \
                 (loading its stages or opening its source) for {:.1} s; the run ends without it",
                away.as_secs_f64()
            );
            std::mem::forget(guards);
            return Ok(RunReport {
                summary: context.summary(started.elapsed()),
                workers: cluster.total_workers(),
            });
        }
        if let Some(verdict) = verdict {
            let first = errors.lock().ok().and_then(|mut e| e.drain(..).next());
            std::mem::forget(guards);
            return Err(first.unwrap_or_else(|| abandoned(&verdict)));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    if cluster.processes() > 1 && !worker::healthy(&errors) {
        let first = errors.lock().ok().and_then(|mut e| e.drain(..).next());
        std::mem::forget(guards);
        return Err(first.unwrap_or_else(lost));
    }
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
        summary: context.summary(started.elapsed()),
        workers: cluster.total_workers(),
    })
}

/// The error of a run whose workers were left behind without an error of their own.
fn abandoned(verdict: &Verdict) -> DataflowError {
    match verdict {
        Verdict::Stuck { worker, away } => DataflowError::stage(
            "runtime",
            format!(
                "stopped on request, but worker {worker} has been in one call (a stage, the \
                 source or a sink) for {:.1} s: the run ends without finishing its open epochs; \
                 a restart resumes from the last checkpoint",
                away.as_secs_f64()
            ),
        ),
        // The failure's own error was taken already (or its lock poisoned by a panic).
        Verdict::Failed => DataflowError::Cluster("a worker failed".into()),
        // Never an error: `run` returns before asking.
        Verdict::NotStarted { worker, .. } => {
            DataflowError::Cluster(format!("stopped while worker {worker} was starting"))
        }
    }
}
