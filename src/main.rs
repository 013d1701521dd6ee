//! `riffle`: run, validate and benchmark declarative inference pipelines.

mod bench;
mod cli;
mod consume;
mod gpu_check;
mod launch;
mod produce;
mod serve;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use riffle_dataflow::metrics::Metrics;
use riffle_pipelines::{run, RunOptions};

use cli::{Cli, Command, RunArgs};

/// timely's network threads panic when a peer's socket closes (a peer process died or its host
/// dropped off): one line says so, not a backtrace per thread. `run` turns the failure into an
/// error that supervisors restart on.
fn quiet_network_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("");
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        // The network thread that saw the socket close says it; worker threads and the joins
        // of the other network threads follow it down and say nothing new. A worker's own
        // panic, before any connection was lost, is a bug and keeps its backtrace.
        static LOST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let network = name.starts_with("timely:send") || name.starts_with("timely:recv");
        let joining =
            message.starts_with("Send thread panic") || message.starts_with("Recv thread panic");
        let following =
            name.starts_with("timely:work") && LOST.load(std::sync::atomic::Ordering::SeqCst);
        if network && !LOST.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::error!("cluster connection lost ({name}): {message}");
            return;
        }
        if network || joining || following {
            return;
        }
        default(info);
    }));
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    quiet_network_panics();
    if matches!(
        cli.command,
        Command::Validate { .. } | Command::Plan { .. } | Command::Devices
    ) {
        // These only print: a reader that goes away (`riffle validate p.yaml | head -1`) ends
        // them quietly, as it does other Unix tools, instead of a panic in `println!`. Commands
        // with sockets keep Rust's default (ignored), so a closed socket is an error, not death.
        // SAFETY: no other thread runs yet; SIG_DFL is a valid disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let outcome = match cli.command {
        Command::Run(args) => run_command(args, cli.log_format),
        Command::Validate { file } => validate_command(&file),
        Command::Bench(args) => bench::bench_command(args),
        Command::Produce(args) => produce::produce_command(args),
        Command::Consume(args) => consume::consume_command(args),
        Command::Devices => devices_command(),
        Command::GpuCheck {
            model,
            frames,
            pairs,
            ordinal,
        } => gpu_check::gpu_check_command(&model, &frames, pairs, ordinal),
        Command::Plan { file, cluster } => plan_command(&file, &cluster),
    };
    if let Err(e) = outcome {
        eprintln!("error: {e:#}");
        // A run that finished with too many dead letters is not restarted by a supervisor.
        let code = if e.downcast_ref::<TooManyDeadLetters>().is_some() {
            TooManyDeadLetters::EXIT_CODE
        } else {
            1
        };
        std::process::exit(code);
    }
}

/// Log lines to stderr: text (colours only on a terminal) or JSON objects.
fn init_logging(format: cli::LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,riffle=info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        cli::LogFormat::Text => builder.init(),
        cli::LogFormat::Json => builder.json().init(),
    }
}

fn plan_command(file: &std::path::Path, cluster: &cli::ClusterArgs) -> Result<()> {
    let pipeline = riffle_pipelines::load(file, None)?;
    let config = cluster.to_config(
        pipeline.runtime.workers,
        pipeline.runtime.intra_op_threads,
        riffle_pipelines::plan::uses_gpus(&pipeline),
    )?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // CUDA is only loaded for a pipeline that may use it.
    let gpus = if !riffle_pipelines::plan::uses_gpus(&pipeline) {
        "no stage asks for a GPU".to_string()
    } else {
        match riffle_gpu::discover() {
            Ok(g) => format!("{} GPU(s)", g.len()),
            Err(why) => format!("no GPU ({why})"),
        }
    };
    println!("machine: {cores} core(s), {gpus}");
    print!(
        "{}",
        riffle_pipelines::plan::describe(&pipeline, config.threads, config.processes())
    );
    Ok(())
}

fn devices_command() -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("cpu: {cores} core(s)");
    match riffle_gpu::discover() {
        Ok(gpus) => {
            for g in gpus {
                println!(
                    "cuda:{}: {} ({:.1} GiB, {:.1} GiB free)",
                    g.ordinal,
                    g.name,
                    g.total_bytes as f64 / (1u64 << 30) as f64,
                    g.free_bytes as f64 / (1u64 << 30) as f64
                );
            }
        }
        Err(why) => println!("cuda: none ({why})"),
    }
    Ok(())
}

fn validate_command(file: &std::path::Path) -> Result<()> {
    let pipeline = riffle_pipelines::load(file, None)?;
    println!(
        "{}: ok ({} stages)",
        file.display(),
        pipeline.spec.stages.len()
    );
    for (i, schema) in pipeline.schemas.iter().enumerate() {
        let at = if i == 0 {
            "source".to_string()
        } else {
            format!("after {}", pipeline.spec.stages[i - 1].value.kind())
        };
        let cols: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect();
        println!("  {at:<18} {}", cols.join(", "));
    }
    Ok(())
}

fn run_command(args: RunArgs, log_format: cli::LogFormat) -> Result<()> {
    let pipeline = load_for_run(&args)?;
    // One run at a time per checkpoint directory and output: a supervisor takes the locks for
    // its cluster and passes them down, so its own processes do not take them again.
    let supervised = std::env::var_os(launch::LOCKS_HELD).is_some();
    if args.cluster.processes > 1
        && args.cluster.process.is_none()
        && args.cluster.hostfile.is_none()
    {
        let lock = riffle_pipelines::RunLock::acquire(&pipeline)?;
        return launch::launch_local_cluster(&args, log_format, &lock);
    }
    let pipeline = Arc::new(pipeline);
    let cluster = args.cluster.to_config(
        pipeline.runtime.workers,
        pipeline.runtime.intra_op_threads,
        riffle_pipelines::plan::uses_gpus(&pipeline),
    )?;
    // Process 0 holds them for a cluster started by hand (or from a hostfile).
    let _lock = if supervised || cluster.process != 0 {
        None
    } else {
        Some(riffle_pipelines::RunLock::acquire(&pipeline)?)
    };
    if matches!(args.cluster.workers, Some(cli::Workers::Auto)) {
        tracing::info!(
            "plan:\n{}",
            riffle_pipelines::plan::describe(&pipeline, cluster.threads, cluster.processes())
        );
    }
    let signals = serve::StopSignals::install()?;
    let metrics = Metrics::new()?;
    let endpoints = serve::Endpoints::start(&args, &pipeline, &cluster, &metrics)?;
    let progress = progress_bar(&args, &pipeline, &cluster, &metrics);
    let started = Instant::now();
    let report = run(
        pipeline.clone(),
        RunOptions {
            cluster: cluster.clone(),
            metrics: metrics.clone(),
        },
    )
    // A run-time error may quote the configuration (brokers, paths): never a secret `${VAR}`.
    .map_err(|e| {
        let message = format!("{:#}", anyhow::Error::from(e));
        anyhow::anyhow!(pipeline.redactions.redact(&message))
    })
    .with_context(|| format!("running {}", args.file.display()))?;
    if let Some((bar, ticker)) = progress {
        bar.finish_and_clear();
        ticker.stop();
    }
    let elapsed = started.elapsed();
    if !args.quiet {
        eprintln!(
            "{} — {} worker(s) in process {}/{}, {:.2} s",
            pipeline.name(),
            cluster.threads,
            cluster.process,
            cluster.processes(),
            elapsed.as_secs_f64()
        );
        eprint!("{}", report.summary);
    }
    if signals.received() {
        eprintln!("riffle: stopped on request; the last checkpoint covers every result written");
    }
    let dead_letters =
        TooManyDeadLetters::check(&report.summary, pipeline.runtime.max_dead_letter_ratio);
    // A finite run's view stays up with its final state until the user stops riffle.
    if let Some(addr) = endpoints.finish() {
        if !signals.received() {
            eprintln!(
                "riffle: the input ended; the live view stays up on http://{addr}/ until Ctrl-C"
            );
            signals.wait();
        }
    }
    match dead_letters {
        Some(too_many) => Err(too_many.into()),
        None => Ok(()),
    }
}

/// A run that ended with more of its records in dead letters than `runtime.max_dead_letter_ratio`
/// allows (by default: all of them).
#[derive(Debug)]
pub struct TooManyDeadLetters(String);

impl TooManyDeadLetters {
    /// What `riffle run` exits with (1 is any other failure).
    pub const EXIT_CODE: i32 = 3;

    fn check(summary: &riffle_dataflow::metrics::Summary, ratio: Option<f64>) -> Option<Self> {
        let (dead, read) = summary.dead_letter_share();
        let too_many = match ratio {
            Some(r) => read > 0 && dead as f64 > r * read as f64,
            None => read > 0 && dead >= read,
        };
        if !too_many {
            return None;
        }
        let limit = match ratio {
            Some(r) => format!("more than runtime.max_dead_letter_ratio ({r})"),
            None => "all of them (runtime.max_dead_letter_ratio sets how many may)".to_string(),
        };
        let reasons: Vec<String> = summary
            .dead_letter_reasons
            .iter()
            .take(3)
            .map(|(reason, n)| format!("{n} × {reason}"))
            .collect();
        let reasons = if reasons.is_empty() {
            "the reasons are in the dead-letter sink".to_string()
        } else {
            format!("commonest reasons: {}", reasons.join("; "))
        };
        Some(TooManyDeadLetters(format!(
            "{dead} of the {read} records read went to dead letters, {limit}; {reasons}"
        )))
    }
}

impl std::fmt::Display for TooManyDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TooManyDeadLetters {}

/// The pipeline of `riffle run`, with the command line's `--output` and `--checkpoint-dir`.
fn load_for_run(args: &RunArgs) -> Result<riffle_pipelines::Pipeline> {
    let mut pipeline = riffle_pipelines::load(&args.file, args.output.as_deref())?;
    if let Some(dir) = &args.checkpoint_dir {
        let (keep, interval_ms) = pipeline
            .runtime
            .checkpoint
            .as_ref()
            .map_or((3, 0), |c| (c.keep, c.interval_ms));
        pipeline.set_checkpoint(riffle_pipelines::spec::CheckpointConfig {
            dir: dir.clone(),
            keep,
            interval_ms,
        })?;
    }
    Ok(pipeline)
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
