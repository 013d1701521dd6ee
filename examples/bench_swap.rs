//! End-to-end latency while a model version is switched in: `pipelines/camera-versions.yaml`
//! (2 of its cameras read at their frame rate from the test videos, 2 workers) run by the `riffle`
//! binary; a second version is published `SWAP_AT` into the run. Rows are split by when the
//! source read them: steady state (before the publish, after the first second) and the swap
//! window (from the publish to one second after the first row served by the new version).
//! Prints a markdown table of p50/p99 per window, median (min–max) over the rounds.
//!
//!     RIFFLE_BIN=target/release/riffle cargo run --release --example bench_swap -- [ROUNDS]

mod common;

use common::{quantile, spread};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

const SWAP_AT: Duration = Duration::from_secs(8);
const FRAMES_PER_CAMERA: u64 = 450; // 18 s at 25 fps (sampled frames and dropped ones count)

fn main() -> Result<()> {
    let (riffle, rounds) = common::binary_and_rounds("scripts/bench-swap.sh")?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let model = repo.join("models/ssdlite_person.onnx");
    let text = std::fs::read_to_string(repo.join("pipelines/camera-versions.yaml"))?;
    let mut steady = [Vec::new(), Vec::new()];
    let mut swap = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let tmp = tempfile::tempdir()?;
        let models = tmp.path().join("ssd");
        publish(&models, 1, &model)?;
        let out = tmp.path().join("out.jsonl");
        // Two cameras sampled at 12.5 fps each: 25 frames/s, under half of what 2 workers
        // detect on 2 cores, so the latency measured is the pipeline's, not a growing queue's.
        let videos = tmp.path().join("videos");
        std::fs::create_dir_all(&videos)?;
        for name in ["bikes-0.mp4", "bikes-1.mp4"] {
            std::os::unix::fs::symlink(repo.join("data/videos").join(name), videos.join(name))?;
        }
        let pipeline = repo.join(format!("pipelines/.bench-swap-{round}.yaml"));
        let mut edited = text.clone();
        for (from, to) in [
            (
                "../models/repository/ssdlite_person",
                models.display().to_string(),
            ),
            (
                "../data/videos/*.mp4",
                videos.join("*.mp4").display().to_string(),
            ),
            (
                "    loop: true\n",
                "    loop: true\n    sample_fps: 12.5\n".into(),
            ),
            (
                "max_frames: 1500",
                format!("max_frames: {FRAMES_PER_CAMERA}"),
            ),
            // Results reach the sink when their epoch completes: short epochs, short waits.
            ("epoch_records: 16", "epoch_records: 4".into()),
            (
                "columns: [camera_id, frame, model_version,",
                "columns: [camera_id, frame, model_version, ingest_ms,".into(),
            ),
        ] {
            if !edited.contains(from) {
                bail!(
                    "pipelines/camera-versions.yaml no longer has `{from}`: update this benchmark"
                );
            }
            edited = edited.replace(from, &to);
        }
        std::fs::write(&pipeline, edited)?;
        let started_ms = now_ms();
        let mut child = Command::new(&riffle)
            .args(["run", "-q"])
            .arg(&pipeline)
            .args(["--output"])
            .arg(&out)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()?;
        std::thread::sleep(SWAP_AT);
        let published_ms = now_ms();
        publish(&models, 2, &model)?;
        let status = child.wait()?;
        let _ = std::fs::remove_file(&pipeline);
        if !status.success() {
            bail!("round {round}: riffle failed ({status})");
        }
        let rows = read(&out)?;

        let first_v2 = rows
            .iter()
            .filter(|r| r.version == 2)
            .map(|r| r.ingest_ms)
            .min()
            .context("no row ran on version 2")?;
        let window = |lo: i64, hi: i64| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.ingest_ms >= lo && r.ingest_ms < hi)
                .map(|r| r.latency_ms)
                .collect()
        };
        let calm = window(started_ms + 1000, published_ms);
        let during = window(published_ms, first_v2 + 1000);
        for (into, values) in [(&mut steady, calm), (&mut swap, during)] {
            if values.len() < 20 {
                bail!("round {round}: only {} rows in a window", values.len());
            }
            into[0].push(quantile(&values, 0.5));
            into[1].push(quantile(&values, 0.99));
        }
    }
    let ratio: Vec<f64> = swap[1].iter().zip(&steady[1]).map(|(s, c)| s / c).collect();
    println!("| camera-versions, 2 cameras sampled at 12.5 fps, 2 workers | p50 ms | p99 ms |");
    println!("|---|---:|---:|");
    println!(
        "| steady state | {} | {} |",
        spread(&steady[0], 1),
        spread(&steady[1], 1)
    );
    println!(
        "| from the publish to 1 s after the switch | {} | {} |",
        spread(&swap[0], 1),
        spread(&swap[1], 1)
    );
    println!(
        "| p99 ratio, swap / steady (target ≤ 2) | | {} |",
        spread(&ratio, 2)
    );
    println!();
    println!("Median (min–max) of {rounds} rounds; end-to-end latency from the source's read to the sink.");
    Ok(())
}

struct Row {
    version: i64,
    ingest_ms: i64,
    latency_ms: f64,
}

fn read(path: &Path) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)?;
            Ok(Row {
                version: v["model_version"].as_i64().context("model_version")?,
                ingest_ms: v["ingest_ms"].as_i64().context("ingest_ms")?,
                latency_ms: v["latency_ms"].as_f64().context("latency_ms")?,
            })
        })
        .collect()
}

/// `file` as `version` of the repository `dir`, renamed in whole.
fn publish(dir: &Path, version: u64, file: &Path) -> Result<()> {
    let staging = dir.with_extension(format!("staging-{version}"));
    std::fs::create_dir_all(&staging)?;
    std::fs::copy(file, staging.join("model.onnx"))?;
    std::fs::create_dir_all(dir)?;
    std::fs::rename(&staging, dir.join(version.to_string()))?;
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
