//! What the live view costs: `pipelines/camera-perception.yaml` (the bundled 250 frames
//! replayed REPEAT times, 2 workers) timed with no view, and with the view served and open in a
//! headless Chromium, in interleaved rounds in one process. Prints a markdown table (median
//! and range of the rounds); scripts/bench-ui.sh writes it to docs/benchmarks/ui.md and the
//! README.
//!
//! `cargo run --release --example bench_ui -- [ROUNDS] [REPEAT]` (defaults 5 and 4); needs
//! Debian's `chromium` and scripts/setup.sh's ONNX Runtime.

mod common;

use common::spread;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::observe::RunContext;

const CHROMIUM: &str = "/usr/bin/chromium";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).map_or(Ok(5), |a| a.parse())?;
    let repeat: usize = args.get(2).map_or(Ok(4), |a| a.parse())?;
    if !Path::new(CHROMIUM).exists() {
        bail!("{CHROMIUM} is missing: apt-get install chromium");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir()?;
    let text = std::fs::read_to_string(root.join("pipelines/camera-perception.yaml"))?
        .replace(
            "../data/frames",
            &root.join("data/frames").display().to_string(),
        )
        .replace("../models/", &format!("{}/", root.join("models").display()))
        .replace("cameras: 4", &format!("cameras: 4\n    repeat: {repeat}"));
    let file = tmp.path().join("camera-perception.yaml");
    std::fs::write(&file, text)?;
    let output = tmp.path().join("out.jsonl");

    // A warm-up run of each kind (ONNX Runtime's first session, the browser's first start).
    run(&file, &output, false)?;
    run(&file, &output, true)?;
    let (mut plain, mut viewed, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first: a drifting machine favours neither.
        let (a, b) = if round % 2 == 0 {
            let a = run(&file, &output, false)?;
            (a, run(&file, &output, true)?)
        } else {
            let b = run(&file, &output, true)?;
            (run(&file, &output, false)?, b)
        };
        eprintln!("round {round}: {a:.1} frames/s without the view, {b:.1} with it open");
        plain.push(a);
        viewed.push(b);
        ratios.push(b / a);
    }
    let frames = 250 * repeat;
    println!("| camera-perception, {frames} frames, 2 workers, median (range) of {rounds} rounds | frames/s |");
    println!("|---|---:|");
    println!("| no view | {} |", spread(&plain, 1));
    println!(
        "| `--ui`, page open in headless Chromium | {} |",
        spread(&viewed, 1)
    );
    println!(
        "| ratio (with / without, per round; target ≥ 0.97) | {} |",
        spread(&ratios, 3)
    );
    Ok(())
}

/// Frames per second of one run of `file`, with the view served and watched or not.
fn run(file: &Path, output: &Path, view: bool) -> anyhow::Result<f64> {
    let pipeline = Arc::new(riffle_pipelines::load(file, Some(output))?);
    // The view puts its live tap in the context the run is handed.
    let mut context = RunContext::from(Metrics::new()?);
    let mut browser: Option<Killed> = None;
    let server = if view {
        let server = riffle_ui::serve(
            "127.0.0.1:0",
            &mut context,
            riffle_ui::ViewConfig {
                pipeline: pipeline.name().to_string(),
                processes: 1,
                workers: 2,
                page: true,
                ..Default::default()
            },
        )?;
        let page = format!("http://{}/", server.addr());
        browser = Some(Killed(
            Command::new(CHROMIUM)
                .args([
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                ])
                .arg("--window-size=1400,1600")
                .arg(format!(
                    "--user-data-dir={}",
                    std::env::temp_dir()
                        .join(format!("riffle-bench-ui-{}", std::process::id()))
                        .display()
                ))
                .arg(&page)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting chromium")?,
        ));
        // Timing starts once the page is connected and listening.
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.viewers() == 0 {
            if Instant::now() > deadline {
                bail!("the page did not connect to {page} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    } else {
        None
    };
    let started = Instant::now();
    let report =
        riffle_pipelines::run::execute(pipeline, &ClusterConfig::single_process(2), context)?;
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(server) = &server {
        if server.viewers() == 0 {
            bail!("the page disconnected during the run");
        }
    }
    drop(browser);
    Ok(report.summary.results as f64 / elapsed)
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
