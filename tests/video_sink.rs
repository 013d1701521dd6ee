//! The `video` sink end to end: a camera's answered frames, with their boxes and labels drawn,
//! as H.264 fragmented MP4 files rolled by stream time; closing the run (its end, SIGTERM)
//! finishes every file.
//!
//! Needs the videos of `scripts/media.sh`, ONNX Runtime and FFmpeg's `ffprobe` and `ffmpeg`
//! with libx264 (`scripts/setup.sh` installs them).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn clip() -> PathBuf {
    let clip = repo().join("data/videos/bikes-0.mp4");
    assert!(
        clip.is_file(),
        "{} missing: run `scripts/media.sh` (needs ffmpeg)",
        clip.display()
    );
    clip
}

/// The person detector and tracker over camera `a` (`camera` is its YAML entry's extra keys),
/// the frame kept to the sink, which is `sink`; every result also goes to `live` (JSON lines).
fn pipeline(tmp: &Path, camera: &str, sink: &str, live: &Path) -> PathBuf {
    let text = format!(
        r#"
name: video-sink
source:
  video:
    cameras: [ {{ id: a, uri: "{clip}", {camera} }} ]
    batch_size: 4
stages:{stages}
  - track: {{ high_threshold: 0.3, new_track_threshold: 0.3 }}
  - select: {{ columns: [camera_id, frame, pts_ms, width, height, pixels, detections] }}
runtime: {{ workers: 2 }}
sink: {sink}
live_sink:
  jsonl: {{ path: "{live}" }}
"#,
        clip = clip().display(),
        // Labelled: the drawn label reads `#<track> person`.
        stages = video_tracker_stages_keeping_frames(0.2).replace(
            "keep_classes: [1] }",
            "keep_classes: [1], labels: { 1: person } }"
        ),
        live = live.display(),
    );
    write(tmp, "p.yaml", &text)
}

/// [`pipeline`] in a new temporary folder with a `video` sink of `keys` into `<tmp>/video`:
/// the folder (kept while it lives), the pipeline file, the video folder and the live results.
fn with_video_sink(camera: &str, keys: &str) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live.jsonl");
    let dir = tmp.path().join("video");
    let sink = format!("{{ video: {{ dir: \"{}\", {keys} }} }}", dir.display());
    let p = pipeline(tmp.path(), camera, &sink, &live);
    (tmp, p, dir, live)
}

/// The camera's files, oldest first.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "mp4"))
        .collect();
    files.sort();
    files
}

fn ffprobe(file: &Path, entries: &str, extra: &[&str]) -> String {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0"])
        .args(extra)
        .args(["-show_entries", entries, "-of", "csv=p=0"])
        .arg(file)
        .output()
        .expect("ffprobe (apt-get install -y ffmpeg)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "ffprobe {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Frames FFmpeg decodes from `file`.
fn frames_in(file: &Path) -> usize {
    // An HLS playlist answers for its program and its stream: the first line.
    ffprobe(file, "stream=nb_read_frames", &["-count_frames"])
        .lines()
        .next()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The first `frames` frames of `file` as RGB8 pictures.
fn decode(file: &Path, frames: usize) -> Vec<Vec<u8>> {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(file)
        .args(["-frames:v", &frames.to_string()])
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .expect("ffmpeg");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .chunks(640 * 272 * 3)
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn every_answered_frame_is_in_the_files_with_its_boxes_drawn() {
    require_onnx_runtime();
    let (_tmp, p, dir, live) = with_video_sink(
        "max_frames: 50",
        "segment_seconds: 1, fps: 25, crf: 18, preset: ultrafast",
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let mut answered = read_jsonl(&live);
    answered.sort_by_key(|r| r["frame"].as_i64());
    assert_eq!(answered.len(), 50, "max_frames: 50 answers 50 frames");
    assert!(!dir.join("dead-letters.jsonl").exists(), "no row refused");

    // 50 frames at 25 fps, 1 s a file: two files, each starting on a keyframe, fragmented,
    // holding every answered frame once.
    let files = files(&dir.join("a"));
    assert_eq!(files.len(), 2, "{files:?}");
    let counts: Vec<usize> = files.iter().map(|f| frames_in(f)).collect();
    assert_eq!(counts.iter().sum::<usize>(), 50, "{counts:?}");
    assert_eq!(counts, [25, 25], "a new file at 1 s of stream time");
    for f in &files {
        let first = ffprobe(f, "frame=pict_type", &["-read_intervals", "%+#1"]);
        assert_eq!(
            first.trim_end_matches(','),
            "I",
            "{} starts on a keyframe",
            f.display()
        );
        assert_eq!(
            ffprobe(f, "stream=codec_name,width,height,pix_fmt", &[]),
            "h264,640,272,yuv420p"
        );
        let bytes = std::fs::read(f).unwrap();
        assert!(
            bytes.windows(4).any(|w| w == b"moof"),
            "{} is fragmented",
            f.display()
        );
    }

    // Where the tracker saw people, the video shows a box's colour that the clip has not.
    let drawn: Vec<Vec<u8>> = files.iter().flat_map(|f| decode(f, 25)).collect();
    let source = decode(&clip(), 50);
    assert_eq!((drawn.len(), source.len()), (50, 50));
    let (w, h) = (640usize, 272usize);
    let px = |img: &[u8], x: usize, y: usize| {
        let at = (y.min(h - 1) * w + x.min(w - 1)) * 3;
        [img[at] as i32, img[at + 1] as i32, img[at + 2] as i32]
    };
    let mut checked = 0;
    let mut labels = 0;
    for row in &answered {
        let frame = row["frame"].as_i64().unwrap() as usize;
        for d in row["detections"].as_array().unwrap() {
            let (x1, y1, x2) = (
                d["x1"].as_f64().unwrap().max(0.0) as usize,
                d["y1"].as_f64().unwrap().max(0.0) as usize,
                d["x2"].as_f64().unwrap().max(0.0) as usize,
            );
            // The middle of the top edge (below any label band).
            let (x, y) = ((x1 + x2) / 2, y1 + 1);
            let [r, g, b] = px(&drawn[frame], x, y);
            let was = px(&source[frame], x, y);
            let spread = r.max(g).max(b) - r.min(g).min(b);
            let change = (r - was[0]).abs() + (g - was[1]).abs() + (b - was[2]).abs();
            assert!(
                spread > 90 && change > 60,
                "frame {frame}: box edge at ({x}, {y}) is drawn: {:?} (the clip: {was:?})",
                [r, g, b]
            );
            checked += 1;
            // A tracked person's label (`#<id> person`, 8×8 glyphs at 272 rows) on a band of
            // the box's colour, 10 rows high: above the box, or inside it at the top when the
            // box touches the picture's top. Its colour and dark text, where the clip had none.
            if d["track_id"].as_i64().is_some() {
                let top = if y1 >= 10 { y1 - 10 } else { y1 };
                let band: Vec<[i32; 3]> = (top + 1..top + 9)
                    .flat_map(|y| (x1 + 1..x1 + 60).map(move |x| (x, y)))
                    .map(|(x, y)| px(&drawn[frame], x, y))
                    .collect();
                let dark = band.iter().filter(|p| p[0] + p[1] + p[2] < 200).count();
                let coloured = band
                    .iter()
                    .filter(|p| p.iter().max().unwrap() - p.iter().min().unwrap() > 90)
                    .count();
                assert!(
                    dark > 20 && coloured > 100,
                    "frame {frame}: label at ({x1}, {top}): {dark} dark, {coloured} coloured \
                     of {}",
                    band.len()
                );
                labels += 1;
            }
        }
    }
    assert!(checked > 0, "the clip has people to draw");
    assert!(labels > 0, "some are tracked and labelled");
}

#[test]
fn a_stopped_run_finishes_every_file() {
    require_onnx_runtime();
    // A camera that never ends: only SIGTERM stops the run.
    let (_tmp, p, dir, live) = with_video_sink(
        "loop: true, realtime: true",
        "segment_seconds: 60, preset: ultrafast",
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Some 2 s of frames in, well past the encoder's lookahead and into a second fragment.
    while !live.exists() || read_jsonl(&live).len() < 60 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no results in 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let answered = read_jsonl(&live).len();
    let files = files(&dir.join("a"));
    assert_eq!(files.len(), 1, "{files:?}");
    // Every frame answered, up to the last, was encoded and muxed before the file closed.
    assert_eq!(frames_in(&files[0]), answered);
}

#[test]
fn results_without_the_frame_are_refused_by_validate() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live.jsonl");
    let p = pipeline(
        tmp.path(),
        "max_frames: 1",
        "{ video: { dir: video } }",
        &live,
    );
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace(", keep_input: true", "")
        .replace("height, pixels,", "height,");
    let file = write(tmp.path(), "nopixels.yaml", &text);
    // `validate` catches it, naming the sink's line and what keeps the frame.
    let out = riffle(&["validate", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sink.video")
            && stderr.contains("keep_input: true")
            && stderr.contains("nopixels.yaml:"),
        "{stderr}"
    );
    // With the frame kept it passes.
    riffle_ok(&["validate", p.to_str().unwrap()]);
}

/// `tap: { video }` in the middle of a cascade: the frames with their tracks are encoded as they
/// pass (by each worker, for its cameras) while the results go on as one row per cropped
/// object. Every frame of each camera is in its files and in its live stream.
#[test]
fn a_tap_writes_every_frame_of_each_camera_while_rows_go_on() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("video");
    let out = tmp.path().join("out.jsonl");
    let clips: Vec<PathBuf> = (0..2)
        .map(|i| repo().join(format!("data/videos/bikes-{i}.mp4")))
        .collect();
    let text = format!(
        r#"
name: tap
source:
  video:
    cameras: [ {{ id: a, uri: "{a}" }}, {{ id: b, uri: "{b}" }} ]
    batch_size: 4
stages:{stages}
  - track: {{}}
  - tap: {{ video: {{ dir: "{dir}", segment_seconds: 60, preset: ultrafast }} }}
  - crop: {{ width: 32, height: 32, min_size: 16 }}
  - select: {{ columns: [camera_id, frame, object_index] }}
runtime: {{ workers: 2 }}
sink: {{ jsonl: {{ path: "{out}" }} }}
"#,
        a = clips[0].display(),
        b = clips[1].display(),
        stages = video_tracker_stages_keeping_frames(0.3),
        dir = dir.display(),
        out = out.display(),
    );
    let p = write(tmp.path(), "tap.yaml", &text);
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let rows = read_jsonl(&out);
    assert!(!rows.is_empty(), "the crops go on to the sink");
    assert!(
        rows.iter().all(|r| r["object_index"].is_i64()),
        "one row per object"
    );
    for (camera, clip) in ["a", "b"].iter().zip(&clips) {
        let frames = frames_in(clip);
        let files = files(&dir.join(camera));
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(
            frames_in(&files[0]),
            frames,
            "camera {camera}: every frame, once"
        );
        let playlist = dir.join(camera).join("live/index.m3u8");
        let text = std::fs::read_to_string(&playlist).unwrap();
        assert!(
            text.contains("#EXT-X-ENDLIST"),
            "the run's end closes it: {text}"
        );
        assert_eq!(
            frames_in(&playlist),
            frames,
            "camera {camera}'s live stream"
        );
    }
    assert!(!dir.join("dead-letters.jsonl").exists(), "no row refused");
}

#[test]
fn a_tap_takes_only_sinks_each_worker_can_write() {
    let tmp = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
name: tap-jsonl
source:
  video: {{ cameras: [ {{ id: a, uri: "{clip}" }} ] }}
stages:
  - tap: {{ jsonl: {{ path: frames.jsonl }} }}
sink: {{ stdout: {{}} }}
"#,
        clip = clip().display()
    );
    let p = write(tmp.path(), "tap-jsonl.yaml", &text);
    let out = riffle(&["validate", p.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stages[0].tap.jsonl")
            && stderr.contains("a tap takes: video")
            && stderr.contains("tap-jsonl.yaml:"),
        "{stderr}"
    );
}
