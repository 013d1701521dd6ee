//! One model instance per worker vs one per process (`share: process`), 4 workers: peak RSS
//! and throughput of `pipelines/camera-perception.yaml` run by the `riffle` binary, in
//! interleaved rounds (the variant going first alternates). Each run includes its own start-up
//! (model loading) alike. Prints a markdown table.
//!
//!     RIFFLE_BIN=target/release/riffle cargo run --release --example bench_share -- [ROUNDS]
//!
//! `scripts/bench-share.sh` builds both and writes docs/benchmarks/share.md and the README table.

mod common;

use common::spread;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Result};

const FRAMES: f64 = 250.0;
const WORKERS: &str = "4";

fn main() -> Result<()> {
    let (riffle, rounds) = common::binary_and_rounds("scripts/bench-share.sh")?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(repo.join("pipelines/camera-perception.yaml"))?;
    let anchor = "      batch: { max_size: 4, max_delay_ms: 10, late_after_ms: 2000 }\n";
    if !text.contains(anchor) {
        bail!("pipelines/camera-perception.yaml's model batch line changed; update this benchmark");
    }
    let tmp = tempfile::tempdir()?;
    let variants = ["worker", "process"];
    let mut pipelines = Vec::new();
    for share in variants {
        // Written beside the original so its relative paths still resolve.
        let path = repo.join(format!("pipelines/.bench-share-{share}.yaml"));
        std::fs::write(
            &path,
            text.replace(anchor, &format!("{anchor}      share: {share}\n")),
        )?;
        pipelines.push(path);
    }
    let mut rss = [Vec::new(), Vec::new()];
    let mut rate = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for v in order {
            let out = tmp.path().join(format!("{}-{round}.jsonl", variants[v]));
            let (seconds, peak_kib) = run(&riffle, &pipelines[v], &out)?;
            let results = std::fs::read_to_string(&out)?.lines().count();
            if results != FRAMES as usize {
                bail!("{}: {results} results, expected {FRAMES}", variants[v]);
            }
            rss[v].push(peak_kib as f64 / 1024.0);
            rate[v].push(FRAMES / seconds);
        }
    }
    for p in &pipelines {
        let _ = std::fs::remove_file(p);
    }
    let ratios =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| b / a).collect() };
    println!("| 4 workers, camera-perception (250 frames) | one model per worker | `share: process` | process / worker |");
    println!("|---|---:|---:|---:|");
    println!(
        "| peak RSS, MiB | {} | {} | {} |",
        spread(&rss[0], 0),
        spread(&rss[1], 0),
        spread(&ratios(&rss[0], &rss[1]), 2)
    );
    println!(
        "| frames/s (start-up included) | {} | {} | {} |",
        spread(&rate[0], 1),
        spread(&rate[1], 1),
        spread(&ratios(&rate[0], &rate[1]), 2)
    );
    println!();
    println!("Median (min–max) of {rounds} interleaved rounds; ratios taken per round.");
    Ok(())
}

/// Runs the pipeline to completion: (seconds, the child's peak RSS in KiB).
fn run(riffle: &Path, pipeline: &Path, out: &Path) -> Result<(f64, i64)> {
    let started = Instant::now();
    let child = Command::new(riffle)
        .args(["run", "-q"])
        .arg(pipeline)
        .args(["--workers", WORKERS, "--output"])
        .arg(out)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into the two locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let seconds = started.elapsed().as_secs_f64();
    if pid < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{} failed (status {status})", pipeline.display());
    }
    Ok((seconds, usage.ru_maxrss))
}
