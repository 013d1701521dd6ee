//! `riffle`: run, validate and benchmark declarative inference pipelines.

mod bench;
mod cli;
#[cfg(feature = "kafka")]
mod consume;
mod gpu_check;
#[cfg(feature = "kafka")]
mod produce;
mod run;
mod serve;

use anyhow::Result;
use clap::Parser;
use riffle_pipelines::run::exit;

use cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    riffle_pipelines::run::quiet_network_panics();
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
        Command::Run(args) => run::run_command(args, cli.log_format),
        Command::Validate { file } => validate_command(&file).map(|()| exit::OK),
        Command::Bench(args) => bench::bench_command(args).map(|()| exit::OK),
        #[cfg(feature = "kafka")]
        Command::Produce(args) => produce::produce_command(args).map(|()| exit::OK),
        #[cfg(feature = "kafka")]
        Command::Consume(args) => consume::consume_command(args).map(|()| exit::OK),
        #[cfg(not(feature = "kafka"))]
        Command::Produce(_) | Command::Consume(_) => Err(anyhow::anyhow!(
            riffle_connectors::kind::not_built("riffle produce/consume", "kafka")
        )),
        Command::Devices => devices_command().map(|()| exit::OK),
        Command::GpuCheck {
            model,
            frames,
            pairs,
            ordinal,
        } => gpu_check::gpu_check_command(&model, &frames, pairs, ordinal).map(|()| exit::OK),
        Command::Plan { file, cluster } => plan_command(&file, &cluster).map(|()| exit::OK),
    };
    match outcome {
        Ok(exit::OK) => {}
        // A run that ended with too many dead letters has said so.
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(exit::FAILED);
        }
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
    let config = cluster.spec().config(&pipeline)?;
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
