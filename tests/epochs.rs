//! `runtime.epoch_ms`: epochs that also close on time, so a slow source's results reach the
//! sink long before a count-based epoch would fill.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// 40 frames read at 10 a second (4 s) into epochs of up to 1000 records, optionally closed
/// every `epoch_ms`: how many results the sink holds 2 s in, and at the end.
fn results_midway(tmp: &Path, epoch_ms: Option<u64>) -> (usize, usize) {
    let frames = frames_subset(tmp, "cam", 0..40);
    let name = epoch_ms.map_or("counted".to_string(), |ms| format!("timed-{ms}"));
    let out = tmp.join(format!("{name}.jsonl"));
    let timing = epoch_ms.map_or(String::new(), |ms| format!(", epoch_ms: {ms}"));
    let text = format!(
        r#"
source: {{ images: {{ path: "{frames}", batch_size: 1, max_records_per_second: 10 }} }}
stages:
  - decode: {{}}
  - select: {{ columns: [camera_id, frame, width, height] }}
sink: {{ jsonl: {{ path: "{out}" }} }}
runtime: {{ workers: 1, epoch_records: 1000{timing} }}
"#,
        frames = frames.display(),
        out = out.display(),
    );
    let pipeline = write(tmp, &format!("{name}.yaml"), &text);
    riffle_ok(&["validate", pipeline.to_str().unwrap()]);
    let mut child = spawn_run(&pipeline);
    std::thread::sleep(Duration::from_secs(2));
    let midway = lines(&out);
    assert!(child.wait().unwrap().success());
    (midway, lines(&out))
}

#[test]
fn epoch_ms_sends_a_slow_sources_results_on_before_the_epoch_fills() {
    let tmp = tempfile::tempdir().unwrap();
    let (counted_midway, counted_total) = results_midway(&tmp.path().join("a"), None);
    let (timed_midway, timed_total) = results_midway(&tmp.path().join("b"), Some(200));
    assert_eq!((counted_total, timed_total), (40, 40));
    // Counted epochs: the one epoch closes when the input ends, 4 s in.
    assert_eq!(counted_midway, 0);
    // 200 ms epochs: about 20 results by 2 s (the margin absorbs a slow start).
    assert!(timed_midway >= 5, "{timed_midway} results 2 s into the run");
}

#[test]
fn epoch_ms_out_of_range_names_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..1);
    let text = format!(
        "source: {{ images: {{ path: \"{}\" }} }}\nstages: [ {{ decode: {{}} }} ]\nsink: {{ jsonl: {{ path: out.jsonl }} }}\nruntime: {{ epoch_ms: 0 }}\n",
        frames.display()
    );
    let p = write(tmp.path(), "bad.yaml", &text);
    let result = riffle(&["validate", p.to_str().unwrap()]);
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(err.contains("epoch_ms"), "{err}");
}

/// Seconds of a duration as the summary prints it (`12 µs`, `3.40 ms`, `1.20 s`).
fn seconds(text: &str) -> f64 {
    let (value, unit) = text.split_once(' ').unwrap();
    let value: f64 = value.parse().unwrap();
    match unit {
        "µs" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        other => panic!("unit {other}"),
    }
}

#[test]
fn the_summary_tells_results_ready_from_results_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..20);
    let out = tmp.path().join("out.jsonl");
    // 20 frames at 10 a second in one epoch: each result exists within milliseconds of its
    // read, and is written when the input ends, about 2 s after the first read.
    let text = format!(
        r#"
source: {{ images: {{ path: "{frames}", batch_size: 1, max_records_per_second: 10 }} }}
stages:
  - decode: {{}}
  - select: {{ columns: [camera_id, frame] }}
sink: {{ jsonl: {{ path: "{out}" }} }}
runtime: {{ workers: 1, epoch_records: 1000 }}
"#,
        frames = frames.display(),
        out = out.display(),
    );
    let pipeline = write(tmp.path(), "p.yaml", &text);
    let run = riffle_ok(&["run", pipeline.to_str().unwrap()]);
    let report =
        String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    let line = report
        .lines()
        .find(|l| l.starts_with("latency: "))
        .unwrap_or_else(|| panic!("no latency line:\n{report}"));
    let after = |key: &str| {
        let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key}: {line}")) + key.len()..];
        let end = rest.find(" p99").unwrap_or(rest.len());
        seconds(rest[..end].trim())
    };
    let ready = after("results ready p50 ");
    let committed = after("written p50 ");
    assert!(committed > 0.5, "{line}");
    assert!(ready < committed / 4.0, "{line}");
}

#[test]
fn live_cameras_fps_complete_each_frames_epoch_while_waiting_for_the_next() {
    // 2 cameras × 20 frames at 10 fps (2 s), epochs of up to 1000 records and no epoch_ms: a
    // source that waits for its next frame closes its epoch, so results are written as they
    // come instead of when the input ends.
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..40);
    let out = tmp.path().join("live.jsonl");
    let text = format!(
        r#"
source: {{ images: {{ path: "{frames}", cameras: 2, partition_by: camera, fps: 10 }} }}
stages:
  - decode: {{}}
  - select: {{ columns: [camera_id, frame] }}
sink: {{ jsonl: {{ path: "{out}" }} }}
runtime: {{ workers: 2, epoch_records: 1000 }}
"#,
        frames = frames.display(),
        out = out.display(),
    );
    let pipeline = write(tmp.path(), "live.yaml", &text);
    let started = std::time::Instant::now();
    let mut child = spawn_run(&pipeline);
    std::thread::sleep(Duration::from_millis(1200));
    let midway = lines(&out);
    assert!(child.wait().unwrap().success());
    // Paced: the last frames are due 1.9 s after the start.
    assert!(started.elapsed() >= Duration::from_millis(1900));
    assert_eq!(lines(&out), 40);
    // About 24 results by 1.2 s (the margin absorbs a slow start); counted epochs: none.
    assert!(midway >= 6, "{midway} results 1.2 s into the run");
}

#[test]
fn a_live_sink_gets_results_as_they_exist_and_the_sink_when_their_epoch_commits() {
    // 40 frames at 10 a second in one epoch (4 s): the live file fills as frames are read,
    // the committed one when the input ends; both end with every result once.
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..40);
    let (out, live) = (tmp.path().join("out.jsonl"), tmp.path().join("live.jsonl"));
    let text = format!(
        r#"
source: {{ images: {{ path: "{frames}", batch_size: 1, max_records_per_second: 10 }} }}
stages:
  - decode: {{}}
  - select: {{ columns: [camera_id, frame] }}
sink: {{ jsonl: {{ path: "{out}" }} }}
live_sink: {{ jsonl: {{ path: "{live}" }} }}
runtime: {{ workers: 1, epoch_records: 1000, latency_column: latency_ms }}
"#,
        frames = frames.display(),
        out = out.display(),
        live = live.display(),
    );
    let pipeline = write(tmp.path(), "p.yaml", &text);
    riffle_ok(&["validate", pipeline.to_str().unwrap()]);
    let mut child = spawn_run(&pipeline);
    std::thread::sleep(Duration::from_secs(2));
    let (live_midway, committed_midway) = (lines(&live), lines(&out));
    assert!(child.wait().unwrap().success());
    assert!(
        live_midway >= 5,
        "{live_midway} live results 2 s into the run"
    );
    assert_eq!(committed_midway, 0);
    let mut live_rows = camera_frames(&live);
    live_rows.dedup();
    assert_eq!(live_rows, camera_frames(&out));
    assert_eq!(live_rows.len(), 40);
    // Live rows carry their latency when they were sent: well under the committed wait.
    let first = &read_jsonl(&live)[0];
    assert!(first["latency_ms"].as_f64().unwrap() < 1000.0, "{first}");
}
