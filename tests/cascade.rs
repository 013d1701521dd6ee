//! The shipped cascade, end to end on the bundled MP4s: detector → tracker → line counter →
//! crops → classifier.

mod common;

use std::collections::BTreeMap;

use common::*;

#[test]
fn the_cascade_classifies_each_track_every_tenth_frame_and_counts_line_crossings() {
    require_onnx_runtime();
    assert!(
        repo().join("data/videos/bikes-0.mp4").is_file(),
        "data/videos/ missing: run `scripts/media.sh` (needs ffmpeg: apt-get install -y ffmpeg)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cascade.jsonl");
    riffle_ok(&[
        "run",
        "-q",
        repo()
            .join("pipelines/camera-cascade.yaml")
            .to_str()
            .unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    let rows = read_jsonl(&out);
    assert!(!rows.is_empty(), "no object was classified");
    // Per camera and track: the frames its crop was classified at.
    let mut classified: BTreeMap<(String, i64), Vec<i64>> = BTreeMap::new();
    // Per camera: the line totals by frame.
    let mut totals: BTreeMap<String, BTreeMap<i64, (i64, i64)>> = BTreeMap::new();
    for row in &rows {
        let camera = row["camera_id"].as_str().unwrap().to_string();
        let frame = row["frame"].as_i64().unwrap();
        let label = row["top_label"].as_str().unwrap_or("");
        let score = row["top_score"].as_f64().unwrap_or(-1.0);
        assert!(!label.is_empty() && score > 0.0 && score <= 1.0, "{row}");
        // `tracked_only`: every crop is of a tracked person.
        let track = row["track_id"]
            .as_i64()
            .unwrap_or_else(|| panic!("untracked: {row}"));
        classified
            .entry((camera.clone(), track))
            .or_default()
            .push(frame);
        let (mut i, mut o) = (0, 0);
        for t in row["line_totals"].as_array().unwrap() {
            i += t["in"].as_i64().unwrap();
            o += t["out"].as_i64().unwrap();
        }
        totals.entry(camera).or_default().insert(frame, (i, o));
    }
    assert!(!classified.is_empty(), "no tracked object was classified");
    for ((camera, track), mut frames) in classified {
        frames.sort();
        frames.dedup();
        for pair in frames.windows(2) {
            assert!(
                pair[1] - pair[0] >= 10,
                "{camera} track {track} classified at frames {frames:?}: reinfer_every is 10"
            );
        }
    }
    // Running totals never go down along a camera's frames.
    for (camera, by_frame) in totals {
        let mut last = (0, 0);
        for (frame, now) in by_frame {
            assert!(
                now.0 >= last.0 && now.1 >= last.1,
                "{camera} frame {frame}: totals {now:?} after {last:?}"
            );
            last = now;
        }
    }
}
