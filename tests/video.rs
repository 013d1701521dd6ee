//! The video source end to end: MP4 cameras give the detections the JPEG frames give; live RTSP
//! cameras survive an outage, drop (and count) frames when overloaded, fail alone when they
//! never come up; file cameras resume from a checkpoint with every frame exactly once.
//!
//! Needs the videos of `scripts/media.sh` and, for RTSP, GStreamer's RTSP server for the system
//! Python (`scripts/rtsp_server.py`); `scripts/setup.sh` installs both.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::rtsp::*;
use common::*;
use serde_json::Value;

fn videos() -> PathBuf {
    let dir = repo().join("data/videos");
    assert!(
        dir.join("bikes-3.mp4").is_file() && dir.join("live/bikes-2.mp4").is_file(),
        "test videos missing in {}: run `scripts/media.sh` (needs ffmpeg: apt-get install -y ffmpeg)",
        dir.display()
    );
    dir
}

/// A running `riffle run`.
struct Run {
    child: Child,
    started: Instant,
}

fn spawn_run(pipeline: &Path) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", pipeline.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Run {
        child,
        started: Instant::now(),
    }
}

impl Run {
    /// Waits for the run to end by itself; its stderr (log and summary), failing unless it
    /// succeeded.
    fn finish(mut self) -> String {
        let deadline = self.started + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the run did not end by itself");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(status.success(), "{stderr}");
        stderr
    }
}

/// A connector metric from the end-of-run summary (`riffle_video_…{camera=ID} value`); 0 when
/// the camera never touched it.
fn metric(summary: &str, name: &str, camera: &str) -> f64 {
    let key = format!("riffle_video_{name}{{camera={camera}}} ");
    summary
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Frames of `camera` a full queue discarded: counted as dropped (overload) or as skipped on
/// connect (a connection's opening burst).
fn lost(summary: &str, camera: &str) -> usize {
    (metric(summary, "frames_dropped_total", camera)
        + metric(summary, "frames_skipped_on_connect_total", camera)) as usize
}

/// Rows of `path` by camera: (frame, ingest_ms), in output order.
fn by_camera(rows: &[Value]) -> BTreeMap<String, Vec<(i64, i64)>> {
    let mut per: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for r in rows {
        per.entry(r["camera_id"].as_str().unwrap().to_string())
            .or_default()
            .push((
                r["frame"].as_i64().unwrap(),
                r["ingest_ms"].as_i64().unwrap_or(0),
            ));
    }
    per
}

fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A pipeline reading `cameras` (YAML list entries) with `source_extra` source keys, through
/// `stages`, into `out`.
fn live_pipeline(
    cameras: &[String],
    source_extra: &str,
    stages: &str,
    runtime: &str,
    out: &Path,
) -> String {
    format!(
        "name: test-video\n\
         source:\n  video: {{ cameras: [{}], backoff_ms: 200, max_backoff_ms: 1000{source_extra} }}\n\
         stages:\n{stages}\n\
         sink:\n  jsonl: {{ path: \"{}\" }}\n\
         dead_letter:\n  jsonl: {{ path: \"{}.dead\" }}\n\
         runtime: {{ epoch_records: 8{runtime} }}\n",
        cameras.join(", "),
        out.display(),
        out.display(),
    )
}

const SELECT_ONLY: &str =
    "  - select: { columns: [camera_id, frame, pts_ms, ingest_ms, width, height] }";

fn camera_entry(id: &str, uri: &str) -> String {
    format!("{{ id: {id}, uri: \"{uri}\" }}")
}

#[test]
fn mp4_cameras_give_the_detections_of_the_jpeg_frames() {
    require_onnx_runtime();
    videos();
    let tmp = tempfile::tempdir().unwrap();
    let run = |pipeline: &str| -> Vec<Value> {
        run_to_jsonl(
            &repo().join("pipelines").join(pipeline),
            &tmp.path().join(format!("{pipeline}.jsonl")),
        )
    };
    let images = run("camera-perception.yaml");
    let video = run("camera-video.yaml");
    assert_eq!(images.len(), 250);
    assert_eq!(video.len(), 250, "every frame of the 4 videos");
    // The images source keeps the files' numbers (camera k starts at frame ceil(k*250/4)); the
    // video source numbers each camera's frames from 0.
    let first = |camera: &str| -> i64 {
        let k: i64 = camera.rsplit('-').next().unwrap().parse().unwrap();
        (k * 250 + 3) / 4
    };
    let key = |r: &Value, from_zero: bool| {
        let camera = r["camera_id"].as_str().unwrap().to_string();
        let frame = r["frame"].as_i64().unwrap();
        let frame = if from_zero {
            frame + first(&camera)
        } else {
            frame
        };
        (camera, frame)
    };
    let images: BTreeMap<_, _> = images.iter().map(|r| (key(r, false), r)).collect();
    let video: BTreeMap<_, _> = video.iter().map(|r| (key(r, true), r)).collect();
    assert_eq!(
        images.keys().collect::<Vec<_>>(),
        video.keys().collect::<Vec<_>>(),
        "same cameras and frames"
    );
    // JPEG and (lossless) H.264 frames differ by their YUV → RGB conversions (and the video
    // source's one-pass scaling), which moves scores by up to ~0.03.
    assert_same_detections(&images, &video);
}

/// Runs `pipeline` quietly with its results going to `out`, and reads them.
fn run_to_jsonl(pipeline: &Path, out: &Path) -> Vec<Value> {
    run_quietly(pipeline, out);
    read_jsonl(out)
}

type Keyed<'a> = BTreeMap<(String, i64), &'a Value>;

/// Detections clear of the 0.5 threshold match one to one (score within 0.06, corners within a
/// few percent of the 640-pixel width, in the picture's own coordinates); those near it may
/// appear on one side only.
fn assert_same_detections(a_rows: &Keyed, b_rows: &Keyed) {
    const CLEAR: f64 = 0.55;
    let score = |d: &Value| d["score"].as_f64().unwrap();
    let (mut persons_a, mut persons_b) = (0, 0);
    for (k, a) in a_rows {
        let b = b_rows[k];
        assert_eq!(
            (b["width"].as_u64(), b["height"].as_u64()),
            (Some(640), Some(272))
        );
        let clear = |r: &Value| -> Vec<Value> {
            let all = r["detections"].as_array().unwrap();
            all.iter().filter(|d| score(d) >= CLEAR).cloned().collect()
        };
        let (da, db) = (clear(a), clear(b));
        let near = |r: &Value| {
            let all = r["detections"].as_array().unwrap();
            all.iter().any(|d| (score(d) - CLEAR).abs() < 0.05)
        };
        if da.len() != db.len() && (near(a) || near(b)) {
            continue;
        }
        assert_eq!(da.len(), db.len(), "{k:?}: detections\n{a}\n{b}");
        persons_a += usize::from(a["detections_count"].as_i64() > Some(0));
        persons_b += usize::from(b["detections_count"].as_i64() > Some(0));
        for (x, y) in da.iter().zip(&db) {
            assert!((score(x) - score(y)).abs() < 0.06, "{k:?}: {x} vs {y}");
            for c in ["x1", "y1", "x2", "y2"] {
                let (p, q) = (x[c].as_f64().unwrap(), y[c].as_f64().unwrap());
                assert!((p - q).abs() < 24.0, "{k:?} {c}: {p} vs {q} px");
            }
        }
    }
    assert!(persons_a >= 50, "{persons_a} frames with a person");
    assert!(
        persons_a.abs_diff(persons_b) <= 4,
        "frames with a person: {persons_a} vs {persons_b}"
    );
}

#[test]
fn the_video_source_scales_for_the_first_resize_in_one_pass_unless_told_not_to() {
    require_onnx_runtime();
    videos();
    let tmp = tempfile::tempdir().unwrap();
    let shipped = repo().join("pipelines/camera-video.yaml");
    let plan = String::from_utf8_lossy(&riffle_ok(&["plan", shipped.to_str().unwrap()]).stdout)
        .into_owned();
    assert!(
        plan.contains("to 300x300 RGB in one pass"),
        "the plan says the decoder scales:\n{plan}"
    );
    // The same file with `scale: off`, its relative paths made absolute.
    let text = std::fs::read_to_string(&shipped).unwrap();
    let root = format!("{}/", repo().display());
    let off = text
        .replace("../", &root)
        .replace("\n  video:\n", "\n  video:\n    scale: off\n");
    assert!(off.contains("scale: off"), "{off}");
    let off_file = tmp.path().join("camera-video-off.yaml");
    std::fs::write(&off_file, off).unwrap();
    let plan = String::from_utf8_lossy(&riffle_ok(&["plan", off_file.to_str().unwrap()]).stdout)
        .into_owned();
    assert!(!plan.contains("in one pass"), "{plan}");

    let run = |p: &Path, name: &str| run_to_jsonl(p, &tmp.path().join(format!("{name}.jsonl")));
    let fused = run(&shipped, "fused");
    let full = run(&off_file, "full");
    assert_eq!(fused.len(), 250);
    let key = |r: &Value| {
        let camera = r["camera_id"].as_str().unwrap().to_string();
        (camera, r["frame"].as_i64().unwrap())
    };
    let fused: Keyed = fused.iter().map(|r| (key(r), r)).collect();
    let full: Keyed = full.iter().map(|r| (key(r), r)).collect();
    assert_eq!(
        fused.keys().collect::<Vec<_>>(),
        full.keys().collect::<Vec<_>>()
    );
    // Scaled by swscale from YUV or by the stage from full-size RGB: the same people, boxes in
    // the picture's 640x272 coordinates either way.
    assert_same_detections(&full, &fused);
    let differ = fused
        .iter()
        .filter(|(k, r)| r["detections"] != full[*k]["detections"])
        .count();
    assert!(
        differ > 0,
        "the two scalings should not give identical scores"
    );
}

#[test]
fn a_live_camera_comes_back_after_its_server_dies_and_the_others_never_stop() {
    require_rtsp_server();
    let dir = videos();
    let mut cameras: Vec<RtspCamera> = (0..3)
        .map(|k| {
            RtspCamera::start(
                &format!("bikes-{k}"),
                &dir.join(format!("live/bikes-{k}.mp4")),
            )
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let entries: Vec<String> = cameras
        .iter()
        .map(|c| camera_entry(&c.id, &c.uri()))
        .collect();
    // 150 frames = 6 s of each camera at 25 fps. Three workers, one camera each: the worker
    // whose camera is down has nothing to read and must not hold the others back.
    let text = live_pipeline(
        &entries,
        ", max_frames: 150",
        SELECT_ONLY,
        ", workers: 3",
        &out,
    );
    let p = write(tmp.path(), "live.yaml", &text);
    let run = spawn_run(&p);
    std::thread::sleep(Duration::from_millis(2000));
    let killed_at = epoch_ms();
    cameras[1].kill();
    std::thread::sleep(Duration::from_millis(1500));
    cameras[1].restart();
    let restarted_at = epoch_ms();
    let summary = run.finish();

    let rows = read_jsonl(&out);
    let per = by_camera(&rows);
    assert_eq!(per.len(), 3, "{summary}");
    for (camera, frames) in &per {
        let numbers: Vec<i64> = frames.iter().map(|f| f.0).collect();
        assert!(
            numbers.windows(2).all(|w| w[0] < w[1]),
            "{camera} in order: {numbers:?}"
        );
        // The run ends by max_frames: every kept frame arrived or was counted as dropped.
        assert_eq!(
            frames.len() + lost(&summary, camera),
            150,
            "{camera}\n{summary}"
        );
    }
    let during = |camera: &str| {
        per[camera]
            .iter()
            .filter(|f| f.1 > killed_at + 200 && f.1 < restarted_at)
            .count()
    };
    assert!(
        during("bikes-0") > 10 && during("bikes-2") > 10,
        "the others go on during the outage"
    );
    assert!(
        per["bikes-1"].iter().any(|f| f.1 > restarted_at),
        "bikes-1's frames arrive after its server came back"
    );
    assert!(
        metric(&summary, "reconnects_total", "bikes-1") >= 1.0,
        "{summary}"
    );
    assert_eq!(
        metric(&summary, "reconnects_total", "bikes-0"),
        0.0,
        "{summary}"
    );
    assert_eq!(
        metric(&summary, "camera_failures_total", "bikes-1"),
        0.0,
        "{summary}"
    );
}

/// Stages that run the person detector one frame a batch and keep the frame's identity.
fn frame_by_frame_detector() -> String {
    format!(
        "  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}\n  \
         - model:\n      path: \"{}\"\n      inputs: {{ \"image_tensor:0\": tensor }}\n      \
         outputs: {{ \"detection_scores:0\": {{ column: scores, shape: [100] }} }}\n      \
         batch: {{ max_size: 1 }}\n  \
         - select: {{ columns: [camera_id, frame, ingest_ms] }}",
        model("ssdlite_person.onnx").display()
    )
}

/// The camera pipeline on one live camera with a model slowed to a few frames a second.
fn overloaded(policy: &str) -> (Vec<Value>, String) {
    let dir = videos();
    let camera = RtspCamera::start("cam", &dir.join("live/bikes-2.mp4"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let stages = frame_by_frame_detector();
    let text = live_pipeline(
        &[camera_entry("cam", &camera.uri())],
        &format!(", max_frames: 40, queue_size: 4, batch_size: 1, on_overload: {policy}"),
        &stages,
        ", workers: 1, slow_worker: { worker: 0, delay_ms: 150 }",
        &out,
    );
    let p = write(tmp.path(), "slow.yaml", &text);
    let summary = spawn_run(&p).finish();
    (read_jsonl(&out), summary)
}

#[test]
fn an_overloaded_live_camera_drops_its_oldest_frames_and_counts_them_or_waits() {
    require_onnx_runtime();
    require_rtsp_server();
    let (rows, summary) = overloaded("drop_oldest");
    let dropped = metric(&summary, "frames_dropped_total", "cam") as usize;
    assert!(
        dropped > 5,
        "a 25 fps camera into a ~6 fps model drops frames\n{summary}"
    );
    assert_eq!(
        rows.len() + lost(&summary, "cam"),
        40,
        "every frame delivered or counted\n{summary}"
    );
    assert!(
        metric(&summary, "queue_high_water_frames", "cam") <= 4.0,
        "the queue never holds more than queue_size\n{summary}"
    );
    // The freshest frames survive: the last one always arrives.
    assert!(rows.iter().any(|r| r["frame"] == 39), "{summary}");

    let (rows, summary) = overloaded("wait");
    assert_eq!(
        metric(&summary, "frames_dropped_total", "cam"),
        0.0,
        "{summary}"
    );
    let frames: Vec<i64> = rows.iter().map(|r| r["frame"].as_i64().unwrap()).collect();
    assert_eq!(frames, (0..40).collect::<Vec<_>>(), "wait loses nothing");
}

#[test]
fn a_camera_that_never_comes_up_fails_alone() {
    require_rtsp_server();
    let dir = videos();
    let good = RtspCamera::start("good", &dir.join("live/bikes-0.mp4"));
    // A port nothing listens on.
    let gone = format!("rtsp://127.0.0.1:{}/gone", free_port());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let text = live_pipeline(
        &[
            camera_entry("gone", &gone),
            camera_entry("good", &good.uri()),
        ],
        ", max_frames: 50, connect_attempts: 3",
        SELECT_ONLY,
        ", workers: 2",
        &out,
    );
    let p = write(tmp.path(), "gone.yaml", &text);
    let summary = spawn_run(&p).finish();
    let per = by_camera(&read_jsonl(&out));
    assert_eq!(per.keys().collect::<Vec<_>>(), ["good"], "{summary}");
    assert_eq!(per["good"].len() + lost(&summary, "good"), 50);
    assert_eq!(
        metric(&summary, "camera_failures_total", "gone"),
        1.0,
        "{summary}"
    );
    assert_eq!(
        metric(&summary, "camera_failures_total", "good"),
        0.0,
        "{summary}"
    );
    assert!(
        summary.contains("camera `gone` failed"),
        "logged: {summary}"
    );
    let dead = read_jsonl(&tmp.path().join("out.jsonl.dead"));
    assert_eq!(dead.len(), 1, "{dead:?}");
    let reason = dead[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("camera `gone` failed") && reason.contains("3 attempts"),
        "{reason}"
    );
}

#[test]
fn video_files_resume_from_a_checkpoint_with_every_frame_exactly_once() {
    let dir = videos();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let run = |max_frames: &str| {
        let text = format!(
            "name: resume\n\
             source:\n  video: {{ glob: \"{}/*.mp4\", batch_size: 3{max_frames} }}\n\
             stages:\n{SELECT_ONLY}\n\
             sink:\n  jsonl: {{ path: \"{}\" }}\n\
             runtime: {{ workers: 2, epoch_records: 4, checkpoint: {{ dir: \"{}\" }} }}\n",
            dir.display(),
            out.display(),
            tmp.path().join("ckpt").display()
        );
        let p = write(tmp.path(), "resume.yaml", &text);
        riffle_ok(&["run", "-q", p.to_str().unwrap()]);
        camera_frames(&out)
    };
    // The first run stops each camera after 20 frames; the second resumes from the checkpoint.
    let first = run(", max_frames: 20");
    assert_eq!(first.len(), 80, "{first:?}");
    let all = run("");
    let unique: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(unique.len(), all.len(), "no frame twice");
    let expected: BTreeSet<(String, i64)> = (0..4)
        .flat_map(|k| {
            let n = if k % 2 == 0 { 63 } else { 62 };
            (0..n).map(move |f| (format!("bikes-{k}"), f))
        })
        .collect();
    assert_eq!(unique, expected, "every frame once across both runs");
}

#[test]
fn an_rtsp_cameras_first_frames_are_on_its_own_clock() {
    require_rtsp_server();
    let dir = videos();
    let camera = RtspCamera::start("cam", &dir.join("live/bikes-0.mp4"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let text = live_pipeline(
        &[camera_entry("cam", &camera.uri())],
        ", max_frames: 30, on_overload: wait",
        SELECT_ONLY,
        ", workers: 1",
        &out,
    );
    let p = write(tmp.path(), "pts.yaml", &text);
    let summary = spawn_run(&p).finish();
    let mut rows: Vec<(i64, i64)> = read_jsonl(&out)
        .iter()
        .map(|r| (r["frame"].as_i64().unwrap(), r["pts_ms"].as_i64().unwrap()))
        .collect();
    rows.sort();
    assert_eq!(rows.len(), 30, "{summary}");
    let pts: Vec<i64> = rows.iter().map(|r| r.1).collect();
    // RTSP gives the first frame no timestamp: it is the stream's start, not the time since
    // the camera's thread began (which put it ahead of the frames after it).
    assert!(pts.windows(2).all(|w| w[0] <= w[1]), "{pts:?}");
    assert!(pts[0] <= pts[1] && pts[1] < 100, "{pts:?}");
}

/// A sample of `/metrics` (`name{camera="id"} value`).
#[test]
fn metrics_and_readyz_say_which_camera_is_down() {
    require_rtsp_server();
    let dir = videos();
    // Not listening yet: the camera is down from the start.
    let mut camera = RtspCamera {
        id: "cam".into(),
        file: dir.join("live/bikes-0.mp4"),
        port: free_port(),
        server: None,
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let text = live_pipeline(
        &[camera_entry("cam", &camera.uri())],
        ", connect_attempts: 1000",
        SELECT_ONLY,
        ", workers: 1",
        &out,
    );
    let p = write(tmp.path(), "down.yaml", &text);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", p.to_str().unwrap(), "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _guard = Kill(&mut child);
    let metrics = || http_get(&format!("{base}/metrics")).map(|r| r.1);
    // Never came up: /readyz says so by name, the camera is down and its silence grows.
    // (Once the worker is ready: before, /readyz says how many workers are.)
    let (status, body) = poll_until("/readyz past the workers", Duration::from_secs(30), || {
        http_get(&format!("{base}/readyz")).filter(|(_, b)| !b.contains("workers have"))
    });
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("camera `cam`"), "{body}");
    std::thread::sleep(Duration::from_millis(1200));
    let body = poll_until("/metrics", Duration::from_secs(5), metrics);
    assert_eq!(scraped(&body, "camera_up", "cam"), Some(0.0), "{body}");
    let silent = scraped(&body, "seconds_since_last_frame", "cam").unwrap();
    assert!(silent >= 1.0, "{body}");
    // Its server comes up: ready, up, and its last frame recent.
    camera.restart();
    poll_until("/readyz 200", Duration::from_secs(20), || {
        http_get(&format!("{base}/readyz")).filter(|r| r.0 == 200)
    });
    let body = poll_until("/metrics", Duration::from_secs(5), metrics);
    assert_eq!(scraped(&body, "camera_up", "cam"), Some(1.0), "{body}");
    assert!(
        scraped(&body, "seconds_since_last_frame", "cam").unwrap() < 1.0,
        "{body}"
    );
    // Down again: counted as down, while /readyz stays 200 (it came up once).
    camera.kill();
    let body = poll_until("camera_up 0", Duration::from_secs(15), || {
        metrics().filter(|b| scraped(b, "camera_up", "cam") == Some(0.0))
    });
    assert_eq!(
        scraped(&body, "camera_ended", "cam"),
        Some(0.0),
        "a live camera down has not ended: {body}"
    );
    assert_eq!(http_get(&format!("{base}/readyz")).unwrap().0, 200);
}

#[test]
fn a_connections_opening_burst_is_skipped_on_connect_not_dropped() {
    require_onnx_runtime();
    require_rtsp_server();
    let dir = videos();
    let camera = RtspCamera::start("cam", &dir.join("live/bikes-0.mp4"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    // A model of ~30 ms a frame about keeps up with 25 fps, but not with what the connection
    // buffered while opening (`probe_ms` of frames, ~1.5 s, handed over at once): more than
    // the queue holds. Those are skipped on connect; whatever the model falls behind by later
    // is dropped.
    let stages = frame_by_frame_detector();
    let text = live_pipeline(
        &[camera_entry("cam", &camera.uri())],
        ", max_frames: 60, queue_size: 2, batch_size: 1, probe_ms: 1500",
        &stages,
        ", workers: 1",
        &out,
    );
    let p = write(tmp.path(), "burst.yaml", &text);
    let summary = spawn_run(&p).finish();
    let rows = read_jsonl(&out);
    let skipped = metric(&summary, "frames_skipped_on_connect_total", "cam");
    let dropped = metric(&summary, "frames_dropped_total", "cam");
    assert!(skipped >= 10.0, "most of the burst\n{summary}");
    assert!(
        dropped < skipped,
        "the burst is not counted as overload\n{summary}"
    );
    assert_eq!(rows.len() + lost(&summary, "cam"), 60, "{summary}");
    // The newest frames are kept: the last one arrives.
    assert!(rows.iter().any(|r| r["frame"] == 59), "{summary}");
}

#[test]
fn a_stalled_live_camera_is_noticed_after_its_timeout_not_twice_that() {
    require_rtsp_server();
    let dir = videos();
    let camera = RtspCamera::start("cam", &dir.join("live/bikes-0.mp4"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let text = live_pipeline(
        &[camera_entry("cam", &camera.uri())],
        ", timeout_ms: 2000, connect_attempts: 1",
        SELECT_ONLY,
        ", workers: 1",
        &out,
    );
    let p = write(tmp.path(), "stall.yaml", &text);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", p.to_str().unwrap(), "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Each log line with the time it arrived.
    let stderr = child.stderr.take().unwrap();
    let (lines, log) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send((Instant::now(), line));
        }
    });
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _guard = Kill(child);
    poll_until("camera_up 1", Duration::from_secs(30), || {
        http_get(&format!("{base}/metrics"))
            .filter(|r| scraped(&r.1, "camera_up", "cam") == Some(1.0))
    });
    // The server stalls: its connection stays open, nothing more comes.
    let pid = camera.server.as_ref().unwrap().id().to_string();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let stalled = Instant::now();
    let mut seen = String::new();
    let noticed = loop {
        match log.recv_timeout(Duration::from_secs(15)) {
            Ok((at, line)) if line.contains("reconnecting") => break Some((at, line)),
            Ok((_, line)) => seen += &format!("{line}\n"),
            Err(_) => break None,
        }
    };
    signal("-CONT");
    let (at, line) = noticed.unwrap_or_else(|| panic!("the stall went unnoticed:\n{seen}"));
    let delay = at.duration_since(stalled);
    eprintln!("stall noticed after {} ms: {line}", delay.as_millis());
    assert!(
        delay >= Duration::from_millis(1800) && delay <= Duration::from_millis(3000),
        "noticed after {} ms, timeout_ms is 2000: {line}",
        delay.as_millis()
    );
}

/// Runs `pipeline` to its end: the run's own peak RSS in MiB (wait4's, so other tests'
/// children running meanwhile do not count).
// wait4 below reaps the child (Child::wait would not give its rusage).
#[allow(clippy::zombie_processes)]
fn peak_rss_mib(pipeline: &Path) -> f64 {
    let child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", pipeline.to_str().unwrap()])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into the two locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert!(
        pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} failed (status {status})",
        pipeline.display()
    );
    usage.ru_maxrss as f64 / 1024.0
}

#[test]
fn a_looping_camera_reads_for_as_long_as_it_likes_in_the_same_memory() {
    // One lossless camera (43 kB packets) decoded 300 and then 3000 frames: a packet whose
    // data is never released (as a reused AVPacket once leaked) costs ~110 MB more in the
    // longer run; without it the two peaks are a few MB apart.
    let tmp = tempfile::tempdir().unwrap();
    let video = videos().join("bikes-0.mp4");
    let peak = |frames: usize| {
        let p = write(
            tmp.path(),
            &format!("loop-{frames}.yaml"),
            &format!(
                r#"
source:
  video:
    cameras: [{{ id: cam, uri: "{}", loop: true, max_frames: {frames} }}]
    batch_size: 8
stages:
  - select: {{ columns: [camera_id, frame] }}
sink: {{ jsonl: {{ path: out-{frames}.jsonl }} }}
runtime: {{ workers: 1 }}
"#,
                video.display()
            ),
        );
        let mib = peak_rss_mib(&p);
        let rows = read_jsonl(&tmp.path().join(format!("out-{frames}.jsonl")));
        assert_eq!(rows.len(), frames, "every frame of the {frames}-frame run");
        mib
    };
    let short = peak(300);
    let long = peak(3000);
    assert!(
        long - short < 40.0,
        "peak RSS grew with the frames read: {short:.0} MiB after 300 frames, {long:.0} MiB \
         after 3000"
    );
}
