//! Track ids survive `kill -9`: a supervised 2-process cluster tracking the 4 bundled MP4
//! cameras, one process killed mid-run, gives every frame once with the track ids of an
//! uninterrupted run (the trackers' state comes back from the checkpoint, on the worker that
//! owns each camera).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;

fn pipeline(dir: &Path, checkpoint: Option<&Path>, out: &Path) -> std::path::PathBuf {
    let checkpoint = checkpoint.map_or(String::new(), |c| {
        format!(", checkpoint: {{ dir: \"{}\" }}", c.display())
    });
    let text = format!(
        r#"
source:
  video: {{ glob: "{videos}/*.mp4", batch_size: 2 }}
stages:
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: "{model}"
      inputs: {{ "image_tensor:0": tensor }}
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: 2, max_delay_ms: 5 }}
  - detections: {{ score_threshold: 0.1, keep_classes: [1], boxes: boxes, scores: scores, classes: classes }}
  - track: {{}}
  - select: {{ columns: [camera_id, frame, detections] }}
sink:
  jsonl: {{ path: "{out}" }}
runtime: {{ workers: 1, epoch_records: 4, slow_worker: {{ worker: 0, delay_ms: 40 }}{checkpoint} }}
"#,
        videos = repo().join("data/videos").display(),
        model = model("ssdlite_person.onnx").display(),
        out = out.display(),
    );
    write(dir, "tracking.yaml", &text)
}

/// (camera, frame) → the frame's track ids in detection order.
fn track_ids(out: &Path) -> BTreeMap<(String, i64), Vec<Option<i64>>> {
    let mut by_frame = BTreeMap::new();
    for row in read_jsonl(out) {
        let key = (
            row["camera_id"].as_str().unwrap().to_string(),
            row["frame"].as_i64().unwrap(),
        );
        let ids = row["detections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["track_id"].as_i64())
            .collect();
        assert!(
            by_frame.insert(key.clone(), ids).is_none(),
            "{key:?} written twice"
        );
    }
    by_frame
}

#[test]
fn track_ids_continue_after_kill_9_as_in_an_uninterrupted_run() {
    require_onnx_runtime();
    assert!(
        repo().join("data/videos/bikes-0.mp4").is_file(),
        "data/videos/ missing: run `scripts/media.sh` (needs ffmpeg: apt-get install -y ffmpeg)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole.jsonl");
    riffle_ok(&[
        "run",
        "-q",
        pipeline(tmp.path(), None, &whole).to_str().unwrap(),
    ]);
    let expected = track_ids(&whole);
    assert_eq!(expected.len(), 250, "every frame of the 4 cameras");
    assert!(
        expected.values().flatten().any(Option::is_some),
        "the uninterrupted run tracked someone"
    );

    let killed = tmp.path().join("killed");
    std::fs::create_dir_all(&killed).unwrap();
    let out = killed.join("out.jsonl");
    let p = pipeline(&killed, Some(&killed.join("ckpt")), &out);
    run_killing_one(&p, &[], 1, 4000);
    assert_eq!(track_ids(&out), expected);
}
