//! Model versions switched while running: a repository (`<version>/model.onnx`) gains a good
//! version, a version whose signature does not fit and a corrupt one while frames flow.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Puts `file` in the repository as `version`, atomically (copied aside, then renamed in), as
/// the docs tell users to.
fn publish(repo: &Path, version: u64, file: &Path) {
    let staging = repo.parent().unwrap().join(format!("staging-{version}"));
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::copy(file, staging.join("model.onnx")).unwrap();
    std::fs::rename(&staging, repo.join(version.to_string())).unwrap();
}

fn pipeline(frames: &Path, repo: &Path, out: &Path) -> String {
    pipeline_with(frames, repo, out, "{ workers: 2, epoch_records: 4 }")
}

fn pipeline_with(frames: &Path, repo: &Path, out: &Path, runtime: &str) -> String {
    format!(
        r#"
name: hot-swap
source:
  images: {{ path: "{frames}", cameras: 2, batch_size: 2, max_records_per_second: 40 }}
stages:
  - decode: {{}}
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: "{repo}"
      poll_ms: 100
      inputs: {{ "image_tensor:0": tensor }}
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: 4, max_delay_ms: 5 }}
  - detections: {{ boxes: boxes, scores: scores, classes: classes, score_threshold: 0.5, keep_classes: [1] }}
  - select: {{ columns: [camera_id, frame, model_version, detections_count] }}
sink:
  jsonl: {{ path: "{out}" }}
runtime: {runtime}
"#,
        frames = frames.display(),
        repo = repo.display(),
        out = out.display(),
    )
}

#[test]
fn new_versions_switch_at_one_epoch_and_bad_ones_are_refused() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..240);
    let repo = tmp.path().join("models/ssd");
    std::fs::create_dir_all(&repo).unwrap();
    publish(&repo, 1, &model("ssdlite_person.onnx"));
    let out = tmp.path().join("out.jsonl");
    let path = write(tmp.path(), "swap.yaml", &pipeline(&frames, &repo, &out));
    riffle_ok(&["validate", path.to_str().unwrap()]);

    let child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q"])
        .arg(&path)
        .env("RUST_LOG", "warn,riffle_operators=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // 240 frames at 40 a second: about 6 s of input.
    std::thread::sleep(Duration::from_millis(1500));
    publish(&repo, 2, &model("ssdlite_person.onnx"));
    std::thread::sleep(Duration::from_millis(1500));
    // Another model's inputs: refused, version 2 keeps serving.
    publish(&repo, 3, &model("mobilenet_v2_imagenet.onnx"));
    std::thread::sleep(Duration::from_millis(500));
    let corrupt = tmp.path().join("corrupt.onnx");
    std::fs::write(&corrupt, b"not an onnx model").unwrap();
    publish(&repo, 4, &corrupt);
    let result = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");

    let rows = read_jsonl(&out);
    check_versions(&rows, Some(240), &stderr);
    // The two bad versions: one line each, naming why.
    let refused: Vec<&str> = stderr.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(refused.len(), 2, "{stderr}");
    assert!(
        refused
            .iter()
            .any(|l| l.contains("version=3") && l.contains("input")),
        "{stderr}"
    );
    assert!(refused.iter().any(|l| l.contains("version=4")), "{stderr}");
}

/// Every frame answered exactly once, versions 1 then 2, never going back per camera.
fn check_versions(
    rows: &[serde_json::Value],
    frames: Option<usize>,
    stderr: &str,
) -> BTreeMap<String, BTreeMap<i64, i64>> {
    let mut by_camera: BTreeMap<String, BTreeMap<i64, i64>> = BTreeMap::new();
    for r in rows {
        let camera = r["camera_id"].as_str().unwrap().to_string();
        let frame = r["frame"].as_i64().unwrap();
        let version = r["model_version"].as_i64().unwrap();
        let previous = by_camera.entry(camera).or_default().insert(frame, version);
        assert!(previous.is_none(), "frame {frame} answered twice");
    }
    if let Some(frames) = frames {
        assert_eq!(rows.len(), frames, "{stderr}");
    }
    // Per camera, frames come in epoch order: versions never go back.
    for (camera, frames) in &by_camera {
        let versions: Vec<i64> = frames.values().copied().collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "{camera}: versions not monotone: {versions:?}"
        );
    }
    let seen: std::collections::BTreeSet<i64> = rows
        .iter()
        .map(|r| r["model_version"].as_i64().unwrap())
        .collect();
    assert_eq!(seen, [1, 2].into(), "{stderr}");
    by_camera
}

#[test]
fn the_version_schedule_survives_a_killed_process() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("models/ssd");
    std::fs::create_dir_all(&repo).unwrap();
    publish(&repo, 1, &model("ssdlite_person.onnx"));
    let out = tmp.path().join("out.jsonl");
    // Two of the test videos (scripts/setup.sh makes them), looped to 200 frames (8 s) each
    // and read at their frame rate; checkpoints can resume them.
    let videos = tmp.path().join("videos");
    std::fs::create_dir_all(&videos).unwrap();
    for name in ["bikes-0.mp4", "bikes-1.mp4"] {
        let from = common::repo().join("data/videos").join(name);
        assert!(
            from.is_file(),
            "{} is missing: run scripts/setup.sh",
            from.display()
        );
        std::fs::copy(&from, videos.join(name)).unwrap();
    }
    let videos = videos.join("*.mp4").display().to_string();
    let source = format!("video: {{ glob: \"{videos}\", realtime: true, loop: true, max_frames: 200, on_overload: wait, batch_size: 2 }}");
    let text = pipeline_with(
        Path::new("unused"),
        &repo,
        &out,
        "{ workers: 1, epoch_records: 4, checkpoint: { dir: ckpt, interval_ms: 200 } }",
    );
    let text = text
        .replace(
            &text[text.find("images:").unwrap()..text.find("\nstages:").unwrap()],
            &source,
        )
        .replace("  - decode: {}\n", "");
    let path = write(tmp.path(), "swap.yaml", &text);
    riffle_ok(&["validate", path.to_str().unwrap()]);
    let publisher = {
        let repo = repo.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            publish(&repo, 2, &model("ssdlite_person.onnx"));
        })
    };
    let stderr = run_killing_one(&path, &[], 1, 2500);
    publisher.join().unwrap();
    let rows = read_jsonl(&out);
    let by_camera = check_versions(&rows, None, &stderr);
    // No frame lost across the restart: each camera's frames are 0..n.
    for (camera, frames) in &by_camera {
        let numbers: Vec<i64> = frames.keys().copied().collect();
        let expected: Vec<i64> = (0..numbers.len() as i64).collect();
        assert_eq!(numbers, expected, "{camera}");
    }
    assert_eq!(by_camera.len(), 2);
}

#[test]
fn a_repository_without_versions_names_the_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..1);
    let repo = tmp.path().join("models/empty");
    std::fs::create_dir_all(&repo).unwrap();
    let path = write(
        tmp.path(),
        "empty.yaml",
        &pipeline(&frames, &repo, &tmp.path().join("out.jsonl")),
    );
    let result = riffle(&["validate", path.to_str().unwrap()]);
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(err.contains("1/model.onnx"), "{err}");
}
