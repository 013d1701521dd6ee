//! Exchange compression between two processes (not a test): `camera-classify-split.yaml` with
//! MobileNetV2's backbone in process 0 and its head in process 1, once per `compression`
//! setting, in one run: bytes of activations on the wire, frames/s, and top-1 agreement with
//! the setting `none`. Needs `scripts/setup.sh` (ORT, model parts) and a release build.
//!
//!     cargo build --release && cargo run --release --example bench_exchange

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let riffle = repo.join("target/release/riffle");
    if !riffle.is_file() {
        bail!("build the binary first: cargo build --release");
    }
    let tmp = std::env::temp_dir().join(format!("bench-exchange-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let template = std::fs::read_to_string(repo.join("pipelines/camera-classify-split.yaml"))?
        .replace("../", &format!("{}/", repo.display()));
    println!("| compression | activation bytes to the head process | vs none | frames/s | vs none | top-1 equal to none |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut base: Option<(u64, f64, BTreeMap<String, String>)> = None;
    for (round, compression) in ["none", "fp16", "sparse"].iter().enumerate() {
        let file = tmp.join(format!("split-{compression}.yaml"));
        std::fs::write(
            &file,
            template.replace("compression: fp16", &format!("compression: {compression}")),
        )?;
        let out = tmp.join(format!("{compression}.jsonl"));
        let (bytes, rate) = run_two_processes(&riffle, &file, &out, &tmp, 7400 + 10 * round)?;
        let top1 = read_top1(&out)?;
        let (b0, r0, t0) = base.get_or_insert_with(|| (bytes, rate, top1.clone()));
        let same = top1.iter().filter(|(k, v)| t0.get(*k) == Some(v)).count();
        println!(
            "| {compression} | {bytes} | {:.2} | {rate:.1} | {:.2} | {same}/{} |",
            bytes as f64 / *b0 as f64,
            rate / *r0,
            top1.len()
        );
    }
    let _ = std::fs::remove_dir_all(tmp);
    Ok(())
}

/// Runs process 0 and 1 of a cluster on this host; returns the bytes process 1 received (the
/// backbone's activations) and process 0's results per second.
fn run_two_processes(
    riffle: &Path,
    file: &Path,
    out: &Path,
    tmp: &Path,
    port: usize,
) -> Result<(u64, f64)> {
    let hosts = tmp.join(format!("hosts-{port}"));
    std::fs::write(
        &hosts,
        format!("127.0.0.1:{port}\n127.0.0.1:{}\n", port + 1),
    )?;
    let spawn = |process: usize| {
        Command::new(riffle)
            .arg("run")
            .arg(file)
            .args(["--workers", "1", "--process", &process.to_string()])
            .arg("--hostfile")
            .arg(&hosts)
            .arg("--output")
            .arg(out)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
    };
    let p0 = spawn(0)?;
    std::thread::sleep(std::time::Duration::from_millis(50));
    let p1 = spawn(1)?;
    let o0 = p0.wait_with_output()?;
    let o1 = p1.wait_with_output()?;
    let (e0, e1) = (
        String::from_utf8_lossy(&o0.stderr),
        String::from_utf8_lossy(&o1.stderr),
    );
    if !o0.status.success() || !o1.status.success() {
        bail!("a process failed:\n{e0}\n{e1}");
    }
    let bytes = e1
        .lines()
        .find_map(|l| l.strip_prefix("exchange: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("process 1 reported no exchange bytes")?;
    let rate = e0
        .lines()
        .find_map(|l| l.strip_prefix("results: "))
        .and_then(|l| l.split(" = ").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("process 0 reported no results")?;
    Ok((bytes, rate))
}

fn read_top1(path: &Path) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        out.insert(
            format!("{}/{}", v["camera_id"], v["frame"]),
            v["top_label"].as_str().unwrap_or_default().to_string(),
        );
    }
    Ok(out)
}
