//! The shipped cascade, end to end on the bundled MP4s: detector → tracker → line counter →
//! crops → classifier.

mod common;

use std::collections::BTreeMap;

use common::*;

/// Every crossing of the `middle` line (x = 320, top to bottom) in the bundled MP4s, as
/// (camera, frame, direction): one. Track 1 of bikes-0 walks right across the middle at frame
/// 34 (its box's bottom centre goes from x 314.4 to 328.7): `out`, since walking the line from
/// `from` to `to` (downward) the image's right is on one's left.
///
/// Counted once without Riffle's tracker or line counter: the cascade's detector stages alone
/// (resize, ssdlite_person, detections) over the four MP4s, each camera's detections tracked by
/// supervision 0.30.9's ByteTrack (set up as scripts/track_reference.py sets it: thresholds
/// 0.5 / 0.6, match IoU 0.2, buffer 30), and the rule of docs/pipeline-spec.md applied in
/// Python (a track's bottom-centre anchor stepping from one side of the line to the other, a
/// point on the line being neither side, a track unseen 30 frames forgotten). supervision's own
/// `LineZone` (anchor BOTTOM_CENTER) finds the same single crossing at the same frame (it calls
/// it "in": its orientation is the other way round). The other three clips hold none.
const CROSSINGS: [(&str, i64, &str); 1] = [("bikes-0", 34, "out")];

#[test]
fn the_cascade_classifies_each_track_every_tenth_frame_and_counts_line_crossings() {
    require_onnx_runtime();
    assert!(
        repo().join("data/videos/bikes-0.mp4").is_file(),
        "data/videos/ missing: run `scripts/media.sh` (needs ffmpeg: apt-get install -y ffmpeg)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cascade.jsonl");
    // The shipped file, with its tap's video and its dead letters written here rather than
    // into the checkout's out/.
    let yaml = shipped("camera-cascade.yaml", tmp.path());
    let pipeline = write(tmp.path(), "camera-cascade.yaml", &yaml);
    run_quietly(&pipeline, &out);
    // The tap wrote each camera's annotated video.
    let videos = tmp.path().join("video");
    for camera in ["bikes-0", "bikes-1", "bikes-2", "bikes-3"] {
        let mp4s = std::fs::read_dir(videos.join(camera))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.path().extension().is_some_and(|x| x == "mp4"))
                    .count()
            })
            .unwrap_or(0);
        assert!(
            mp4s > 0,
            "no tapped video for {camera} in {}",
            videos.display()
        );
    }
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
    // Each row carries its camera's crossings up to its frame: exactly the pinned ones.
    let mut seen_crossings = 0;
    for (camera, by_frame) in &totals {
        for (&frame, &now) in by_frame {
            let pinned = |direction: &str| {
                CROSSINGS
                    .iter()
                    .filter(|&&(c, f, d)| c == camera.as_str() && f <= frame && d == direction)
                    .count() as i64
            };
            let expected = (pinned("in"), pinned("out"));
            assert_eq!(
                now, expected,
                "{camera} frame {frame}: line totals (in, out) {now:?}, the clips hold {expected:?} \
                 by then"
            );
            seen_crossings = seen_crossings.max(expected.0 + expected.1);
        }
    }
    // A classified row after the crossing exists (bikes-0's frame 41): the totals above are
    // not all zero.
    assert_eq!(
        seen_crossings, 1,
        "no result row comes after the crossing: {totals:?}"
    );
}
