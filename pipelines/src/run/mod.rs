//! The run lifecycle, as `riffle run` has it, for any program: load and validate the pipeline
//! with the run's overrides (`output`, `checkpoint_dir` or `checkpoint_url`), take the run locks, stop on SIGTERM
//! or SIGINT at the end of the open epochs, run the workers (or start and supervise a cluster
//! of processes on this host, restarting it from its checkpoints after a crash), and pick the
//! exit code (too many dead letters: [`exit::DEAD_LETTERS`]).
//!
//! ```text
//! RunOptions ──Run::prepare──▶ Run::Process(ProcessRun)  ──execute──▶ RunOutcome
//!   (file, overrides,          load, overrides, locks,       workers      report, elapsed,
//!    cluster, restarts)        signals, metrics              run          dead-letter verdict,
//!                         └──▶ Run::Supervise(Supervisor) ──execute──▶    exit_code()
//!                              load, locks, signals          processes,
//!                                                            restarts
//! ```
//! - [`run()`]: the whole lifecycle in one call; [`Run::prepare`] then [`Run::execute`] when
//!   the caller serves metrics or shows progress in between (as `riffle run` does).
//! - [`cluster`]: where the workers are ([`ClusterSpec`], `--workers auto`).
//! - [`exit`]: the exit-code policy ([`TooManyDeadLetters`]).
//! - `launch` and `supervise`: a local cluster's processes, and their restarts.
//! - [`execute()`]: one attempt of a loaded pipeline, with none of the lifecycle (benchmarks).
//!
//! # Examples
//!
//! A program embedding Riffle: the bundled clickstream's top-slot impressions, written where
//! the program says, end as `riffle run --output …` would, exit code included.
//! ```
//! use riffle_pipelines::run::{run, RunError, RunOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let clicks = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/clickstream/obd-random-all-2000.csv");
//! let file = dir.path().join("top-slot.yaml");
//! std::fs::write(
//!     &file,
//!     format!(
//!         r#"
//! name: top-slot
//! source: {{ csv: {{ path: "{clicks}", batch_size: 256 }} }}
//! stages:
//!   - filter: {{ column: position, op: eq, value: 1 }}
//!   - select: {{ columns: [item_id, click] }}
//! sink: {{ jsonl: {{ path: top-slot.jsonl }} }}
//! runtime: {{ workers: 2 }}
//! "#
//!     ),
//! )?;
//! let results = dir.path().join("results.jsonl");
//!
//! let outcome = match run(RunOptions::new(&file).output(&results)) {
//!     Ok(outcome) => outcome,
//!     Err(e) => {
//!         eprintln!("error: {e}");
//!         std::process::exit(e.exit_code());
//!     }
//! };
//! let report = outcome.report.as_ref().ok_or("one process reports its own figures")?;
//! eprint!("{}", report.summary);
//! if let Some(too_many) = &outcome.dead_letters {
//!     eprintln!("error: {too_many}");
//! }
//! assert_eq!(outcome.exit_code(), 0);
//! let written = std::fs::read_to_string(&results)?;
//! assert_eq!(written.lines().count() as u64, report.summary.results);
//! assert!(report.summary.results > 0 && report.summary.results < 2000);
//!
//! // The overrides are checked as `riffle run` checks them: a CSV file cannot resume.
//! let refused = run(RunOptions::new(&file).checkpoint_dir(dir.path().join("checkpoints")));
//! let Err(e @ RunError::Pipeline(_)) = refused else { panic!("{refused:?}") };
//! assert!(e.to_string().contains("--checkpoint-dir: a `csv` source cannot resume"), "{e}");
//! assert_eq!(e.exit_code(), 1);
//! # Ok(())
//! # }
//! ```

pub mod cluster;
mod error;
pub mod exit;
mod launch;
mod outcome;
mod panics;
mod process;
mod signals;
mod supervise;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::observe::RunContext;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::DataflowError;

pub use cluster::{ClusterSpec, Workers, CLUSTER_TOKEN};
pub use error::RunError;
pub use exit::TooManyDeadLetters;
pub use launch::{LOCKS_HELD, PIPELINE_TEXT};
pub use outcome::RunOutcome;
pub use panics::quiet_network_panics;
pub use process::ProcessRun;
pub use riffle_dataflow::runtime::RunReport;
pub use signals::StopSignals;
pub use supervise::Supervisor;

use crate::validate::Pipeline;

/// Extra arguments for one process of a local cluster, by its index.
type ProcessArgs = Arc<dyn Fn(usize) -> Vec<OsString> + Send + Sync>;

/// What to run and how: `riffle run`'s arguments, as a builder.
///
/// `RunOptions::new(file)` alone runs as `riffle run FILE` does: the pipeline's own workers,
/// one process, stopping on SIGTERM or SIGINT.
#[derive(Clone)]
pub struct RunOptions {
    file: PathBuf,
    output: Option<PathBuf>,
    checkpoint_dir: Option<PathBuf>,
    checkpoint_url: Option<String>,
    cluster: ClusterSpec,
    max_restarts: usize,
    stop_on_signals: bool,
    metrics: Option<Arc<Metrics>>,
    program: Option<PathBuf>,
    program_args: Vec<OsString>,
    process_args: Option<ProcessArgs>,
    text: Option<String>,
    sink: Option<Arc<dyn SinkFactory>>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("file", &self.file)
            .field("output", &self.output)
            .field("checkpoint_dir", &self.checkpoint_dir)
            .field("checkpoint_url", &self.checkpoint_url)
            .field("cluster", &self.cluster)
            .field("max_restarts", &self.max_restarts)
            .field("stop_on_signals", &self.stop_on_signals)
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

impl RunOptions {
    /// Runs the pipeline file `file` (relative paths in it are relative to its folder).
    pub fn new(file: impl Into<PathBuf>) -> Self {
        RunOptions {
            file: file.into(),
            output: None,
            checkpoint_dir: None,
            checkpoint_url: None,
            cluster: ClusterSpec::default(),
            max_restarts: 10,
            stop_on_signals: true,
            metrics: None,
            program: None,
            program_args: Vec::new(),
            process_args: None,
            text: None,
            sink: None,
        }
    }

    /// Runs the pipeline `text` (YAML or JSON) instead of reading `file`, which names it in
    /// errors and whose folder its relative paths start from. A local cluster's processes are
    /// given the text in their environment ([`PIPELINE_TEXT`]).
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    /// Results go to `sink` instead of the pipeline's own (a program that takes them itself);
    /// the dead letters stay where the pipeline puts them.
    pub fn sink(mut self, sink: Arc<dyn SinkFactory>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Results go to this file instead of the sink's configured path (`--output`).
    pub fn output(mut self, path: impl Into<PathBuf>) -> Self {
        self.output = Some(path.into());
        self
    }

    /// Checkpoints into this directory and resumes from it, overriding
    /// `runtime.checkpoint.dir` (`--checkpoint-dir`); the source must be able to resume.
    pub fn checkpoint_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checkpoint_dir = Some(dir.into());
        self.checkpoint_url = None;
        self
    }

    /// Checkpoints under this object-store prefix (`s3://bucket/prefix`) and resumes from it,
    /// overriding `runtime.checkpoint`'s `dir` or `url` (`--checkpoint-url`); the connection
    /// settings are the file's `runtime.checkpoint` keys, else the usual AWS variables.
    pub fn checkpoint_url(mut self, url: impl Into<String>) -> Self {
        self.checkpoint_url = Some(url.into());
        self.checkpoint_dir = None;
        self
    }

    /// Where the workers are: threads, processes, this process's index, a hostfile.
    pub fn cluster(mut self, cluster: ClusterSpec) -> Self {
        self.cluster = cluster;
        self
    }

    /// Worker threads per process (`--workers`), instead of the pipeline's `runtime.workers`.
    pub fn workers(mut self, workers: Workers) -> Self {
        self.cluster.workers = Some(workers);
        self
    }

    /// How many times in a row a supervisor restarts a failed local cluster
    /// (`--max-restarts`, default 10); a run that stayed up a minute starts the count afresh.
    pub fn max_restarts(mut self, restarts: usize) -> Self {
        self.max_restarts = restarts;
        self
    }

    /// Whether the run installs its SIGTERM/SIGINT handler ([`StopSignals`]; default: yes).
    /// Without it, [`riffle_dataflow::runtime::request_stop`] stops the run.
    pub fn stop_on_signals(mut self, on: bool) -> Self {
        self.stop_on_signals = on;
        self
    }

    /// The registry the run fills (default: a new one, see [`ProcessRun::metrics`]).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The program a supervisor starts for each process of a local cluster (default: this
    /// one). It is given `riffle run`'s arguments: `run FILE --processes N --process I
    /// --base-port P [--workers W] [--output O] [--checkpoint-dir D | --checkpoint-url U]`, then
    /// [`Self::process_args`]'s.
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// Arguments the program gets before `run FILE …` (`-m riffle` when it is a Python
    /// interpreter).
    pub fn program_args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.program_args = args.into_iter().map(Into::into).collect();
        self
    }

    /// More arguments for process `i` of a local cluster, after the ones it always gets.
    pub fn process_args(
        mut self,
        args: impl Fn(usize) -> Vec<OsString> + Send + Sync + 'static,
    ) -> Self {
        self.process_args = Some(Arc::new(args));
        self
    }
}

/// A run, prepared: its pipeline validated and its locks taken, nothing started yet.
#[derive(Debug)]
pub enum Run {
    /// This process starts a cluster of processes on this host and supervises it.
    Supervise(Box<Supervisor>),
    /// This process runs workers (alone, or as one process of a cluster).
    Process(Box<ProcessRun>),
}

impl Run {
    /// Loads and validates the pipeline with the options' overrides, decides this process's
    /// part, takes the run locks (unless a supervisor holds them for its cluster, or another
    /// process of a hand-started cluster does) and installs the stop signals.
    pub fn prepare(options: RunOptions) -> Result<Run, RunError> {
        let pipeline = Arc::new(load(&options)?);
        // One run at a time per checkpoint directory and output: a supervisor takes the locks
        // for its cluster and passes them down, so its own processes do not take them again.
        let supervised = std::env::var_os(LOCKS_HELD).is_some();
        if options.cluster.launches_locally() {
            let lock = crate::RunLock::acquire(&pipeline)?;
            // SIGTERM or Ctrl-C reach the supervisor only: it passes them on to its processes.
            let signals = install_signals(&options)?;
            return Ok(Run::Supervise(Box::new(Supervisor {
                options,
                pipeline,
                lock,
                signals,
            })));
        }
        let cluster = options.cluster.config(&pipeline)?;
        // Process 0 holds them for a cluster started by hand (or from a hostfile).
        let lock = if supervised || cluster.process != 0 {
            None
        } else {
            Some(crate::RunLock::acquire(&pipeline)?)
        };
        if matches!(options.cluster.workers, Some(Workers::Auto)) {
            // The target keeps log lines as they were when the binary printed the plan.
            tracing::info!(
                target: "riffle",
                "plan:\n{}",
                crate::plan::describe(&pipeline, cluster.threads, cluster.processes())
            );
        }
        let signals = install_signals(&options)?;
        let metrics = match options.metrics {
            Some(metrics) => metrics,
            None => Metrics::new()?,
        };
        Ok(Run::Process(Box::new(ProcessRun {
            pipeline,
            cluster,
            context: metrics.into(),
            lock,
            signals,
        })))
    }

    /// Runs it to its end: see [`ProcessRun::execute`] and [`Supervisor::execute`].
    pub fn execute(self) -> Result<RunOutcome, RunError> {
        match self {
            Run::Supervise(supervisor) => supervisor.execute(),
            Run::Process(process) => process.execute(),
        }
    }
}

/// The whole run lifecycle of `riffle run`: [`Run::prepare`], then [`Run::execute`].
pub fn run(options: RunOptions) -> Result<RunOutcome, RunError> {
    Run::prepare(options)?.execute()
}

/// One attempt at running a loaded pipeline to the end of its sources, with none of the
/// lifecycle (no locks, signals, restarts or verdict): the planner's job on the runtime's run
/// loop (see [`riffle_dataflow::runtime::run`]), reporting to `context` (or a registry).
pub fn execute(
    pipeline: Arc<Pipeline>,
    cluster: &ClusterConfig,
    context: impl Into<RunContext>,
) -> Result<RunReport, DataflowError> {
    let job = crate::plan::job(&pipeline)?;
    riffle_dataflow::runtime::run(Arc::new(job), cluster, context)
}

/// The pipeline of the run, with its `output` and `checkpoint_dir` or `checkpoint_url`.
fn load(options: &RunOptions) -> Result<Pipeline, RunError> {
    // A process of a supervisor that was given the pipeline as text gets it from there.
    let inherited = match (&options.text, std::env::var_os(LOCKS_HELD)) {
        (None, Some(_)) => std::env::var(PIPELINE_TEXT).ok(),
        _ => None,
    };
    let mut pipeline = match options.text.as_ref().or(inherited.as_ref()) {
        Some(text) => crate::load_text(&options.file, text, options.output.as_deref())?,
        None => crate::load(&options.file, options.output.as_deref())?,
    };
    if let Some(sink) = &options.sink {
        pipeline.sink = sink.clone();
    }
    let file = pipeline.runtime.checkpoint.clone().unwrap_or_default();
    if let Some(dir) = &options.checkpoint_dir {
        // The file's policy (keep, interval) stays; an object store's settings do not apply.
        pipeline.set_checkpoint(crate::spec::CheckpointConfig {
            dir: Some(dir.clone()),
            url: None,
            ..crate::spec::CheckpointConfig {
                keep: file.keep,
                interval_ms: file.interval_ms,
                give_up_s: file.give_up_s,
                lease_s: file.lease_s,
                ..Default::default()
            }
        })?;
    } else if let Some(url) = &options.checkpoint_url {
        pipeline.set_checkpoint(crate::spec::CheckpointConfig {
            dir: None,
            url: Some(url.clone()),
            ..file
        })?;
    }
    Ok(pipeline)
}

fn install_signals(options: &RunOptions) -> Result<Option<StopSignals>, RunError> {
    if options.stop_on_signals {
        StopSignals::install().map(Some)
    } else {
        Ok(None)
    }
}
