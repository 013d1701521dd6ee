//! Unit tests of the video source: configuration, thinning, queues, and decoding the test
//! videos `scripts/media.sh` makes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, UInt32Type};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::SourceFactory;

use super::config::wildcard_match;
use super::queue::{Bell, Frame, FrameQueue, Pushed, Thinning};
use super::*;

fn videos() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/videos");
    assert!(
        dir.join("bikes-0.mp4").is_file(),
        "test videos missing in {}: run `scripts/media.sh` (needs ffmpeg: apt-get install -y ffmpeg)",
        dir.display()
    );
    dir
}

fn config(yaml: &str) -> VideoConfig {
    serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn file_camera(id: &str, path: &std::path::Path) -> String {
    format!("{{ id: {id}, uri: \"{}\" }}", path.display())
}

/// One row read from the source.
#[derive(Debug, PartialEq)]
struct Row {
    camera: String,
    frame: i64,
    pts_ms: i64,
    width: u32,
    height: u32,
    bytes: usize,
}

/// Everything partition `index` of `peers` reads, and its dead letters.
fn read_all(source: &dyn SourceFactory, index: usize, peers: usize) -> (Vec<Row>, Vec<DeadLetter>) {
    let mut part = source.partition(index, peers).unwrap();
    let (mut rows, mut dead) = (Vec::new(), Vec::new());
    while let Some(batch) = part.next_batch().unwrap() {
        let r = &batch.records;
        let cameras = r.column(0).as_string::<i32>();
        let frames = r.column(1).as_primitive::<Int64Type>();
        let pts = r.column(2).as_primitive::<Int64Type>();
        let widths = r.column(4).as_primitive::<UInt32Type>();
        let heights = r.column(5).as_primitive::<UInt32Type>();
        let pixels = r.column(6).as_binary::<i32>();
        for i in 0..r.num_rows() {
            rows.push(Row {
                camera: cameras.value(i).to_string(),
                frame: frames.value(i),
                pts_ms: pts.value(i),
                width: widths.value(i),
                height: heights.value(i),
                bytes: pixels.value(i).len(),
            });
        }
        dead.extend(batch.rejected);
    }
    (rows, dead)
}

fn source(yaml: &str) -> VideoSource {
    VideoSource::new(&config(yaml)).unwrap()
}

#[test]
fn wildcards_match_like_a_shell() {
    assert!(wildcard_match("*.mp4", "bikes-0.mp4"));
    assert!(wildcard_match("bikes-?.mp4", "bikes-3.mp4"));
    assert!(!wildcard_match("*.mp4", "bikes-0.mkv"));
    assert!(!wildcard_match("bikes-?.mp4", "bikes-10.mp4"));
    assert!(wildcard_match("*", ""));
}

#[test]
fn a_glob_names_cameras_by_file_stem_in_order_and_uris_tell_files_from_streams() {
    let dir = videos();
    let c = config(&format!("glob: \"{}/*.mp4\"", dir.display()));
    let cameras = c.resolve().unwrap();
    let ids: Vec<&str> = cameras.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["bikes-0", "bikes-1", "bikes-2", "bikes-3"]);
    assert!(cameras
        .iter()
        .all(|c| !c.live && c.on_overload == OnOverload::Wait));
    assert_eq!(c.paths(), [dir.as_path()]);

    let c = config(
        "cameras: [{ id: a, uri: \"rtsp://127.0.0.1:1/a\" }, { id: b, uri: \"rtsp://h/b\", on_overload: wait }]",
    );
    let cameras = c.resolve().unwrap();
    assert!(cameras[0].live && cameras[0].on_overload == OnOverload::DropOldest);
    assert_eq!(cameras[1].on_overload, OnOverload::Wait);
    assert!(c.paths().is_empty(), "streams are not files");
    assert_eq!(
        CameraUri::parse("file:///v/a.mp4"),
        CameraUri::File("/v/a.mp4".into())
    );
    assert_eq!(
        CameraUri::parse("v/a.mp4"),
        CameraUri::File("v/a.mp4".into())
    );
}

#[test]
fn bad_configurations_are_refused_with_the_reason() {
    let dir = videos();
    let f = dir.join("bikes-0.mp4");
    for (yaml, expected) in [
        ("{}".to_string(), "no cameras"),
        (
            format!(
                "{{ glob: \"{}/*.mp4\", cameras: [{}] }}",
                dir.display(),
                file_camera("a", &f)
            ),
            "not both",
        ),
        (
            format!(
                "cameras: [{}, {}]",
                file_camera("a", &f),
                file_camera("a", &f)
            ),
            "used twice",
        ),
        (
            format!("cameras: [{}]", file_camera("a", &dir.join("nope.mp4"))),
            "is not a file",
        ),
        (
            format!(
                "cameras: [{}]",
                file_camera("a", std::path::Path::new("/dev/zero"))
            ),
            "/dev/zero is a character device, not a regular file",
        ),
        (
            format!("{{ glob: \"{}/*.nope\" }}", dir.display()),
            "no file matches",
        ),
        (
            format!("{{ cameras: [{}], every_nth: 0 }}", file_camera("a", &f)),
            "every_nth",
        ),
        (
            format!("{{ cameras: [{}], sample_fps: 0 }}", file_camera("a", &f)),
            "sample_fps",
        ),
        (
            format!("{{ cameras: [{}], queue_size: 0 }}", file_camera("a", &f)),
            "queue_size",
        ),
    ] {
        let err = config(&yaml).resolve().unwrap_err().to_string();
        assert!(err.contains(expected), "{yaml}: {err}");
    }
    let typo = serde_saphyr::from_str::<VideoConfig>("{ glob: x, sample_fsp: 3 }");
    assert!(typo.is_err(), "unknown keys are refused");
}

/// `connect_attempts`' range (what validation checks and docs/pipeline-spec.md lists) and the
/// source's own check agree: the range's least value is accepted, one less refused by both.
#[test]
fn connect_attempts_range_and_the_source_agree_on_the_least_value() {
    use crate::kind::Limits;
    let range = VideoConfig::RANGES
        .iter()
        .find(|r| r.key == "connect_attempts")
        .unwrap();
    let least = range.min as u32;
    let f = videos().join("bikes-0.mp4");
    let with = |n: u32| {
        config(&format!(
            "{{ cameras: [{}], connect_attempts: {n} }}",
            file_camera("a", &f)
        ))
    };
    with(least).resolve().unwrap();
    assert!(range.check_int(least - 1).is_err());
    let e = with(least - 1).resolve().unwrap_err().to_string();
    assert!(e.contains("connect_attempts must be at least"), "{e}");
}

#[test]
fn thinning_keeps_every_nth_frame_and_at_most_sample_fps() {
    let mut every = Thinning::new(5, None);
    let kept: Vec<i64> = (0..20).filter(|f| every.keep(*f, f * 40)).collect();
    assert_eq!(kept, [0, 5, 10, 15]);
    // 25 fps sampled at 10 fps: slots every 100 ms, each taking the first frame at or after it.
    let mut fps = Thinning::new(1, Some(10.0));
    let kept: Vec<i64> = (0..20).filter(|f| fps.keep(*f, f * 40)).collect();
    assert_eq!(kept, [0, 3, 5, 8, 10, 13, 15, 18]);
    // A stream whose clock restarts (a reconnection) keeps being sampled.
    assert!(fps.keep(20, 0));
    assert!(!fps.keep(21, 40));
    assert!(fps.keep(22, 120));
}

fn frame(n: i64) -> Frame {
    Frame {
        frame: n,
        pts_ms: n * 40,
        ingest_ms: 0,
        width: 1,
        height: 1,
        pixels: vec![0; 3],
    }
}

#[test]
fn full_queues_drop_oldest_or_newest_or_wait() {
    let bell = Arc::new(Bell::default());
    let q = FrameQueue::new(2, OnOverload::DropOldest, bell.clone());
    assert_eq!(q.push(frame(0)), Pushed::Queued);
    assert_eq!(q.push(frame(1)), Pushed::Queued);
    assert_eq!(q.push(frame(2)), Pushed::DroppedOldest);
    let left: Vec<i64> = std::iter::from_fn(|| q.pop()).map(|f| f.frame).collect();
    assert_eq!(left, [1, 2]);
    assert_eq!(q.high_water(), 2);

    let q = FrameQueue::new(2, OnOverload::DropNewest, bell.clone());
    for n in 0..3 {
        q.push(frame(n));
    }
    let left: Vec<i64> = std::iter::from_fn(|| q.pop()).map(|f| f.frame).collect();
    assert_eq!(left, [0, 1]);

    let q = Arc::new(FrameQueue::new(1, OnOverload::Wait, bell));
    q.push(frame(0));
    let pusher = {
        let q = q.clone();
        std::thread::spawn(move || q.push(frame(1)))
    };
    // The pusher waits for room: the first frame comes out, then the second.
    assert_eq!(q.pop().map(|f| f.frame), Some(0));
    assert_eq!(pusher.join().unwrap(), Pushed::Queued);
    assert_eq!(q.pop().map(|f| f.frame), Some(1));
    // A closed queue releases a waiting pusher.
    q.push(frame(2));
    let pusher = {
        let q = q.clone();
        std::thread::spawn(move || q.push(frame(3)))
    };
    std::thread::sleep(Duration::from_millis(20));
    q.close();
    assert_eq!(pusher.join().unwrap(), Pushed::Closed);
}

#[test]
fn h264_and_h265_in_mp4_mkv_and_ts_decode_every_frame_in_order() {
    let dir = videos();
    for file in [
        "bikes-0.mp4",
        "hevc/bikes-0.mp4",
        "mkv/bikes-0.mkv",
        "ts/bikes-0.ts",
    ] {
        let s = source(&format!(
            "cameras: [{}]",
            file_camera("cam", &dir.join(file))
        ));
        let (rows, dead) = read_all(&s, 0, 1);
        assert!(dead.is_empty(), "{file}: {dead:?}");
        let frames: Vec<i64> = rows.iter().map(|r| r.frame).collect();
        assert_eq!(frames, (0..63).collect::<Vec<_>>(), "{file}");
        for r in &rows {
            assert_eq!(
                (r.camera.as_str(), r.width, r.height),
                ("cam", 640, 272),
                "{file}"
            );
            assert_eq!(r.bytes, 640 * 272 * 3);
            // 25 fps from the stream's start.
            assert!((r.pts_ms - r.frame * 40).abs() <= 1, "{file}: {r:?}");
        }
    }
}

/// Every frame's pixels as the source gives them, in order.
fn pixels_of(source: &dyn SourceFactory) -> Vec<Vec<u8>> {
    let mut part = source.partition(0, 1).unwrap();
    let mut frames = Vec::new();
    while let Some(batch) = part.next_batch().unwrap() {
        let pixels = batch
            .records
            .column_by_name(PIXELS)
            .unwrap()
            .as_binary::<i32>();
        frames.extend(pixels.iter().map(|p| p.unwrap().to_vec()));
    }
    frames
}

#[test]
fn frames_scaled_while_converted_are_the_ffmpeg_commands_one_pass_and_keep_their_size() {
    // One swscale pass from the decoder's YUV to 300x300 RGB, as the `ffmpeg` command does
    // with the same flags: the same bytes, frame for frame, for full-range (bikes-0, JPEG
    // colours) and limited-range (live/) H.264.
    let dir = videos();
    for file in ["bikes-0.mp4", "live/bikes-0.mp4"] {
        let path = dir.join(file);
        let mut c = config(&format!(
            "{{ cameras: [{}], max_frames: 30 }}",
            file_camera("cam", &path)
        ));
        c.scale_to = Some((300, 300));
        let s = VideoSource::new(&c).unwrap();
        let field = s.schema().unwrap().field_with_name(PIXELS).unwrap().clone();
        assert_eq!(
            riffle_formats::picture::pixels_size(&field),
            Some((300, 300))
        );
        let (rows, dead) = read_all(&s, 0, 1);
        assert!(dead.is_empty(), "{file}: {dead:?}");
        assert_eq!(rows.len(), 30);
        assert!(
            rows.iter()
                .all(|r| (r.width, r.height, r.bytes) == (640, 272, 300 * 300 * 3)),
            "{file}: width/height give the camera's size, the pixels the scaled one: {:?}",
            rows[0]
        );
        let out = std::process::Command::new("ffmpeg")
            .args([
                "-hide_banner",
                "-loglevel",
                "error",
                "-nostdin",
                "-threads",
                "1",
                "-i",
            ])
            .arg(&path)
            .args(["-frames:v", "30", "-s", "300x300", "-pix_fmt", "rgb24"])
            .args(["-sws_flags", "bilinear+accurate_rnd+full_chroma_int"])
            .args(["-f", "rawvideo", "-"])
            .output()
            .expect("the ffmpeg command (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let expected: Vec<&[u8]> = out.stdout.chunks(300 * 300 * 3).collect();
        let got = pixels_of(&s);
        assert_eq!(got.len(), expected.len(), "{file}");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                g.as_slice() == *e,
                "{file}: frame {i} differs from ffmpeg's"
            );
        }
    }
}

#[test]
fn cameras_go_to_worker_index_mod_workers_each_in_order() {
    let dir = videos();
    let s = source(&format!(
        "{{ glob: \"{}/*.mp4\", batch_size: 5 }}",
        dir.display()
    ));
    let (rows, _) = read_all(&s, 1, 2);
    let mut per: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in rows {
        per.entry(r.camera).or_default().push(r.frame);
    }
    assert_eq!(per.keys().collect::<Vec<_>>(), ["bikes-1", "bikes-3"]);
    assert_eq!(per["bikes-1"], (0..62).collect::<Vec<_>>());
    assert_eq!(per["bikes-3"], (0..62).collect::<Vec<_>>());
    let (rows, _) = read_all(&s, 2, 3);
    assert!(
        rows.iter().all(|r| r.camera == "bikes-2"),
        "camera 2 of 3 workers"
    );
}

#[test]
fn every_nth_sample_fps_and_max_frames_thin_and_end_a_camera() {
    let f = videos().join("bikes-0.mp4");
    let frames = |extra: &str| -> Vec<i64> {
        let s = source(&format!(
            "{{ cameras: [{}], {extra} }}",
            file_camera("c", &f)
        ));
        read_all(&s, 0, 1).0.iter().map(|r| r.frame).collect()
    };
    assert_eq!(frames("every_nth: 10"), [0, 10, 20, 30, 40, 50, 60]);
    assert_eq!(
        frames("sample_fps: 5"),
        [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60]
    );
    assert_eq!(frames("max_frames: 4"), [0, 1, 2, 3]);
    assert_eq!(frames("every_nth: 2, max_frames: 3"), [0, 2, 4]);
}

#[test]
fn resuming_skips_exactly_the_frames_before_each_cameras_offset() {
    let dir = videos();
    let s = source(&format!("{{ glob: \"{}/bikes-?.mp4\" }}", dir.display()));
    let id = s.checkpoint_id().unwrap();
    assert_eq!(id, "video:bikes-0,bikes-1,bikes-2,bikes-3");
    let offsets = BTreeMap::from([(0, 60), (1, 62), (3, 1)]);
    let resumed = s.resume(&offsets).unwrap().unwrap();
    let (rows, _) = read_all(resumed.as_ref(), 0, 1);
    let mut per: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in rows {
        per.entry(r.camera).or_default().push(r.frame);
    }
    assert_eq!(per["bikes-0"], [60, 61, 62]);
    assert!(!per.contains_key("bikes-1"), "bikes-1 was finished");
    assert_eq!(per["bikes-2"].len(), 63);
    assert_eq!(per["bikes-3"], (1..62).collect::<Vec<_>>());
    // Live streams cannot be rewound.
    let live = source("cameras: [{ id: a, uri: \"rtsp://127.0.0.1:9/a\" }]");
    assert!(live.checkpoint_id().is_none());
    assert!(live.resume(&offsets).unwrap().is_none());
}

#[test]
fn a_camera_that_cannot_be_decoded_fails_alone_as_a_dead_letter() {
    let dir = videos();
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.mp4");
    std::fs::write(&junk, b"this is not a video").unwrap();
    let s = source(&format!(
        "cameras: [{}, {}]",
        file_camera("junk", &junk),
        file_camera("good", &dir.join("bikes-1.mp4"))
    ));
    let (rows, dead) = read_all(&s, 0, 1);
    assert_eq!(rows.len(), 62);
    assert!(rows.iter().all(|r| r.camera == "good"));
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].reason.contains("camera `junk` failed"), "{dead:?}");
    assert!(dead[0].record.contains("junk.mp4"), "{dead:?}");
}

#[test]
fn a_live_camera_that_never_comes_up_is_given_up_after_its_attempts() {
    // Nothing listens on port 9 (discard) of the loopback: every connection is refused.
    let s = source(
        "{ cameras: [{ id: gone, uri: \"rtsp://127.0.0.1:9/gone\" }], connect_attempts: 2, backoff_ms: 10 }",
    );
    let (rows, dead) = read_all(&s, 0, 1);
    assert!(rows.is_empty());
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].reason.contains("2 attempts"), "{dead:?}");
}

#[test]
fn the_pacer_releases_frames_at_their_presentation_time_from_the_first() {
    use super::pace::Pacer;
    let mut pacer = Pacer::default();
    let t0 = std::time::Instant::now();
    // The first frame is due when first asked, whatever its timestamp.
    let first = pacer.due(1000, t0, 5_000);
    assert_eq!((first.at, first.wall_ms), (t0, 5_000));
    // Later ones at the difference of timestamps, however late the question comes.
    let late = t0 + Duration::from_secs(3);
    for pts in [1040, 1080, 2000] {
        let due = pacer.due(pts, late, 9_999);
        let ahead = (pts - 1000) as u64;
        assert_eq!(due.at, t0 + Duration::from_millis(ahead), "{pts}");
        assert_eq!(due.wall_ms, 5_000 + ahead as i64, "{pts}");
    }
    // A timestamp before the first's is due at once (never before the schedule started).
    assert_eq!(pacer.due(500, late, 0).at, t0);
}

#[test]
fn a_looped_file_goes_on_one_frame_step_after_each_pass() {
    use super::pace::Looping;
    let mut looping = Looping::default();
    let pass: Vec<i64> = (0..3).map(|f| looping.shift(f * 40)).collect();
    assert_eq!(pass, [0, 40, 80]);
    assert!(looping.next_pass());
    let pass: Vec<i64> = (0..3).map(|f| looping.shift(f * 40)).collect();
    assert_eq!(pass, [120, 160, 200]);
    assert!(looping.next_pass());
    // A pass without frames ends the loop rather than spinning.
    assert!(!looping.next_pass());
}

#[test]
fn realtime_and_loop_are_for_files_and_realtime_drops_oldest() {
    let f = videos().join("bikes-0.mp4");
    let c = config(&format!(
        "{{ cameras: [{}], realtime: true, loop: true }}",
        file_camera("a", &f)
    ));
    let cameras = c.resolve().unwrap();
    assert!(cameras[0].realtime && cameras[0].looped);
    assert_eq!(cameras[0].on_overload, OnOverload::DropOldest);
    let c = config(&format!(
        "{{ cameras: [{{ id: a, uri: \"{}\", realtime: true, on_overload: wait }}] }}",
        f.display()
    ));
    assert_eq!(c.resolve().unwrap()[0].on_overload, OnOverload::Wait);
    for key in ["realtime", "loop"] {
        let c = config(&format!(
            "cameras: [{{ id: a, uri: \"rtsp://127.0.0.1:9/a\", {key}: true }}]"
        ));
        let err = c.resolve().unwrap_err().to_string();
        assert!(err.contains("apply to files"), "{key}: {err}");
    }
}

#[test]
fn a_looped_file_numbers_and_times_frames_on_across_passes() {
    let f = videos().join("bikes-0.mp4");
    let s = source(&format!(
        "{{ cameras: [{}], loop: true, max_frames: 130 }}",
        file_camera("c", &f)
    ));
    let (rows, dead) = read_all(&s, 0, 1);
    assert!(dead.is_empty(), "{dead:?}");
    let frames: Vec<i64> = rows.iter().map(|r| r.frame).collect();
    assert_eq!(frames, (0..130).collect::<Vec<_>>());
    // 63 frames a pass at 25 fps: times go on by 40 ms through the seams.
    for r in &rows {
        assert!((r.pts_ms - r.frame * 40).abs() <= 1, "{r:?}");
    }
}

#[test]
fn a_realtime_file_releases_no_frame_before_its_time() {
    let f = videos().join("bikes-0.mp4");
    let s = source(&format!(
        "{{ cameras: [{}], realtime: true, max_frames: 10, batch_size: 1 }}",
        file_camera("c", &f)
    ));
    let started = std::time::Instant::now();
    let mut part = s.partition(0, 1).unwrap();
    // (pts, stamped capture time, wall clock when read), all ms.
    let mut seen: Vec<(i64, i64, i64)> = Vec::new();
    while let Some(batch) = part.next_batch().unwrap() {
        let read_ms = camera::now_ms();
        let r = &batch.records;
        let pts = r.column(2).as_primitive::<Int64Type>();
        let ingest = r.column(3).as_primitive::<Int64Type>();
        for i in 0..r.num_rows() {
            seen.push((pts.value(i), ingest.value(i), read_ms));
        }
    }
    assert_eq!(seen.len(), 10);
    let (pts0, ingest0, _) = seen[0];
    for w in seen.windows(2) {
        assert!(w[1].0 > w[0].0, "presentation order: {seen:?}");
    }
    for &(pts, ingest, read) in &seen {
        // Stamped at its due time: the first frame's plus the presentation-time difference.
        assert_eq!(ingest - ingest0, pts - pts0, "{seen:?}");
        // And not read before then (1 ms for the clocks' rounding).
        assert!(
            read >= ingest - 1,
            "frame due at {ingest} read at {read}: {seen:?}"
        );
    }
    // Nine frame intervals of 40 ms at least; no bound on how late (a shared machine).
    assert!(started.elapsed() >= Duration::from_millis(9 * 40 - 5));
}

#[test]
fn frames_without_a_timestamp_stay_on_the_streams_clock() {
    use super::pace::StreamClock;
    let t0 = std::time::Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // RTSP: the connection's first frame has no timestamp, the next ones start at 0. It is the
    // stream's start, not the time since the camera's thread began (another clock).
    let mut clock = StreamClock::default();
    let times: Vec<i64> = [(None, 1136), (Some(0), 1140), (Some(40), 1180)]
        .into_iter()
        .map(|(pts, ms)| clock.stamp(pts, at(ms)))
        .collect();
    assert_eq!(times, [0, 0, 40]);
    // A gap in the timestamps holds the clock.
    assert_eq!(clock.stamp(None, at(1300)), 40);
    assert_eq!(clock.stamp(Some(80), at(1310)), 80);
    // A stream without timestamps is timed by arrival from its first frame.
    let mut clock = StreamClock::default();
    let times: Vec<i64> = [500, 540, 580]
        .into_iter()
        .map(|ms| clock.stamp(None, at(ms)))
        .collect();
    assert_eq!(times, [0, 40, 80]);
    // Its first timestamp, if one comes, never takes the time back; later ones are its own.
    assert_eq!(clock.stamp(Some(20), at(600)), 80);
    assert_eq!(clock.stamp(Some(120), at(640)), 120);
}

#[test]
fn a_connections_opening_burst_ends_at_the_first_frame_at_the_streams_pace() {
    use super::pace::ConnectBurst;
    let t0 = std::time::Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut burst = ConnectBurst::default();
    // Frames 40 ms apart handed over 2 ms apart: the burst (equal times decide nothing).
    assert!(burst.frame(0, at(0)));
    assert!(burst.frame(0, at(1)));
    for k in 1..20 {
        assert!(burst.frame(k * 40, at(1 + 2 * k as u64)), "{k}");
    }
    // One at its pace ends it, for good: later bunched frames are the pipeline's to keep up.
    assert!(!burst.frame(800, at(70)));
    assert!(!burst.frame(840, at(71)));
}

#[test]
fn backoff_doubles_up_to_its_cap_shortened_by_at_most_a_fifth() {
    use super::pace::Backoff;
    let ms = Duration::from_millis;
    let mut backoff = Backoff::new(ms(500), ms(2000));
    let nominal = [500u64, 1000, 2000, 2000, 2000];
    let mut jittered = false;
    for round in 0..50 {
        for (k, n) in nominal.iter().enumerate() {
            let wait = backoff.wait();
            assert!(
                wait <= ms(*n) && wait >= ms(*n * 8 / 10),
                "{round}/{k}: {wait:?}"
            );
            jittered |= wait != ms(*n);
        }
        backoff.reset();
    }
    assert!(jittered, "some waits are shortened");
}
