//! The Python camera peer (`scripts/peers/camera_peer.py`) run as a child process on the same
//! cameras: its summary line gives its figures, its results file the outputs compared with ours.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::{digest, Output, Run};

/// The peer's Python: `given`, else the camera-peer venv scripts/peers/camera-setup.sh makes.
pub fn python(given: Option<PathBuf>) -> Option<PathBuf> {
    if given.is_some() {
        return given;
    }
    let cache = std::env::var_os("RIFFLE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/riffle")))?;
    let python = cache.join("camera-peer-venv/bin/python");
    if python.is_file() {
        Some(python)
    } else {
        eprintln!(
            "bench-cameras: no camera peer ({} missing: scripts/peers/camera-setup.sh)",
            python.display()
        );
        None
    }
}

/// One run of the peer over `files` (camera k plays file k) for `seconds` of video each.
pub fn run(python: &Path, repo: &Path, files: &[PathBuf], seconds: usize) -> anyhow::Result<Run> {
    let results =
        std::env::temp_dir().join(format!("bench-cameras-peer-{}.jsonl", std::process::id()));
    let list: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let out = Command::new(python)
        .arg(repo.join("scripts/peers/camera_peer.py"))
        .args(["--videos", &list.join(",")])
        .args(["--seconds", &seconds.to_string()])
        .args(["--width", "300", "--height", "300", "--processes", "2"])
        .arg("--model")
        .arg(repo.join("models/ssdlite_person.onnx"))
        .arg("--results")
        .arg(&results)
        .output()
        .context("running the camera peer")?;
    anyhow::ensure!(
        out.status.success(),
        "the camera peer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("the camera peer printed no summary")?;
    let summary: serde_json::Value = serde_json::from_str(line)?;
    let figure = |key: &str| -> anyhow::Result<f64> {
        summary[key]
            .as_f64()
            .with_context(|| format!("the peer's summary has no `{key}`: {line}"))
    };
    let outputs = outputs(&results);
    let _ = std::fs::remove_file(&results);
    Ok(Run {
        frames_in: figure("frames_in")?,
        dropped: figure("dropped")?,
        results: figure("results")? as usize,
        delivered_fps: figure("delivered_fps")?,
        e2e_p50: figure("read_p50").unwrap_or(0.0),
        e2e_p99: figure("read_p99").unwrap_or(0.0),
        capture_p50: figure("capture_p50")?,
        capture_p99: figure("capture_p99")?,
        cpu_cores: figure("cpu_cores")?,
        outputs: outputs?,
        breakdown: None,
    })
}

/// The digest of the peer's results: (camera, frame, detections kept) as ours.
fn outputs(file: &Path) -> anyhow::Result<u64> {
    let reader = std::io::BufReader::new(
        std::fs::File::open(file).with_context(|| format!("{}", file.display()))?,
    );
    let mut v: Vec<Output> = Vec::new();
    for line in reader.lines() {
        let row: serde_json::Value = serde_json::from_str(&line?)?;
        let int = |k: &str| row[k].as_i64().with_context(|| format!("`{k}` in {row}"));
        v.push((int("camera")? as u64, int("frame")?, int("count")?));
    }
    Ok(digest(v))
}
