//! Helpers for the end-to-end tests: the repository's assets, temporary pipelines, and running
//! the `riffle` binary.
#![allow(dead_code)]

pub mod kafka;
pub mod postgres;
pub mod redis;
pub mod registry;
pub mod rtsp;
pub mod s3;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Riffle's cache (ONNX Runtime, tools, venvs), as scripts/setup.sh places it.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("RIFFLE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("riffle")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/riffle")))
        .unwrap_or_else(|| PathBuf::from(".cache/riffle"))
}

/// The 1-based number of the first line of `file` containing `needle`.
pub fn line_of(file: &Path, needle: &str) -> usize {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .position(|l| l.contains(needle))
        .expect("needle in file")
        + 1
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn frames_dir() -> PathBuf {
    repo().join("data/frames/bikes")
}

pub fn model(name: &str) -> PathBuf {
    repo().join("models").join(name)
}

/// Fails (never skips) when ONNX Runtime's library is missing, saying how to get it.
pub fn require_onnx_runtime() {
    let lib = riffle_operators::inference::onnx::library_path();
    assert!(
        lib.is_file(),
        "ONNX Runtime library not found at {}: run `scripts/setup.sh` (or set RIFFLE_ORT_LIB)",
        lib.display()
    );
}

/// A directory `<tmp>/<camera>/NNNN.jpg` holding the given bundled frames.
pub fn frames_subset(tmp: &Path, camera: &str, frames: impl IntoIterator<Item = usize>) -> PathBuf {
    let root = tmp.join("frames");
    let dir = root.join(camera);
    std::fs::create_dir_all(&dir).unwrap();
    for f in frames {
        let name = format!("{f:04}.jpg");
        std::fs::copy(frames_dir().join(&name), dir.join(&name)).unwrap();
    }
    root
}

/// The shipped pipeline `pipelines/<name>` to run from `dir`: its outputs (`../out/…`) go
/// into `dir`, its other paths (`../models`, `../data`) point into the checkout.
pub fn shipped(name: &str, dir: &Path) -> String {
    std::fs::read_to_string(repo().join("pipelines").join(name))
        .unwrap_or_else(|e| panic!("reading pipelines/{name}: {e}"))
        .replace("../out/", &format!("{}/", dir.display()))
        .replace("../", &format!("{}/", repo().display()))
}

pub fn write(tmp: &Path, name: &str, text: &str) -> PathBuf {
    let path = tmp.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

pub fn riffle(args: &[&str]) -> Output {
    riffle_env(args, &[])
}

/// Runs `riffle` with `env` set (after `RUST_LOG=warn`, which it may replace).
pub fn riffle_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .expect("running the riffle binary")
}

/// Runs `riffle`, failing the test with its output when it fails.
pub fn riffle_ok(args: &[&str]) -> Output {
    riffle_ok_env(args, &[])
}

/// [`riffle_ok`] with `env` set, as [`riffle_env`].
pub fn riffle_ok_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = riffle_env(args, env);
    assert!(
        out.status.success(),
        "riffle {args:?} failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `riffle run -q PIPELINE --output OUT`, failing the test when the run fails.
pub fn run_quietly(pipeline: &Path, out: &Path) -> Output {
    riffle_ok(&[
        "run",
        "-q",
        &pipeline.to_string_lossy(),
        "--output",
        &out.to_string_lossy(),
    ])
}

pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The person detector's stages (decode, resize, model in batches of up to `max_size`,
/// detections) as pipeline text, keeping detections scoring at least `threshold`.
pub fn detector_stages(threshold: f64, max_size: usize) -> String {
    format!(
        r#"
  - decode: {{}}
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: "{model}"
      inputs: {{ "image_tensor:0": tensor }}
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: {max_size}, max_delay_ms: 5 }}
  - detections: {{ boxes: boxes, scores: scores, classes: classes, box_format: yxyx_normalized, score_threshold: {threshold}, keep_classes: [1], labels: {{ 1: person }} }}"#,
        model = model("ssdlite_person.onnx").display(),
    )
}

/// The person detector, then the tracker, for a `video` source's frames (no decode stage):
/// `stages:` items as pipeline text, detections scoring at least `threshold`.
pub fn video_tracker_stages(threshold: f64) -> String {
    format!(
        r#"
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: "{model}"
      inputs: {{ "image_tensor:0": tensor }}
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: 4, max_delay_ms: 5 }}
  - detections: {{ boxes: boxes, scores: scores, classes: classes, box_format: yxyx_normalized, score_threshold: {threshold}, keep_classes: [1] }}
  - exchange: {{ key: camera_id }}"#,
        model = model("ssdlite_person.onnx").display(),
    )
}

/// [`video_tracker_stages`] keeping each frame's pixels (`keep_input`) for a `video` sink or tap.
#[allow(dead_code)]
pub fn video_tracker_stages_keeping_frames(threshold: f64) -> String {
    video_tracker_stages(threshold).replace("dtype: u8 }", "dtype: u8, keep_input: true }")
}

/// The person-detection pipeline over `frames`, with the given model batch and worker count.
pub fn detection_pipeline(
    frames: &Path,
    output: &Path,
    cameras: usize,
    max_size: usize,
    workers: usize,
) -> String {
    format!(
        r#"
name: test-detect
source:
  images: {{ path: "{frames}", cameras: {cameras}, batch_size: 3 }}
stages:
  - exchange: {{ key: camera_id }}{stages}
  - select: {{ columns: [camera_id, frame, detections_count, detections] }}
sink:
  jsonl: {{ path: "{output}" }}
runtime: {{ workers: {workers}, epoch_records: 4 }}
"#,
        frames = frames.display(),
        stages = detector_stages(0.3, max_size),
        output = output.display(),
    )
}

/// A port free now, from the OS.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A port p with p and p+1 free now, below the ephemeral range (which clients draw from).
pub fn free_port_pair() -> u16 {
    // Each call starts past the pairs handed out before in this test binary: tests running at
    // once must not get the same free pair (their clusters would share ports).
    static HANDED: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let offset = HANDED.fetch_add(8, std::sync::atomic::Ordering::Relaxed) % 2000;
    let start = 20000 + (std::process::id() % 2000) as u16 * 4 + offset;
    (start..40000)
        .step_by(2)
        .find(|p| {
            let a = std::net::TcpListener::bind(("127.0.0.1", *p));
            let b = std::net::TcpListener::bind(("127.0.0.1", *p + 1));
            a.is_ok() && b.is_ok()
        })
        .expect("a free pair of ports")
}

/// (camera_id, frame) of every result in a JSONL file, sorted.
pub fn camera_frames(path: &Path) -> Vec<(String, i64)> {
    let mut rows: Vec<(String, i64)> = read_jsonl(path)
        .iter()
        .map(|r| {
            (
                r["camera_id"].as_str().unwrap().to_string(),
                r["frame"].as_i64().unwrap(),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// (camera_id, frame) of frames `0..frames` of directory `dir` split into `cameras` streams,
/// sorted: what `cameras: N` (or `riffle produce --cameras N`) makes of them.
pub fn split_cameras(dir: &str, frames: i64, cameras: i64) -> Vec<(String, i64)> {
    let per = frames / cameras;
    let mut rows: Vec<(String, i64)> = (0..frames)
        .map(|f| (format!("{dir}-{}", f / per), f))
        .collect();
    rows.sort();
    rows
}

/// Pids of the worker processes a supervisor started for `pipeline`.
pub fn worker_pids(pipeline: &std::path::Path) -> Vec<u32> {
    let needle = pipeline.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(&needle) && cmdline.contains("--process ")
        })
        .collect()
}

/// Runs `pipeline` as a supervised cluster of 2 local processes (`extra` flags added),
/// `kill -9`s process `victim` after `after_ms` (and once a checkpoint exists, and the results
/// file has rows when `--output` is given: the kill lands mid-run, after something was saved),
/// waits for the cluster to finish by itself, and returns the supervisor's stderr, failing
/// unless it succeeded after a restart.
pub fn run_killing_one(pipeline: &Path, extra: &[&str], victim: usize, after_ms: u64) -> String {
    let port = free_port_pair().to_string();
    let mut supervisor = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", pipeline.to_str().unwrap(), "--processes", "2"])
        .args(["--base-port", &port])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(after_ms));
    let flag = |name: &str| {
        extra
            .windows(2)
            .find(|w| w[0] == name)
            .map(|w| PathBuf::from(w[1]))
    };
    let checkpoints =
        flag("--checkpoint-dir").unwrap_or_else(|| pipeline.parent().unwrap().join("ckpt"));
    let output = flag("--output");
    let saved = || {
        let checkpointed = std::fs::read_dir(&checkpoints).is_ok_and(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
        });
        let written = output
            .as_ref()
            .is_none_or(|o| std::fs::metadata(o).is_ok_and(|m| m.len() > 0));
        checkpointed && written
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !saved() {
        assert!(
            std::time::Instant::now() < deadline,
            "a checkpoint (in {}) and results before the kill",
            checkpoints.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        supervisor.try_wait().unwrap().is_none(),
        "the cluster was still running when the kill came"
    );
    let mut pids = worker_pids(pipeline);
    assert_eq!(
        pids.len(),
        2,
        "both worker processes run at {after_ms} ms: {pids:?}"
    );
    pids.sort();
    // Lower pid = started first = process 0.
    let killed = Command::new("kill")
        .args(["-9", &pids[victim].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let status = loop {
        if let Some(status) = supervisor.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut supervisor.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("restarting the cluster"),
        "the kill landed mid-run: {stderr}"
    );
    stderr
}

/// A small random generator (xorshift64) for trials at random moments: seeded from `var` when
/// set, else from the clock, and the seed printed, so that a failing run can be repeated.
pub struct Rng {
    pub seed: u64,
    state: u64,
}

impl Rng {
    pub fn seeded(var: &str) -> Rng {
        let seed = std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("seed {seed} ({var}={seed} repeats this run)");
        Rng {
            seed,
            state: seed | 1,
        }
    }

    pub fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `riffle run -q pipeline` in the background (warnings only, stdout dropped): for tests that
/// look at its outputs while it runs.
pub fn spawn_run(pipeline: &Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q"])
        .arg(pipeline)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// `GET url`: status and body (any status); `None` while nothing answers.
pub fn http_get(url: &str) -> Option<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(2)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(url).call().ok()?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().ok()?;
    Some((status, body))
}

/// Polls `probe` every 100 ms until it gives a value, failing after `timeout`.
pub fn poll_until<T>(
    what: &str,
    timeout: std::time::Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what} ({timeout:?})"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A camera's `riffle_video_<name>` gauge in a /metrics body.
pub fn scraped(body: &str, name: &str, camera: &str) -> Option<f64> {
    let key = format!("riffle_video_{name}{{camera=\"{camera}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse().unwrap())
}
