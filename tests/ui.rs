//! The live view in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which scripts/test.sh installs) opens the page of a running four-camera
//! detection pipeline and must show every camera with the boxes its results hold, drawn on the
//! frame where the results' `x1..y2` fall once scaled to the canvas (checked on the canvas's
//! pixels), and counters that advance. A screenshot is saved (`live-view.png` in Cargo's
//! test temp directory, and at `$RIFFLE_UI_SCREENSHOT` when set: scripts/ui-screenshot.sh
//! makes the README's this way).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

fn require_browser() {
    for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: the live-view test needs a headless browser; install Debian's \
             `{package}` (`apt-get install chromium chromium-driver`; scripts/test.sh does)"
        );
    }
}

/// The bundled frames enlarged to 960×408 (a canvas of 640 shows them at ⅔, so a
/// box drawn without scaling, or scaled by the wrong side, lands elsewhere), as `<tmp>/frames/big`.
fn enlarged_frames(tmp: &Path) -> PathBuf {
    let root = tmp.join("frames");
    let dir = root.join("big");
    std::fs::create_dir_all(&dir).unwrap();
    let status = Command::new("ffmpeg")
        .args(["-v", "error", "-start_number", "0", "-i"])
        .arg(frames_dir().join("%04d.jpg"))
        .args(["-frames:v", "250", "-vf", "scale=960:408", "-q:v", "3"])
        .args(["-start_number", "0"])
        .arg(dir.join("%04d.jpg"))
        .status()
        .expect("running ffmpeg (scripts/setup.sh installs it)");
    assert!(status.success(), "ffmpeg enlarging the frames");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 250);
    root
}

/// The perception pipeline over the enlarged frames, paced so the page is watched while it runs.
fn paced_perception(tmp: &Path) -> PathBuf {
    write(
        tmp,
        "perception.yaml",
        &format!(
            r#"
name: camera-perception-live
source:
  images: {{ path: "{frames}", cameras: 4, partition_by: camera, batch_size: 4, repeat: 20, max_records_per_second: 40 }}
stages:{stages}
  - select: {{ columns: [camera_id, frame, width, height, detections_count, detections] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 2, intra_op_threads: 1, epoch_records: 8 }}
"#,
            frames = enlarged_frames(tmp).display(),
            stages = detector_stages(0.3, 4),
        ),
    )
}

struct Killed(Child);

/// `riffle run PIPELINE --ui 127.0.0.1:UI`, killed when its guard drops.
fn run_with_view(pipeline: &Path, ui: u16) -> Killed {
    Killed(
        Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args(["run", "-q"])
            .arg(pipeline)
            .args(["--ui", &format!("127.0.0.1:{ui}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

/// Chromedriver (killed when its guard drops) and a headless Chromium session through it.
async fn open_browser() -> (Killed, fantoccini::Client) {
    let driver_port = free_port();
    let driver = Killed(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("chromedriver listens", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", driver_port)).is_ok()
    });
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1600", "--autoplay-policy=no-user-gesture-required"],
        }),
    );
    let browser = fantoccini::ClientBuilder::native()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a headless Chromium session");
    (driver, browser)
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each camera canvas that shows a frame: its camera and frame (which result it draws), its
/// size, and its pixels (RGBA, base64): the boxes are checked on the pixels, never on what the
/// page says it drew.
const CANVASES_JS: &str = r##"
const out = [];
for (const c of document.querySelectorAll("canvas.camera-frame")) {
  if (!c.dataset.frame) continue;
  const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let bytes = "";
  for (let i = 0; i < data.length; i += 0x8000) {
    bytes += String.fromCharCode.apply(null, data.subarray(i, i + 0x8000));
  }
  out.push({ camera: c.dataset.camera, frame: Number(c.dataset.frame), width: c.width, height: c.height, rgba: btoa(bytes) });
}
return out;
"##;

/// The page's box colours, by `track_id`, else `class_id`, else the detection's index.
const PALETTE: [[u8; 3]; 8] = [
    [0xff, 0x4d, 0x4d],
    [0x4d, 0xd2, 0xff],
    [0xff, 0xd2, 0x4d],
    [0x7d, 0xff, 0x4d],
    [0xff, 0x4d, 0xd2],
    [0x4d, 0x7d, 0xff],
    [0xff, 0x9f, 0x4d],
    [0xb8, 0x4d, 0xff],
];

/// A pixel matches a colour when no channel is further than this from it.
const TOLERANCE: u8 = 24;

/// A camera canvas as read from the page.
struct Canvas {
    camera: String,
    frame: i64,
    width: usize,
    height: usize,
    rgba: Vec<u8>,
}

impl Canvas {
    fn from_json(c: &serde_json::Value) -> Canvas {
        use base64::Engine as _;
        let canvas = Canvas {
            camera: c["camera"].as_str().unwrap().to_string(),
            frame: c["frame"].as_i64().unwrap(),
            width: c["width"].as_u64().unwrap() as usize,
            height: c["height"].as_u64().unwrap() as usize,
            rgba: base64::engine::general_purpose::STANDARD
                .decode(c["rgba"].as_str().unwrap())
                .unwrap(),
        };
        assert_eq!(canvas.rgba.len(), canvas.width * canvas.height * 4);
        canvas
    }

    /// How far pixel (x, y) is from `colour` (the largest channel difference); 255 outside.
    fn off(&self, x: i64, y: i64, colour: [u8; 3]) -> u8 {
        if x < 0 || y < 0 || x as usize >= self.width || y as usize >= self.height {
            return u8::MAX;
        }
        let at = (y as usize * self.width + x as usize) * 4;
        (0..3)
            .map(|i| self.rgba[at + i].abs_diff(colour[i]))
            .max()
            .unwrap()
    }
}

/// A box where the results say it is, in canvas pixels.
#[derive(Debug)]
struct Expected {
    x1: f64,
    y1: f64,
    x2: f64,
    y2: f64,
    colour: [u8; 3],
}

impl Expected {
    /// Distance from (x, y) (a pixel's centre) to the box's outline.
    fn to_outline(&self, x: f64, y: f64) -> f64 {
        let inside_x = x >= self.x1 && x <= self.x2;
        let inside_y = y >= self.y1 && y <= self.y2;
        let dx = if inside_x {
            0.0
        } else {
            (self.x1 - x).max(x - self.x2)
        };
        let dy = if inside_y {
            0.0
        } else {
            (self.y1 - y).max(y - self.y2)
        };
        if inside_x && inside_y {
            [x - self.x1, self.x2 - x, y - self.y1, self.y2 - y]
                .into_iter()
                .fold(f64::INFINITY, f64::min)
        } else {
            dx.hypot(dy)
        }
    }

    /// Whether (x, y) may be under the box's label: a filled tab of the box's colour above
    /// its top edge (16 px high, as wide as its text).
    fn under_label(&self, x: f64, y: f64) -> bool {
        let top = (self.y1 - 17.0).max(0.0);
        x >= self.x1 - 3.0 && x <= self.x1 + 140.0 && y >= top - 2.0 && y <= top + 18.0
    }
}

/// The boxes of a result row scaled to a `width` × `height` canvas, from the row's own frame
/// size and `x1..y2` (source pixels).
fn expected_boxes(row: &serde_json::Value, width: usize, height: usize) -> Vec<Expected> {
    let sx = width as f64 / row["width"].as_f64().unwrap();
    let sy = height as f64 / row["height"].as_f64().unwrap();
    row["detections"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let key = d["track_id"]
                .as_i64()
                .or(d["class_id"].as_i64())
                .unwrap_or(i as i64);
            Expected {
                x1: d["x1"].as_f64().unwrap() * sx,
                y1: d["y1"].as_f64().unwrap() * sy,
                x2: d["x2"].as_f64().unwrap() * sx,
                y2: d["y2"].as_f64().unwrap() * sy,
                colour: PALETTE[key.unsigned_abs() as usize % PALETTE.len()],
            }
        })
        .collect()
}

/// Checks that `canvas` shows the boxes of `row`: each box's 3-pixel stroke lies on its four
/// edges (the pixel under each edge, or one beside it, has the box's colour), the lines 5 pixels
/// inside and outside each edge do not, and no pixel of a box colour lies away from every
/// expected outline and label. Returns the number of boxes checked.
fn check_drawing(canvas: &Canvas, row: &serde_json::Value) -> Result<usize, String> {
    let boxes = expected_boxes(row, canvas.width, canvas.height);
    let what = |b: &Expected| format!("{} frame {} box {b:?}", canvas.camera, canvas.frame);
    let explained = |x: f64, y: f64, margin: f64| {
        boxes
            .iter()
            .any(|b| b.to_outline(x, y) <= margin || b.under_label(x, y))
    };
    const SAMPLES: usize = 9;
    for b in &boxes {
        // (edge coordinate, horizontal?) with the span it runs along.
        let edges = [
            (b.y1, true, b.x1, b.x2, "top"),
            (b.y2, true, b.x1, b.x2, "bottom"),
            (b.x1, false, b.y1, b.y2, "left"),
            (b.x2, false, b.y1, b.y2, "right"),
        ];
        for (at, horizontal, from, to, name) in edges {
            let mut on = 0;
            let mut beside = 0;
            let mut beside_checked = 0;
            for k in 0..SAMPLES {
                let along = from + (to - from) * (0.15 + 0.7 * k as f64 / (SAMPLES - 1) as f64);
                let pixel = |across: f64| -> (i64, i64) {
                    if horizontal {
                        (along.floor() as i64, across.floor() as i64)
                    } else {
                        (across.floor() as i64, along.floor() as i64)
                    }
                };
                // The stroke covers [at - 1.5, at + 1.5]: the pixel holding `at` is inside it.
                let best = (-1..=1)
                    .map(|d| {
                        let (x, y) = pixel(at + d as f64);
                        canvas.off(x, y, b.colour)
                    })
                    .min()
                    .unwrap();
                if best <= TOLERANCE {
                    on += 1;
                }
                for across in [at - 5.0, at + 5.0] {
                    let (x, y) = pixel(across);
                    let centre = (x as f64 + 0.5, y as f64 + 0.5);
                    // Only where no expected box or label accounts for that colour.
                    if x < 0 || y < 0 || explained(centre.0, centre.1, 3.0) {
                        continue;
                    }
                    if (x as usize) < canvas.width && (y as usize) < canvas.height {
                        beside_checked += 1;
                        if canvas.off(x, y, b.colour) <= TOLERANCE {
                            beside += 1;
                        }
                    }
                }
            }
            // Another box's label text may cover a few points of an edge.
            if on * 3 < SAMPLES * 2 {
                return Err(format!(
                    "{}: its {name} edge is not drawn where the results put it ({on} of \
                     {SAMPLES} points have its colour)",
                    what(b)
                ));
            }
            if beside * 4 > beside_checked.max(1) {
                return Err(format!(
                    "{}: its colour lies 5 px beside its {name} edge ({beside} of \
                     {beside_checked} points): the box is drawn off its place",
                    what(b)
                ));
            }
        }
    }
    // Box colours nowhere else: no box drawn off its place, or without a result.
    let colours: BTreeSet<[u8; 3]> = boxes.iter().map(|b| b.colour).chain([PALETTE[1]]).collect();
    let mut stray = Vec::new();
    for y in 0..canvas.height as i64 {
        for x in 0..canvas.width as i64 {
            if colours.iter().any(|&c| canvas.off(x, y, c) <= TOLERANCE)
                && !explained(x as f64 + 0.5, y as f64 + 0.5, 2.5)
            {
                stray.push((x, y));
            }
        }
    }
    if stray.len() > 30 {
        return Err(format!(
            "{} frame {}: {} pixels of a box colour away from every box of the results \
             (e.g. {:?}); boxes {boxes:?}",
            canvas.camera,
            canvas.frame,
            stray.len(),
            &stray[..5]
        ));
    }
    Ok(boxes.len())
}

/// The results file's rows by (camera, frame).
fn results_by_frame(out: &Path) -> BTreeMap<(String, i64), serde_json::Value> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|r| {
            (
                (
                    r["camera_id"].as_str().unwrap().to_string(),
                    r["frame"].as_i64().unwrap(),
                ),
                r,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_every_camera_with_its_boxes_and_live_counters() {
    require_onnx_runtime();
    require_browser();
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = paced_perception(tmp.path());
    let ui = free_port();
    let riffle = run_with_view(&pipeline, ui);
    let (_driver, browser) = open_browser().await;
    let page = format!("http://127.0.0.1:{ui}/");
    wait_until("the view serves its page", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", ui)).is_ok()
    });
    browser.goto(&page).await.unwrap();

    // Every camera must show frames whose drawn boxes are where the results put them, scaled
    // to the canvas (the street has people in most frames). Canvases are read as they are
    // shown; each is checked once its result is in the results file.
    let out = tmp.path().join("out.jsonl");
    let mut pending: Vec<Canvas> = Vec::new();
    let mut checked: BTreeMap<String, (usize, usize)> = BTreeMap::new(); // frames, boxes
    let done = |checked: &BTreeMap<String, (usize, usize)>| {
        checked.len() == 4
            && checked
                .values()
                .all(|&(frames, boxes)| frames >= 3 && boxes >= 1)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done(&checked) {
        assert!(
            Instant::now() < deadline,
            "every camera shows 3 checked frames and a box within 120 s; checked {checked:?}"
        );
        let shown = browser.execute(CANVASES_JS, vec![]).await.unwrap();
        for c in shown.as_array().unwrap() {
            let canvas = Canvas::from_json(c);
            if !pending
                .iter()
                .any(|p| p.camera == canvas.camera && p.frame == canvas.frame)
            {
                pending.push(canvas);
            }
        }
        let results = results_by_frame(&out);
        pending.retain(|canvas| {
            let Some(row) = results.get(&(canvas.camera.clone(), canvas.frame)) else {
                return true;
            };
            let boxes = check_drawing(canvas, row).unwrap_or_else(|e| panic!("{e}"));
            let seen = checked.entry(canvas.camera.clone()).or_default();
            seen.0 += 1;
            seen.1 += boxes;
            false
        });
        // Results come once their epoch completes: a few canvases wait for theirs.
        if pending.len() > 32 {
            pending.drain(..pending.len() - 32);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Counters advance while the run goes on.
    let count = |v: serde_json::Value| v.as_str().unwrap_or("0").parse::<u64>().unwrap_or(0);
    let script = "return document.getElementById('results').dataset.value;";
    let before = count(browser.execute(script, vec![]).await.unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = count(browser.execute(script, vec![]).await.unwrap());
    assert!(
        after > before,
        "results counter advances: {before} → {after}"
    );
    let stages = browser
        .execute(
            "return [...document.querySelectorAll('#stages tbody tr')].map(r => r.dataset.stage);",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        stages.as_array().unwrap().iter().any(|s| s == "model"),
        "the stage table lists the model: {stages}"
    );

    // The screenshot (the README's picture) at a moment every camera shows boxes, if one
    // comes within a while.
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let boxed = browser
            .execute(
                "return [...document.querySelectorAll('canvas.camera-frame')].filter(c => Number(c.dataset.boxes) > 0).length;",
                vec![],
            )
            .await
            .unwrap();
        let boxed = boxed.as_u64().unwrap_or(0);
        if boxed == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let png = browser.screenshot().await.unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let artefact = Path::new(env!("CARGO_TARGET_TMPDIR")).join("live-view.png");
    std::fs::write(&artefact, &png).unwrap();
    if let Some(path) = std::env::var_os("RIFFLE_UI_SCREENSHOT") {
        std::fs::write(&path, &png).unwrap();
    }
    eprintln!("screenshot: {}", artefact.display());
    browser.close().await.unwrap();

    // SIGTERM ends the run cleanly.
    let mut riffle = riffle;
    // SAFETY: kill(2) on our own child, not yet waited for.
    assert_eq!(
        unsafe { libc::kill(riffle.0.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let started = Instant::now();
    let status = loop {
        if let Some(s) = riffle.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "riffle exits after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "SIGTERM: exit 0, not {status}");
}

/// The camera's `<video>` as the page plays it: where it is, how much is buffered, its
/// picture's size, any error, and the mean brightness of its current picture (drawn on a
/// canvas: a picture that decodes, not a black box).
const VIDEO_JS: &str = r##"
const v = document.querySelector(`.camera[data-camera="${arguments[0]}"] video`)
  || [...document.querySelectorAll("video")].find((e) => e.closest("[data-camera]")?.dataset.camera === arguments[0]);
if (!v) return null;
let mean = 0;
if (v.videoWidth) {
  const c = document.createElement("canvas");
  c.width = v.videoWidth; c.height = v.videoHeight;
  const g = c.getContext("2d");
  g.drawImage(v, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let sum = 0;
  for (let i = 0; i < d.length; i += 4) sum += d[i] + d[i + 1] + d[i + 2];
  mean = sum / (d.length / 4) / 3;
}
return { time: v.currentTime, width: v.videoWidth, height: v.videoHeight, hidden: v.hidden,
         error: v.error ? v.error.message || String(v.error.code) : null, mean,
         h264: MediaSource.isTypeSupported('video/mp4; codecs="avc1.640028"') };
"##;

/// The issue's "done when": a camera added with one request to a running pipeline whose
/// frames go through a `tap: { video }`, and its annotated video played in the page at its
/// live edge (Media Source Extensions reading the tap's HLS through the view).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_camera_added_by_request_plays_its_annotated_video_in_the_page() {
    require_onnx_runtime();
    require_browser();
    let tmp = tempfile::tempdir().unwrap();
    let clip = repo().join("data/videos/bikes-0.mp4");
    assert!(
        clip.is_file(),
        "{} missing: run scripts/media.sh",
        clip.display()
    );
    let video = tmp.path().join("video");
    let pipeline = write(
        tmp.path(),
        "watch.yaml",
        &format!(
            r#"
name: watch
source:
  video: {{ cameras: [], stay_open: true, batch_size: 4 }}
stages:{stages}
  - track: {{}}
  - tap: {{ video: {{ dir: "{video}", preset: ultrafast }} }}
  - select: {{ columns: [camera_id, frame] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 2, intra_op_threads: 1, epoch_records: 8 }}
"#,
            stages = video_tracker_stages_keeping_frames(0.3),
            video = video.display(),
        ),
    );
    let ui = free_port();
    let riffle = run_with_view(&pipeline, ui);
    wait_until("the view serves its page", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", ui)).is_ok()
    });
    let (_driver, browser) = open_browser().await;
    browser
        .goto(&format!("http://127.0.0.1:{ui}/"))
        .await
        .unwrap();

    // One request adds the camera: a clip replayed at its own pace, round and round.
    let added = ureq::post(&format!("http://127.0.0.1:{ui}/api/cameras"))
        .content_type("application/json")
        .send(
            serde_json::json!({"id": "street", "uri": clip, "loop": true, "realtime": true})
                .to_string(),
        )
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(added, 201, "POST /api/cameras");

    // Its card offers the video once the tap's playlist is there (the page asks every 5 s).
    let toggle = "[data-camera=\"street\"] button.play";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let shown = browser
            .execute(
                &format!("const b = document.querySelector('{toggle}'); return !!b && !b.hidden;"),
                vec![],
            )
            .await
            .unwrap();
        if shown == serde_json::Value::Bool(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the camera's card offers its video within 60 s (playlist: {})",
            video.join("street/live/index.m3u8").display()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    browser
        .find(fantoccini::Locator::Css(toggle))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // It plays: the clock moves on by seconds, the picture is the camera's size and not black.
    let state = || async {
        browser
            .execute(VIDEO_JS, vec![serde_json::json!("street")])
            .await
            .unwrap()
    };
    let first = state().await;
    assert_eq!(first["h264"], true, "Chromium plays H.264 in MSE: {first}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut started: Option<f64> = None;
    let last = loop {
        let now = state().await;
        assert!(now["error"].is_null(), "the video fails: {now}");
        let t = now["time"].as_f64().unwrap_or(0.0);
        if now["width"].as_u64().unwrap_or(0) > 0 {
            match started {
                None => started = Some(t),
                Some(s) if t - s >= 3.0 => break now,
                Some(_) => {}
            }
        }
        assert!(
            Instant::now() < deadline,
            "the video plays 3 s within 60 s: {now}, from {started:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        (last["width"].as_u64(), last["height"].as_u64()),
        (Some(640), Some(272))
    );
    assert_eq!(last["hidden"], false, "the video replaces the stills");
    assert!(
        last["mean"].as_f64().unwrap() > 10.0,
        "a picture, not black: {last}"
    );
    browser.close().await.unwrap();
    drop(riffle);
}
