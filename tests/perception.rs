//! Multi-camera perception: cameras sharded across workers with per-camera order kept end to
//! end, each result's latency, and frames past their real-time budget counted or dropped.

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::Value;

/// The shipped camera pipeline over `frames` with `edits` applied, run; returns the results and
/// the end-of-run summary.
fn run_camera(
    tmp: &std::path::Path,
    frames: &std::path::Path,
    edits: &[(&str, &str)],
) -> (Vec<Value>, String) {
    let mut text = std::fs::read_to_string(repo().join("pipelines/camera-perception.yaml"))
        .unwrap()
        .replace("../data/frames", frames.to_str().unwrap())
        .replace("../", &format!("{}/", repo().display()));
    for (from, to) in edits {
        assert!(text.contains(from), "edit `{from}` not found");
        text = text.replace(from, to);
    }
    let out = tmp.join("out.jsonl");
    let p = write(tmp, "camera.yaml", &text);
    let run = riffle_ok(&[
        "run",
        p.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    (
        read_jsonl(&out),
        String::from_utf8_lossy(&run.stderr).into_owned(),
    )
}

/// The `late` column of a stage's row in the summary.
fn late_of(summary: &str, stage: &str) -> u64 {
    let row = summary
        .lines()
        .find(|l| l.split_whitespace().next() == Some(stage))
        .unwrap_or_else(|| panic!("no `{stage}` row in:\n{summary}"));
    row.split_whitespace().nth(4).unwrap().parse().unwrap()
}

#[test]
fn each_camera_stays_in_order_and_results_carry_their_latency() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "street", 100..160);
    let (rows, _) = run_camera(tmp.path(), &frames, &[("workers: 2", "workers: 3")]);
    assert_eq!(rows.len(), 60);
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for r in &rows {
        let camera = r["camera_id"].as_str().unwrap().to_string();
        let frame = r["frame"].as_i64().unwrap();
        if let Some(prev) = last.insert(camera.clone(), frame) {
            assert!(frame > prev, "camera {camera}: frame {frame} after {prev}");
        }
        let latency = r["latency_ms"].as_f64().unwrap();
        assert!(latency > 0.0 && latency < 60_000.0, "{r}");
    }
    assert_eq!(last.len(), 4, "4 cameras: {last:?}");
}

#[test]
fn frames_past_the_real_time_budget_are_counted_and_optionally_dropped() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "street", 0..12);
    // A budget of 0 ms: every frame is late by the time the model gets it.
    let (rows, summary) = run_camera(
        tmp.path(),
        &frames,
        &[("late_after_ms: 2000", "late_after_ms: 0")],
    );
    assert_eq!(rows.len(), 12, "counted, not dropped");
    assert_eq!(late_of(&summary, "model"), 12, "{summary}");
    let (rows, summary) = run_camera(
        tmp.path(),
        &frames,
        &[("late_after_ms: 2000", "late_after_ms: 0, drop_late: true")],
    );
    assert!(rows.is_empty(), "late frames dropped: {rows:?}");
    assert_eq!(late_of(&summary, "model"), 12, "{summary}");
    // A generous budget: nothing is late.
    let (rows, summary) = run_camera(
        tmp.path(),
        &frames,
        &[(
            "late_after_ms: 2000",
            "late_after_ms: 60000, drop_late: true",
        )],
    );
    assert_eq!(rows.len(), 12);
    assert_eq!(late_of(&summary, "model"), 0, "{summary}");
}

#[test]
fn balanced_routing_with_a_slow_worker_keeps_every_frame_once_and_each_camera_in_order() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "street", 100..180);
    let (rows, summary) = run_camera(
        tmp.path(),
        &frames,
        &[
            (
                "stages:\n",
                "stages:\n  - exchange: { balance: true, ordered_by: camera_id }\n",
            ),
            (
                "latency_column: latency_ms",
                "latency_column: latency_ms\n  slow_worker: { worker: 1, delay_ms: 40 }",
            ),
        ],
    );
    assert_eq!(rows.len(), 80, "{summary}");
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    let mut frames_seen = std::collections::BTreeSet::new();
    for r in &rows {
        let camera = r["camera_id"].as_str().unwrap().to_string();
        let frame = r["frame"].as_i64().unwrap();
        assert!(frames_seen.insert(frame), "frame {frame} twice");
        if let Some(prev) = last.insert(camera.clone(), frame) {
            assert!(frame > prev, "camera {camera}: frame {frame} after {prev}");
        }
    }
    assert_eq!(last.len(), 4, "4 cameras: {last:?}");
}
