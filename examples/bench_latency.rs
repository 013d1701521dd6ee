//! Latency benchmark (not a test): paced cameras at 25 fps each at about 25, 50 and 75 % of the
//! detector's capacity, frame read → result latency on the live tap (results as they exist,
//! before their epoch commits) and on the committed output, beside the same paced load through
//! the Bytewax peer. `scripts/bench-latency.sh` builds it in release and writes the table to
//! `docs/benchmarks/latency.md`.
//!
//!     cargo run --release --example bench_latency -- [--rounds 3] [--loads 25,50,75] \
//!         [--seconds 10] [--epoch-ms 200] [--peer-python "$(scripts/peers/setup.sh)"]
//!
//! The job is the peers' `detect` (the 250 bundled street frames, resize 300×300 u8, SSDLite,
//! persons over 0.5) as `pipelines/camera-perception.yaml` runs it, with the frames split into
//! N cameras replayed live (`fps: 25`). Capacity is measured unpaced at the start of each round;
//! N = load × capacity / 25, rounded, at least 1. Riffle runs it twice: with the frames balanced
//! over the workers (`exchange: { balance: true, ordered_by: camera_id }` first), and with each
//! camera kept on one worker (`partition_by: camera` alone). Rounds interleave both and the peer.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Parser;
use common::spread;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::observe::summary::Summary;
use riffle_pipelines::Pipeline;

const FPS: f64 = 25.0;
const WORKERS: usize = 2;
const FRAMES: usize = 250;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Loads to try, in percent of the measured capacity.
    #[arg(long, value_delimiter = ',', default_value = "25,50,75")]
    loads: Vec<f64>,
    /// Seconds each paced run lasts (frames are repeated to fill it).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// `runtime.epoch_ms`, if any: how long a committed result may wait for its epoch (a paced
    /// source also closes its epoch whenever it waits for its next frame).
    #[arg(long)]
    epoch_ms: Option<u64>,
    /// The peers' Python (`scripts/peers/setup.sh` makes it and prints it); without it the peer
    /// is skipped and its column says so.
    #[arg(long)]
    peer_python: Option<PathBuf>,
}

/// One paced run's figures, ms.
#[derive(Clone, Debug, Default)]
struct Latency {
    live_p50: f64,
    live_p99: f64,
    committed_p50: f64,
    committed_p99: f64,
    results: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut capacity = Vec::new();
    // Per load: cameras, Riffle runs (balanced, one worker per camera), peer runs.
    #[allow(
        clippy::type_complexity,
        reason = "a local table, named by the comment"
    )]
    let mut rows: Vec<(Vec<usize>, Vec<Latency>, Vec<Latency>, Vec<Latency>)> =
        vec![Default::default(); args.loads.len()];
    for round in 0..args.rounds {
        let unpaced = run(
            &repo,
            &args,
            Load {
                cameras: 4,
                fps: None,
                repeat: 2,
                balanced: false,
            },
        )?;
        let fps = unpaced.results as f64 / unpaced.elapsed.as_secs_f64();
        eprintln!("round {round}: capacity {fps:.1} frames/s");
        capacity.push(fps);
        for (i, load) in args.loads.iter().enumerate() {
            let cameras = ((load / 100.0 * fps / FPS).round() as usize).max(1);
            let per_camera = FRAMES / cameras;
            let repeat = ((args.seconds * FPS) / per_camera as f64).ceil().max(1.0) as usize;
            let row = &mut rows[i];
            row.0.push(cameras);
            for balanced in [true, false] {
                let paced = Load {
                    cameras,
                    fps: Some(FPS),
                    repeat,
                    balanced,
                };
                let s = run(&repo, &args, paced)?;
                let riffle = Latency {
                    live_p50: ms(s.ready_p50),
                    live_p99: ms(s.ready_p99),
                    committed_p50: ms(s.end_to_end_p50),
                    committed_p99: ms(s.end_to_end_p99),
                    results: s.results as usize,
                };
                eprintln!(
                    "round {round} load {load}% ({cameras} cameras, balanced {balanced}): riffle {riffle:?}"
                );
                if balanced {
                    row.1.push(riffle);
                } else {
                    row.2.push(riffle);
                }
            }
            if let Some(python) = &args.peer_python {
                let peer = run_peer(&repo, python, cameras, repeat)?;
                eprintln!("round {round} load {load}% ({cameras} cameras): bytewax {peer:?}");
                row.3.push(peer);
            }
        }
    }

    let cap = spread(&capacity, 1);
    println!(
        "Capacity (unpaced, 4 cameras, {WORKERS} workers × 1 ONNX Runtime thread): {cap} frames/s.\n"
    );
    let epochs = args
        .epoch_ms
        .map_or("epochs of ≤ 16 frames".to_string(), |ms| {
            format!("epoch_ms {ms}")
        });
    println!(
        "| load | cameras × {FPS} fps | Riffle live tap p50 / p99 ms | Riffle committed p50 / p99 ms ({epochs}) | Riffle, one worker per camera: live tap p50 / p99 ms | Bytewax (2 workers) p50 / p99 ms | results per run |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (load, (cameras, riffle, by_camera, peer)) in args.loads.iter().zip(&rows) {
        let pick =
            |runs: &[Latency], f: fn(&Latency) -> f64| -> Vec<f64> { runs.iter().map(f).collect() };
        let actual: Vec<f64> = cameras
            .iter()
            .zip(&capacity)
            .map(|(n, c)| 100.0 * *n as f64 * FPS / c)
            .collect();
        let peer_cell = if peer.is_empty() {
            "not run (no --peer-python)".to_string()
        } else {
            format!(
                "{} / {}",
                spread(&pick(peer, |l| l.live_p50), 1),
                spread(&pick(peer, |l| l.live_p99), 1)
            )
        };
        println!(
            "| {load:.0} % (actual {}) | {} | {} / {} | {} / {} | {} / {} | {} | {} |",
            spread(&actual, 0),
            spread(&cameras.iter().map(|n| *n as f64).collect::<Vec<_>>(), 0),
            spread(&pick(riffle, |l| l.live_p50), 1),
            spread(&pick(riffle, |l| l.live_p99), 1),
            spread(&pick(riffle, |l| l.committed_p50), 1),
            spread(&pick(riffle, |l| l.committed_p99), 1),
            spread(&pick(by_camera, |l| l.live_p50), 1),
            spread(&pick(by_camera, |l| l.live_p99), 1),
            peer_cell,
            spread(&pick(riffle, |l| l.results as f64), 0),
        );
    }
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One run's load: `cameras` streams, live at `fps` or unpaced, the frames `repeat` times,
/// balanced over the workers or each camera on one worker.
#[derive(Clone, Copy)]
struct Load {
    cameras: usize,
    fps: Option<f64>,
    repeat: usize,
    balanced: bool,
}

/// The job as YAML.
fn yaml(repo: &Path, args: &Args, load: Load) -> String {
    let Load {
        cameras,
        fps,
        repeat,
        balanced,
    } = load;
    let fps = fps.map_or(String::new(), |f| format!("\n    fps: {f}"));
    format!(
        r#"name: bench-latency
source:
  images:
    path: {frames}
    cameras: {cameras}
    partition_by: camera
    batch_size: 4
    repeat: {repeat}{fps}
stages:
{exchange}{stages}sink:
  jsonl: {{ path: {out} }}
runtime:
  workers: {WORKERS}
  intra_op_threads: 1
  epoch_records: 16{epoch_ms}
  max_epochs_in_flight: 4
"#,
        frames = repo.join("data/frames").display(),
        stages = common::detect_stages(repo),
        // Frames go to whichever worker is idle, so a camera is not tied to one core; per
        // camera they stay in order (a live camera's frames are in epochs of their own).
        exchange = if balanced {
            "  - exchange: { balance: true, ordered_by: camera_id }\n"
        } else {
            ""
        },
        out = std::env::temp_dir()
            .join(format!("bench-latency-{}.jsonl", std::process::id()))
            .display(),
        epoch_ms = args
            .epoch_ms
            .map_or(String::new(), |ms| format!("\n  epoch_ms: {ms}")),
    )
}

fn load_pipeline(yaml: &str) -> anyhow::Result<Pipeline> {
    let file = std::env::temp_dir().join(format!("bench-latency-{}.yaml", std::process::id()));
    std::fs::write(&file, yaml)?;
    let pipeline = riffle_pipelines::load(&file, None);
    let _ = std::fs::remove_file(&file);
    Ok(pipeline?)
}

fn run(repo: &Path, args: &Args, load: Load) -> anyhow::Result<Summary> {
    let pipeline = load_pipeline(&yaml(repo, args, load))?;
    let report = riffle_pipelines::run::execute(
        Arc::new(pipeline),
        &ClusterConfig::single_process(WORKERS),
        Metrics::new()?,
    )?;
    let expected = FRAMES * load.repeat;
    if report.summary.results as usize != expected {
        bail!(
            "{} results from {} cameras × {} repeats, {expected} expected",
            report.summary.results,
            load.cameras,
            load.repeat
        );
    }
    Ok(report.summary)
}

/// The same paced load through `scripts/peers/bytewax_paced.py` (2 workers in one process).
fn run_peer(repo: &Path, python: &Path, cameras: usize, repeat: usize) -> anyhow::Result<Latency> {
    let out = Command::new(python)
        .current_dir(repo.join("scripts/peers"))
        .args(["-m", "bytewax.run", "bytewax_paced:flow()", "-w", "2"])
        .env("PACED_CAMERAS", cameras.to_string())
        .env("PACED_FPS", FPS.to_string())
        .env("PACED_REPEAT", repeat.to_string())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .rfind(|l| l.starts_with("PEER "))
        .with_context(|| format!("the Bytewax peer printed no PEER line:\n{text}"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .with_context(|| format!("no {name}= in {line}"))?
            .parse()
            .with_context(|| format!("{name} in {line}"))
    };
    let expected = FRAMES * repeat;
    let items = field("items")? as usize;
    if items != expected {
        bail!("the Bytewax peer answered {items} frames, {expected} expected: {line}");
    }
    Ok(Latency {
        live_p50: field("p50_ms")?,
        live_p99: field("p99_ms")?,
        committed_p50: f64::NAN,
        committed_p99: f64::NAN,
        results: items,
    })
}
