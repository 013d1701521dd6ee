//! The shipped tracking pipeline on the bundled street frames (4 cameras), its track ids
//! compared with supervision's ByteTrack run on the very same detections
//! (scripts/track_reference.py, motmetrics' IDF1 with supervision's ids as ground truth); and
//! the same comparison on a dense synthetic scene, where many more tracks meet, cross, vanish
//! and come back than the bundled frames' few detections give.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// IDF1 of Riffle's ids against supervision's must reach this. Measured: 1.0 (identical ids)
/// on both scenes; the margin is for assignment ties and f32/f64 rounding at thresholds.
const MIN_IDF1: f64 = 0.98;

/// The venv scripts/setup.sh fills with supervision and motmetrics.
fn reference_python() -> PathBuf {
    let cache = cache_dir();
    let python = cache.join("track-venv/bin/python");
    let ready = Command::new(&python)
        .args([
            "-c",
            "import supervision, motmetrics; supervision.ByteTrack",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ready,
        "supervision (with ByteTrack) and motmetrics not found in {}: run `scripts/setup.sh` \
         (or `python3 -m venv {venv} && {venv}/bin/pip install supervision==0.30.9 \
         motmetrics==1.4.0`)",
        python.display(),
        venv = cache.join("track-venv").display(),
    );
    python
}

/// Runs scripts/track_reference.py on a results file with the default `track` parameters
/// (those of camera-tracking.yaml, passed on to supervision); returns its report.
fn compare(python: &Path, results: &Path) -> Value {
    let run = Command::new(python)
        .arg(repo().join("scripts/track_reference.py"))
        .arg(results)
        .args(["--high-threshold", "0.5", "--low-threshold", "0.1"])
        .args(["--new-track-threshold", "0.6", "--match-iou", "0.2"])
        .args(["--track-buffer", "30"])
        .output()
        .expect("running scripts/track_reference.py");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "track_reference.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let idf1 = report["idf1"].as_f64().expect("idf1");
    let switches = report["id_switches"].as_i64().expect("id_switches");
    println!(
        "riffle vs supervision ByteTrack: IDF1 {idf1:.4}, ID switches {switches}; ids: \
         supervision {}, riffle {}; {report}",
        report["reference_ids"], report["riffle_ids"]
    );
    report
}

#[test]
fn track_ids_agree_with_supervision_bytetrack_on_the_bundled_frames() {
    require_onnx_runtime();
    let python = reference_python();
    let tmp = tempfile::tempdir().unwrap();
    let dead = tmp.path().join("dead.jsonl");
    let text = std::fs::read_to_string(repo().join("pipelines/camera-tracking.yaml"))
        .unwrap()
        .replace(
            "../out/camera-tracking.dead-letters.jsonl",
            dead.to_str().unwrap(),
        )
        .replace("../", &format!("{}/", repo().display()));
    let out = tmp.path().join("tracks.jsonl");
    let pipeline = write(tmp.path(), "tracking.yaml", &text);
    riffle_ok(&[
        "run",
        pipeline.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    let rows = read_jsonl(&out);
    assert_eq!(rows.len(), 250, "every frame once");
    let letters = std::fs::read_to_string(&dead).unwrap_or_default();
    assert!(letters.is_empty(), "dead letters:\n{letters}");

    let report = compare(&python, &out);
    assert_eq!(report["cameras"], 4);
    // The detector finds few people on these frames: a handful of tracks.
    assert!(report["reference_ids"].as_i64() >= Some(4), "{report}");
    assert!(report["tracked_by_riffle"].as_i64() >= Some(40), "{report}");
    let idf1 = report["idf1"].as_f64().expect("idf1");
    assert!(idf1 >= MIN_IDF1, "IDF1 {idf1} < {MIN_IDF1}: {report}");
}

/// A small deterministic generator (xorshift64*), so the scene is the same on every machine.
struct Rng(u64);

impl Rng {
    /// Uniform in `0..1`.
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[test]
fn track_ids_agree_with_supervision_bytetrack_on_a_dense_synthetic_scene() {
    use riffle_operators::vision::track::{CameraTracks, Detection, TrackConfig};

    let python = reference_python();
    let params = serde_json::from_str::<TrackConfig>("{}")
        .unwrap()
        .params()
        .unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut lines = String::new();
    for camera in 0..3 {
        // 14 people walking across a 640×360 view at their own speeds, bouncing off its edges.
        let mut people: Vec<[f32; 6]> = (0..14)
            .map(|_| {
                let h = 40.0 + 60.0 * rng.next();
                [
                    600.0 * rng.next(),
                    300.0 * rng.next(),
                    6.0 * rng.next() - 3.0,
                    2.0 * rng.next() - 1.0,
                    0.4 * h,
                    h,
                ]
            })
            .collect();
        let mut tracks = CameraTracks::default();
        for frame in 0..300i64 {
            let mut dets = Vec::new();
            for (k, p) in people.iter_mut().enumerate() {
                p[0] += p[2];
                p[1] += p[3];
                if !(0.0..600.0).contains(&p[0]) {
                    p[2] = -p[2];
                }
                if !(0.0..300.0).contains(&p[1]) {
                    p[3] = -p[3];
                }
                // Each person is hidden now and then (person k: frames 40k..40k+15, mod 300),
                // missed at random, and sometimes seen with a low score.
                let hidden = (frame - 40 * k as i64).rem_euclid(300) < 15;
                if hidden || rng.next() < 0.08 {
                    continue;
                }
                let score = if rng.next() < 0.2 {
                    0.1 + 0.4 * rng.next()
                } else {
                    0.6 + 0.39 * rng.next()
                };
                let jitter = |rng: &mut Rng| 3.0 * rng.next() - 1.5;
                let (x, y) = (p[0] + jitter(&mut rng), p[1] + jitter(&mut rng));
                dets.push(Detection {
                    rect: [x, y, x + p[4], y + p[5]],
                    score,
                    class_id: 1,
                });
            }
            // Clutter: a weak detection somewhere.
            if rng.next() < 0.3 {
                let (x, y) = (600.0 * rng.next(), 300.0 * rng.next());
                dets.push(Detection {
                    rect: [x, y, x + 20.0, y + 50.0],
                    score: 0.1 + 0.3 * rng.next(),
                    class_id: 1,
                });
            }
            let ids = tracks.step(frame, &dets, &params);
            let detections: Vec<Value> = dets
                .iter()
                .zip(&ids)
                .map(|(d, id)| {
                    serde_json::json!({
                        "class_id": d.class_id, "score": d.score,
                        "x1": d.rect[0], "y1": d.rect[1], "x2": d.rect[2], "y2": d.rect[3],
                        "track_id": id,
                    })
                })
                .collect();
            let row = serde_json::json!({
                "camera_id": format!("synthetic-{camera}"),
                "frame": frame,
                "detections": detections,
            });
            lines.push_str(&row.to_string());
            lines.push('\n');
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let results = write(tmp.path(), "synthetic.jsonl", &lines);
    let report = compare(&python, &results);
    assert_eq!(report["cameras"], 3);
    assert!(report["reference_ids"].as_i64() > Some(40), "{report}");
    let idf1 = report["idf1"].as_f64().expect("idf1");
    assert!(idf1 >= MIN_IDF1, "IDF1 {idf1} < {MIN_IDF1}: {report}");
}
