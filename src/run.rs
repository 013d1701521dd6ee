//! `riffle run`: the command line made into the library's [`RunOptions`], and what this
//! process shows around the run lifecycle (progress, summary, metrics and the live view). The
//! lifecycle itself (overrides, locks, signals, launch, restarts, exit code) is
//! [`riffle_pipelines::run`](mod@riffle_pipelines::run)'s.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use riffle_dataflow::observe::registry::Metrics;
use riffle_pipelines::run::{ProcessRun, Run, RunOptions, RunOutcome};

use crate::cli::{LogFormat, RunArgs};
use crate::serve::Endpoints;

/// Runs the pipeline; returns the exit code of a run that did not fail.
pub fn run_command(args: RunArgs, log_format: LogFormat) -> Result<i32> {
    let mut run = Run::prepare(options(&args, log_format))?;
    let shown = match &mut run {
        Run::Process(process) => Some(Shown::start(&args, process)?),
        // A supervisor's processes show their own (process 0 its progress and summary).
        Run::Supervise(_) => None,
    };
    let outcome = run.execute()?;
    if let Some(shown) = shown {
        shown.finish(&args, &outcome);
    }
    if let Some(too_many) = &outcome.dead_letters {
        eprintln!("error: {too_many}");
    }
    Ok(outcome.exit_code())
}

/// The options of `riffle run`'s arguments; a local cluster's processes get the display flags
/// (`--metrics-addr`, `--ui`, `--quiet` but on process 0 of a run that is not quiet,
/// `--log-format`) after their own.
fn options(args: &RunArgs, log_format: LogFormat) -> RunOptions {
    let mut options = RunOptions::new(&args.file)
        .cluster(args.cluster.spec())
        .max_restarts(args.max_restarts);
    if let Some(output) = &args.output {
        options = options.output(output);
    }
    if let Some(dir) = &args.checkpoint_dir {
        options = options.checkpoint_dir(dir);
    }
    if let Some(url) = &args.checkpoint_url {
        options = options.checkpoint_url(url);
    }
    let (metrics_addr, ui, quiet) = (args.metrics_addr.clone(), args.ui.clone(), args.quiet);
    options.process_args(move |process| {
        let mut extra: Vec<OsString> = Vec::new();
        // Each process serves its own metrics (at the port + its index); process 0 serves
        // the view and the others report to it.
        if let Some(addr) = &metrics_addr {
            extra.extend(["--metrics-addr".into(), addr.into()]);
        }
        if let Some(addr) = &ui {
            extra.extend(["--ui".into(), addr.into()]);
        }
        if quiet || process > 0 {
            extra.push("--quiet".into());
        }
        if log_format == LogFormat::Json {
            extra.extend(["--log-format".into(), "json".into()]);
        }
        extra
    })
}

/// What one process of a run shows while it runs: its endpoints and its progress.
struct Shown {
    endpoints: Endpoints,
    progress: Option<(ProgressBar, Ticker)>,
    /// The run checkpoints (`runtime.checkpoint`, `--checkpoint-dir`, `--checkpoint-url`).
    checkpointed: bool,
}

impl Shown {
    fn start(args: &RunArgs, process: &mut ProcessRun) -> Result<Self> {
        let (pipeline, cluster) = (process.pipeline().clone(), process.cluster().clone());
        // The view (or the reporter to process 0's) puts its live tap in the run's context.
        let endpoints = Endpoints::start(args, &pipeline, &cluster, process.context_mut())?;
        let progress = progress_bar(args, &pipeline, &cluster, process.metrics());
        let checkpointed = pipeline.runtime.checkpoint.is_some()
            || args.checkpoint_dir.is_some()
            || args.checkpoint_url.is_some();
        Ok(Shown {
            endpoints,
            progress,
            checkpointed,
        })
    }

    /// The summary; a finite run's view stays up with its final state until the user stops
    /// riffle.
    fn finish(self, args: &RunArgs, outcome: &RunOutcome) {
        if let Some((bar, ticker)) = self.progress {
            bar.finish_and_clear();
            ticker.stop();
        }
        if let (false, Some(cluster), Some(report)) =
            (args.quiet, &outcome.cluster, &outcome.report)
        {
            eprintln!(
                "{} — {} worker(s) in process {}/{}, {:.2} s",
                outcome.pipeline,
                cluster.threads,
                cluster.process,
                cluster.processes(),
                outcome.elapsed.as_secs_f64()
            );
            eprint!("{}", report.summary);
        }
        if outcome.stop_requested() {
            eprintln!("riffle: {}", stopped_message(self.checkpointed));
        }
        if let Some(addr) = self.endpoints.finish() {
            if !outcome.stop_requested() {
                eprintln!(
                    "riffle: the input ended; the live view stays up on http://{addr}/ until Ctrl-C"
                );
                outcome.wait_for_stop();
            }
        }
    }
}

/// What a run stopped on request leaves behind.
fn stopped_message(checkpointed: bool) -> &'static str {
    if checkpointed {
        "stopped on request; the last checkpoint covers every result written"
    } else {
        "stopped on request; the results written so far are in the sink, and with no \
         checkpoint configured nothing is resumable: a new run starts from the beginning"
    }
}

struct Ticker(
    Arc<std::sync::atomic::AtomicBool>,
    Option<std::thread::JoinHandle<()>>,
);

impl Ticker {
    fn stop(mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

fn progress_bar(
    args: &RunArgs,
    pipeline: &riffle_pipelines::Pipeline,
    cluster: &riffle_dataflow::cluster::ClusterConfig,
    metrics: &Arc<Metrics>,
) -> Option<(ProgressBar, Ticker)> {
    if args.quiet {
        return None;
    }
    let total = if cluster.processes() == 1 {
        pipeline.source.total_records()
    } else {
        None
    };
    let bar = match total {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} records {per_sec} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (b, m, s) = (bar.clone(), metrics.clone(), stop.clone());
    let handle = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(source) = m.stage("source") {
                b.set_position(source.records_out());
            }
            if let Ok(sink) = m.stage("sink") {
                b.set_message(format!("· {} results", sink.records_out()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    Some((bar, Ticker(stop, Some(handle))))
}

#[cfg(test)]
mod tests {
    use super::stopped_message;

    #[test]
    fn a_stop_without_checkpoints_claims_none() {
        assert!(stopped_message(true).contains("last checkpoint"));
        let plain = stopped_message(false);
        assert!(!plain.contains("last checkpoint"), "{plain}");
        assert!(plain.contains("nothing is resumable"), "{plain}");
    }
}
