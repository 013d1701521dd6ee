//! What an operator's tools see of a run: every process's metrics and health, the live view's
//! state over a whole cluster, JSON logs without terminal colours, and a clean stop on SIGTERM.
//! No broker and no model needed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// Two cameras of the bundled frames, replayed at `rate` frames/s (about 10 s at 50/s).
fn paced_frames(tmp: &Path, rate: u32) -> PathBuf {
    write(
        tmp,
        "paced.yaml",
        &format!(
            r#"
name: paced-frames
source:
  images: {{ path: "{frames}", cameras: 2, partition_by: camera, repeat: 2, batch_size: 2, max_records_per_second: {rate} }}
stages:
  - select: {{ columns: [camera_id, frame, path] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 1, epoch_records: 4 }}
"#,
            frames = frames_dir().display()
        ),
    )
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The paced pipeline as a local cluster of 2 processes, with `flag` (`--ui`, `--metrics-addr`)
/// at 127.0.0.1:`port`.
fn spawn_cluster(tmp: &Path, flag: &str, port: u16) -> Child {
    let pipeline = paced_frames(tmp, 40);
    spawn(&[
        "run",
        "-q",
        pipeline.to_str().unwrap(),
        "--processes",
        "2",
        "--base-port",
        &free_port_pair().to_string(),
        flag,
        &format!("127.0.0.1:{port}"),
    ])
}

/// The value of the first sample of `metric` whose labels contain `labels`.
fn sample(body: &str, metric: &str, labels: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(metric) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) on our own child, not yet waited for.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0, "sending SIGTERM");
}

fn wait_exit(child: &mut Child, timeout: Duration) -> (std::process::ExitStatus, String) {
    let status = poll_until("riffle exits", timeout, || child.try_wait().unwrap());
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[test]
fn every_process_of_a_local_cluster_serves_its_own_metrics_and_health() {
    let tmp = tempfile::tempdir().unwrap();
    let metrics = free_port_pair();
    let mut run = spawn_cluster(tmp.path(), "--metrics-addr", metrics);
    for process in 0..2u16 {
        let base = format!("http://127.0.0.1:{}", metrics + process);
        let (status, ready) = poll_until(
            &format!("process {process} ready"),
            Duration::from_secs(30),
            || http_get(&format!("{base}/readyz")).filter(|(s, _)| *s == 200),
        );
        assert_eq!(status, 200, "{ready}");
        assert_eq!(http_get(&format!("{base}/healthz")).unwrap().0, 200);
        let body = poll_until(
            &format!("process {process} counts its own source's records"),
            Duration::from_secs(30),
            || {
                http_get(&format!("{base}/metrics")).filter(|(_, b)| {
                    sample(b, "riffle_stage_records_in_total", "stage=\"source\"")
                        .is_some_and(|v| v > 0.0)
                })
            },
        )
        .1;
        assert_eq!(sample(&body, "riffle_build_info", "version=\""), Some(1.0));
        assert!(
            sample(&body, "process_resident_memory_bytes", "").is_some_and(|v| v > 1e6),
            "process metrics: {body}"
        );
        assert!(
            http_get(&format!("{base}/")).unwrap().1.contains("--ui"),
            "without --ui the page is not served and says how to get it"
        );
    }
    assert!(run.try_wait().unwrap().is_none(), "the run is still going");
    sigterm(&run);
    let (status, stderr) = wait_exit(&mut run, Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM ends the cluster with 0: {stderr}"
    );
}

#[test]
fn the_view_of_process_0_shows_the_cameras_and_stages_of_every_process() {
    let tmp = tempfile::tempdir().unwrap();
    let ui = free_port_pair();
    let mut run = spawn_cluster(tmp.path(), "--ui", ui);
    let base = format!("http://127.0.0.1:{ui}");
    // Camera k is read on process k: both show a frame only if process 1 reports to 0.
    let state: serde_json::Value = poll_until(
        "both cameras and both processes in the view",
        Duration::from_secs(40),
        || {
            let (_, body) = http_get(&format!("{base}/api/state"))?;
            let state: serde_json::Value = serde_json::from_str(&body).ok()?;
            let cameras = state["cameras"].as_array()?.len();
            let processes = state["processes"].as_array()?.len();
            (cameras == 2 && processes == 2 && state["ready"] == true).then_some(state)
        },
    );
    assert_eq!(state["about"]["processes"], 2);
    assert!(state["about"]["plan"].as_str().unwrap().contains("worker"));
    let source = state["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "source")
        .expect("a source stage");
    assert!(source["records_out"].as_u64().unwrap() > 0);
    for camera in state["cameras"].as_array().unwrap() {
        let url = format!(
            "{base}/frame?camera={}&v={}",
            camera["camera_id"].as_str().unwrap(),
            camera["version"]
        );
        let frame = ureq::get(&url)
            .call()
            .unwrap()
            .body_mut()
            .read_to_vec()
            .unwrap();
        assert_eq!(&frame[..2], &[0xFF, 0xD8], "{url} is a JPEG");
        assert_eq!(
            camera["row"]["frame"], camera["frame"],
            "the row is the frame's"
        );
    }
    let page = http_get(&format!("{base}/")).unwrap().1;
    assert!(page.contains("<script src=\"/app.js\">"), "{page}");
    assert!(http_get(&format!("{base}/app.js"))
        .unwrap()
        .1
        .contains("EventSource"));
    sigterm(&run);
    let (status, stderr) = wait_exit(&mut run, Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
}

#[test]
fn a_finished_run_keeps_its_view_up_until_it_is_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = paced_frames(tmp.path(), 1000);
    let ui = free_port_pair();
    let mut run = spawn(&[
        "run",
        pipeline.to_str().unwrap(),
        "--ui",
        &format!("127.0.0.1:{ui}"),
    ]);
    let base = format!("http://127.0.0.1:{ui}");
    let state: serde_json::Value =
        poll_until("the view's final state", Duration::from_secs(40), || {
            let (_, body) = http_get(&format!("{base}/api/state"))?;
            let state: serde_json::Value = serde_json::from_str(&body).ok()?;
            (state["finished"] == true).then_some(state)
        });
    let out = read_jsonl(&tmp.path().join("out.jsonl"));
    assert_eq!(state["results_seen"], out.len() as u64, "every result seen");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(run.try_wait().unwrap().is_none(), "the view stays up");
    assert_eq!(http_get(&format!("{base}/healthz")).unwrap().0, 200);
    sigterm(&run);
    let (status, stderr) = wait_exit(&mut run, Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("stays up"),
        "says why it keeps running: {stderr}"
    );
}

#[test]
fn json_logs_are_one_object_a_line_and_no_colour_reaches_a_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = paced_frames(tmp.path(), 1000);
    for format in ["json", "text"] {
        let out = Command::new(env!("CARGO_BIN_EXE_riffle"))
            // `--workers auto` logs the plan it chose (at info).
            .args([
                "run",
                "-q",
                pipeline.to_str().unwrap(),
                "--workers",
                "auto",
                "--log-format",
                format,
            ])
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        assert!(out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains('\u{1b}'),
            "no ANSI escapes in a pipe: {stderr}"
        );
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(!lines.is_empty(), "RUST_LOG=info logs something");
        if format == "json" {
            for line in lines {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
                assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
            }
        }
    }
}
