//! Cameras added and removed while a run goes on: the control API on the view's address
//! (`/api/cameras`), the watched `cameras_file`, and a restart from a checkpoint that resumes
//! with the camera set as it was.
//!
//! Needs the videos of `scripts/media.sh`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

fn clip(n: usize) -> PathBuf {
    let file = repo().join(format!("data/videos/live/bikes-{n}.mp4"));
    assert!(
        file.is_file(),
        "{} missing: run `scripts/media.sh` (needs ffmpeg)",
        file.display()
    );
    file
}

/// A source that stays open with `cameras` (YAML list) and a cheap stage, results to
/// `out.jsonl`; `extra` goes into the video block.
fn pipeline(tmp: &Path, cameras: &str, extra: &str) -> PathBuf {
    write(
        tmp,
        "cams.yaml",
        &format!(
            "name: cams\n\
             source:\n  video:\n    cameras: {cameras}\n    stay_open: true\n    batch_size: 4\n{extra}\
             stages:\n  - select: {{ columns: [camera_id, frame] }}\n\
             sink:\n  jsonl: {{ path: \"{}\" }}\n",
            tmp.join("out.jsonl").display()
        ),
    )
}

struct Run(Child);

impl Run {
    fn start(pipeline: &Path, ui: u16, extra: &[&str]) -> Self {
        Run(Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args(["run", "-q"])
            .arg(pipeline)
            .args(["--ui", &format!("127.0.0.1:{ui}")])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap())
    }

    /// SIGTERM, and the run's exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.0.id() as i32;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.0.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn post(ui: u16, body: &str) -> (u16, Value) {
    let mut r = agent()
        .post(&format!("http://127.0.0.1:{ui}/api/cameras"))
        .content_type("application/json")
        .send(body)
        .unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_json().unwrap_or(Value::Null))
}

fn delete(ui: u16, id: &str) -> (u16, Value) {
    let mut r = agent()
        .delete(&format!("http://127.0.0.1:{ui}/api/cameras/{id}"))
        .call()
        .unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_json().unwrap_or(Value::Null))
}

fn listed(ui: u16) -> Vec<String> {
    let (status, body) = http_get(&format!("http://127.0.0.1:{ui}/api/cameras")).unwrap();
    assert_eq!(status, 200, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

/// Frames answered per camera: (count, distinct, highest).
fn answered(out: &Path) -> BTreeMap<String, (usize, usize, i64)> {
    let mut per: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    if out.exists() {
        for (camera, frame) in camera_frames(out) {
            per.entry(camera).or_default().push(frame);
        }
    }
    per.into_iter()
        .map(|(c, mut frames)| {
            let n = frames.len();
            frames.dedup();
            (c, (n, frames.len(), frames.last().copied().unwrap_or(-1)))
        })
        .collect()
}

fn wait_for_frames(out: &Path, camera: &str, at_least: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while answered(out).get(camera).map_or(0, |a| a.0) < at_least {
        assert!(
            std::time::Instant::now() < deadline,
            "{at_least} results of camera `{camera}` within 60 s; (count, distinct, last) so far: {:?}",
            answered(out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cameras_come_and_go_through_the_api_and_bad_requests_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let p = pipeline(
        tmp.path(),
        &format!(
            "[{{ id: a, uri: \"{}\", realtime: true }}]",
            clip(0).display()
        ),
        "",
    );
    let out = tmp.path().join("out.jsonl");
    let ui = free_port();
    let run = Run::start(&p, ui, &[]);
    poll_until("the camera API", Duration::from_secs(60), || {
        http_get(&format!("http://127.0.0.1:{ui}/api/cameras")).filter(|(s, _)| *s == 200)
    });
    wait_for_frames(&out, "a", 10);

    // A file camera of 40 frames, at full speed: every frame answered once.
    let (status, added) = post(
        ui,
        &format!(
            "{{\"id\": \"b\", \"uri\": \"{}\", \"max_frames\": 40}}",
            clip(1).display()
        ),
    );
    assert_eq!(status, 201, "{added}");
    assert_eq!(added["id"], "b");
    assert_eq!(
        added["index"], 1,
        "a new camera takes the next index: {added}"
    );
    // Refused, each with its reason; the set stays as it was.
    let refusals = [
        (
            format!("{{\"id\": \"b\", \"uri\": \"{}\"}}", clip(1).display()),
            409,
            "already",
        ),
        (
            "{\"id\": \"c\", \"uri\": \"/no/such/clip.mp4\"}".to_string(),
            400,
            "/no/such/clip.mp4",
        ),
        (
            format!("{{\"id\": \"c\", \"url\": \"{}\"}}", clip(1).display()),
            400,
            "unknown field `url`",
        ),
        ("not json".to_string(), 400, "not JSON"),
        ("[1, 2]".to_string(), 400, "JSON object"),
    ];
    for (body, want, reason) in refusals {
        let (status, answer) = post(ui, &body);
        assert_eq!(status, want, "{body} → {answer}");
        assert!(
            answer["error"].as_str().unwrap_or("").contains(reason),
            "{body} → {answer}"
        );
    }
    assert_eq!(delete(ui, "zz").0, 404);
    assert_eq!(listed(ui), ["a", "b"]);
    wait_for_frames(&out, "b", 40);

    // `a` goes: its results stop, every frame it had was answered once.
    let (status, removed) = delete(ui, "a");
    assert_eq!(status, 200, "{removed}");
    assert_eq!(listed(ui), ["b"]);
    std::thread::sleep(Duration::from_millis(1500));
    let before = answered(&out);
    std::thread::sleep(Duration::from_millis(1500));
    let after = answered(&out);
    assert_eq!(
        before.get("a"),
        after.get("a"),
        "a removed camera gives no more results"
    );
    let status = run.stop();
    assert!(status.success(), "{status:?}");
    let done = answered(&out);
    let (n, distinct, last) = done["a"];
    assert_eq!(
        (n, distinct),
        (last as usize + 1, last as usize + 1),
        "camera a: frames 0..={last}, each once"
    );
    assert_eq!(done["b"], (40, 40, 39), "camera b: frames 0..40, each once");
}

#[test]
fn the_cameras_file_is_watched_while_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("cameras.yaml");
    // Relative to the cameras file.
    let rel = |n: usize| {
        let target = tmp.path().join(format!("clip-{n}.mp4"));
        std::fs::copy(clip(n), &target).unwrap();
        format!("clip-{n}.mp4")
    };
    std::fs::write(
        &file,
        format!(
            "cameras:\n  - {{ id: f1, uri: {}, max_frames: 30 }}\n",
            rel(0)
        ),
    )
    .unwrap();
    let p = write(
        tmp.path(),
        "p.yaml",
        "name: watched\nsource:\n  video: { cameras_file: cameras.yaml }\n\
         stages:\n  - select: { columns: [camera_id, frame] }\n\
         sink:\n  jsonl: { path: out.jsonl }\n",
    );
    let out = tmp.path().join("out.jsonl");
    let run = Run(Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q"])
        .arg(&p)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap());
    wait_for_frames(&out, "f1", 30);
    std::fs::write(
        &file,
        format!(
            "cameras:\n  - {{ id: f1, uri: {}, max_frames: 30 }}\n  - {{ id: f2, uri: {}, max_frames: 25 }}\n",
            rel(0),
            rel(1)
        ),
    )
    .unwrap();
    wait_for_frames(&out, "f2", 25);
    let status = run.stop();
    assert!(status.success(), "{status:?}");
    let done = answered(&out);
    assert_eq!(done["f1"], (30, 30, 29));
    assert_eq!(done["f2"], (25, 25, 24));
}

#[test]
fn a_restart_resumes_with_the_checkpointed_camera_set() {
    let tmp = tempfile::tempdir().unwrap();
    let p = pipeline(
        tmp.path(),
        &format!(
            "[{{ id: a, uri: \"{}\", max_frames: 20 }}]",
            clip(0).display()
        ),
        "",
    );
    let out = tmp.path().join("out.jsonl");
    let checkpoints = tmp.path().join("ckpt");
    let ckpt = checkpoints.to_str().unwrap();
    let ui = free_port();
    let run = Run::start(&p, ui, &["--checkpoint-dir", ckpt]);
    wait_for_frames(&out, "a", 20);
    // Realtime: still going when the run is stopped.
    let (status, added) = post(
        ui,
        &format!(
            "{{\"id\": \"late\", \"uri\": \"{}\", \"realtime\": true, \"max_frames\": 100}}",
            clip(2).display()
        ),
    );
    assert_eq!(status, 201, "{added}");
    wait_for_frames(&out, "late", 10);
    assert!(run.stop().success());
    let first = answered(&out);
    let (late_then, _, _) = first["late"];
    assert!(
        late_then < 100,
        "the run stopped before `late` ended: {first:?}"
    );

    // No request this time: the checkpoint brings `late` back, its frames going on.
    let ui = free_port();
    let run = Run::start(&p, ui, &["--checkpoint-dir", ckpt]);
    poll_until("the camera API", Duration::from_secs(60), || {
        http_get(&format!("http://127.0.0.1:{ui}/api/cameras")).filter(|(s, _)| *s == 200)
    });
    assert_eq!(listed(ui), ["a", "late"]);
    wait_for_frames(&out, "late", 100);
    assert!(run.stop().success());
    let done = answered(&out);
    assert_eq!(done["late"], (100, 100, 99), "every frame of `late` once");
    assert_eq!(done["a"], (20, 20, 19), "every frame of `a` once");
}

#[test]
fn a_camera_added_back_under_its_id_starts_over_in_the_tracker() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let dead = tmp.path().join("dead.jsonl");
    // People walk in from frame 30 of this clip.
    let street = repo().join("data/videos/bikes-0.mp4");
    let p = write(
        tmp.path(),
        "p.yaml",
        &format!(
            "name: again\n\
             source:\n  video:\n    cameras: [{{ id: a, uri: \"{clip}\", max_frames: 50 }}]\n    stay_open: true\n    batch_size: 4\n\
             stages:{stages}\n\
             \x20 - track: {{ high_threshold: 0.3, new_track_threshold: 0.3 }}\n\
             \x20 - select: {{ columns: [camera_id, frame, detections] }}\n\
             runtime: {{ workers: 2 }}\n\
             sink:\n  jsonl: {{ path: \"{out}\" }}\n\
             dead_letter:\n  jsonl: {{ path: \"{dead}\" }}\n",
            clip = street.display(),
            stages = video_tracker_stages(0.2),
            out = out.display(),
            dead = dead.display(),
        ),
    );
    let ui = free_port();
    let run = Run::start(&p, ui, &[]);
    wait_for_frames(&out, "a", 50);
    assert_eq!(delete(ui, "a").0, 200);
    let (status, again) = post(
        ui,
        &format!(
            "{{\"id\": \"a\", \"uri\": \"{}\", \"max_frames\": 50}}",
            street.display()
        ),
    );
    assert_eq!(status, 201, "{again}");
    wait_for_frames(&out, "a", 100);
    assert!(run.stop().success());
    let letters = if dead.exists() {
        read_jsonl(&dead)
    } else {
        Vec::new()
    };
    assert!(
        letters.is_empty(),
        "frames of the camera added back are not taken for late ones: {letters:?}"
    );
    // Each frame twice (once per life); the second life's tracks are the first's, ids again
    // from 1: the tracker started over.
    let mut lives: BTreeMap<i64, Vec<Vec<i64>>> = BTreeMap::new();
    for r in read_jsonl(&out) {
        let ids: Vec<i64> = r["detections"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|d| d["track_id"].as_i64())
            .collect();
        lives
            .entry(r["frame"].as_i64().unwrap())
            .or_default()
            .push(ids);
    }
    assert_eq!(lives.len(), 50);
    for (frame, seen) in &lives {
        assert_eq!(seen.len(), 2, "frame {frame}: {seen:?}");
        assert_eq!(
            seen[0], seen[1],
            "frame {frame}: the same tracks in both lives"
        );
    }
    assert!(
        lives.values().any(|s| !s[0].is_empty()),
        "some frames have tracks: {lives:?}"
    );
}

/// The newest checkpoint in `dir`, parsed (its CRC trailer cut off).
fn newest_checkpoint(dir: &Path) -> Option<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ckpt"))
        .collect();
    files.sort();
    let text = std::fs::read_to_string(files.last()?).ok()?;
    serde_json::from_str(text.split("\n#crc32:").next()?).ok()
}

#[test]
fn rtsp_cameras_added_and_removed_across_two_processes() {
    require_onnx_runtime();
    common::rtsp::require_rtsp_server();
    let tmp = tempfile::tempdir().unwrap();
    let servers: Vec<common::rtsp::RtspCamera> = (1..=3)
        .map(|k| common::rtsp::RtspCamera::start(&format!("r{k}"), &clip(k - 1)))
        .collect();
    let out = tmp.path().join("out.jsonl");
    let checkpoints = tmp.path().join("ckpt");
    let street_stages = format!(
        "stages:{}\n\
         \x20 - track: {{}}\n\
         \x20 - select: {{ columns: [camera_id, frame] }}\n",
        video_tracker_stages(0.3)
    );
    let p = write(
        tmp.path(),
        "p.yaml",
        &format!(
            "name: fleet\n\
             source:\n  video:\n    cameras: [{{ id: r1, uri: \"{r1}\", max_frames: 25 }}]\n    sample_fps: 5\n    on_overload: wait\n    stay_open: true\n    batch_size: 4\n\
             {street_stages}\
             sink:\n  jsonl: {{ path: \"{out}\" }}\n",
            r1 = servers[0].uri(),
            out = out.display(),
        ),
    );
    let ui = free_port();
    let base = free_port_pair().to_string();
    let run = Run::start(
        &p,
        ui,
        &[
            "--processes",
            "2",
            "--base-port",
            &base,
            "--checkpoint-dir",
            checkpoints.to_str().unwrap(),
        ],
    );
    wait_for_frames(&out, "r1", 3);
    let (status, r2) = post(
        ui,
        &format!(
            "{{\"id\": \"r2\", \"uri\": \"{}\", \"max_frames\": 25}}",
            servers[1].uri()
        ),
    );
    assert_eq!(status, 201, "{r2}");
    assert_eq!(
        r2["worker"], 1,
        "the idle worker (process 1) takes it: {r2}"
    );
    let (status, r3) = post(
        ui,
        &format!("{{\"id\": \"r3\", \"uri\": \"{}\"}}", servers[2].uri()),
    );
    assert_eq!(status, 201, "{r3}");
    wait_for_frames(&out, "r2", 3);
    wait_for_frames(&out, "r3", 5);
    assert_eq!(delete(ui, "r3").0, 200);
    wait_for_frames(&out, "r1", 25);
    wait_for_frames(&out, "r2", 25);
    // A checkpoint after the removal holds neither r3 in the camera set nor its tracks (the
    // set is read as a checkpoint is written, so one taken while r3's retirement is on its way
    // can still hold its tracks: a run resumed from it retires r3 again).
    let tracks = poll_until("a checkpoint without r3", Duration::from_secs(30), || {
        let c = newest_checkpoint(&checkpoints)?;
        let set: Value = serde_json::from_str(c["state"]["source.state"].as_str()?).ok()?;
        let tracks = c["state"]["operator.track"].as_str()?.to_string();
        (set["cameras"].get("r3").is_none() && !tracks.contains("\"r3\"")).then_some(tracks)
    });
    assert!(
        tracks.contains("\"r2\""),
        "the tracker's checkpointed state keeps r2: {tracks}"
    );
    let before = answered(&out);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        answered(&out).get("r3"),
        before.get("r3"),
        "r3 gives no more results"
    );
    assert!(run.stop().success());
    let done = answered(&out);
    assert_eq!(done["r1"].0, 25, "r1: {:?}", done["r1"]);
    assert_eq!(done["r2"].0, 25, "r2: {:?}", done["r2"]);
    for (camera, (n, distinct, _)) in &done {
        assert_eq!(n, distinct, "camera {camera}: every frame answered once");
    }
}

/// A file camera that played to its end reads `camera_ended 1` (and `camera_up 0`): the view
/// shows it ended, not down.
#[test]
fn a_file_camera_played_to_its_end_is_ended_not_down() {
    let tmp = tempfile::tempdir().unwrap();
    let p = pipeline(
        tmp.path(),
        &format!(
            "[{{ id: f, uri: \"{}\", max_frames: 20 }}]",
            clip(0).display()
        ),
        "",
    );
    let out = tmp.path().join("out.jsonl");
    let ui = free_port();
    let run = Run::start(&p, ui, &[]);
    wait_for_frames(&out, "f", 20);
    let body = poll_until("camera_ended 1", Duration::from_secs(30), || {
        http_get(&format!("http://127.0.0.1:{ui}/metrics"))
            .map(|r| r.1)
            .filter(|b| scraped(b, "camera_ended", "f") == Some(1.0))
    });
    assert_eq!(scraped(&body, "camera_up", "f"), Some(0.0), "{body}");
    assert!(run.stop().success());
}
