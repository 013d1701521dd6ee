//! The live view in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which scripts/test.sh installs) opens the page of a running four-camera
//! detection pipeline and must show every camera with the boxes its results hold, drawn on the
//! frame, and counters that advance. A screenshot is saved (`live-view.png` in Cargo's
//! test temp directory, and at `$RIFFLE_UI_SCREENSHOT` when set: scripts/ui-screenshot.sh
//! makes the README's this way).

mod common;

use std::collections::BTreeMap;
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

/// The bundled perception pipeline, paced so the page is watched while it runs.
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
            frames = frames_dir().display(),
            stages = detector_stages(0.3, 4),
        ),
    )
}

struct Killed(Child);

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

/// What the page shows of each camera: its frame, the boxes drawn, and whether the last box's
/// bottom edge has the box's colour on the canvas.
const CAMERAS_JS: &str = r##"
const out = [];
const rgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
for (const c of document.querySelectorAll("canvas.camera-frame")) {
  if (!c.dataset.frame) continue;
  const drawn = JSON.parse(c.dataset.drawn || "[]");
  let painted = null;
  if (drawn.length > 0) {
    // The last box's bottom edge (nothing is drawn over it: labels sit above top edges); a
    // line at fractional coordinates is blended at its rim, so the closest pixel of the rows
    // around the edge must carry the box's colour.
    const b = drawn[drawn.length - 1];
    const want = rgb(b.colour);
    const x = b.x + Math.floor(b.w / 2);
    const ctx = c.getContext("2d");
    let best = Infinity;
    for (let y = b.y + b.h - 3; y <= b.y + b.h + 3; y++) {
      if (y < 0 || y >= c.height) continue;
      const px = ctx.getImageData(x, y, 1, 1).data;
      best = Math.min(best, Math.max(...want.map((v, i) => Math.abs(v - px[i]))));
    }
    painted = best <= 24 ? true : `closest pixel ${best} off ${b.colour} at x ${x} of ${JSON.stringify(drawn)}`;
  }
  out.push({ camera: c.dataset.camera, frame: Number(c.dataset.frame), boxes: drawn.length, painted });
}
return out;
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_every_camera_with_its_boxes_and_live_counters() {
    require_onnx_runtime();
    require_browser();
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = paced_perception(tmp.path());
    let ui = free_port();
    let riffle = Killed(
        Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args(["run", "-q", pipeline.to_str().unwrap()])
            .args(["--ui", &format!("127.0.0.1:{ui}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let driver_port = free_port();
    let _driver = Killed(
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
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1600"],
        }),
    );
    let browser = fantoccini::ClientBuilder::native()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a headless Chromium session");
    let page = format!("http://127.0.0.1:{ui}/");
    wait_until("the view serves its page", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", ui)).is_ok()
    });
    browser.goto(&page).await.unwrap();

    // Every camera must show a frame with boxes drawn (the street has people in most frames).
    let mut verified: BTreeMap<String, (i64, usize)> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while verified.len() < 4 {
        assert!(
            Instant::now() < deadline,
            "every camera shows a frame with boxes within 90 s; verified {verified:?}"
        );
        let shown = browser.execute(CAMERAS_JS, vec![]).await.unwrap();
        for c in shown.as_array().unwrap() {
            if c["boxes"].as_u64().unwrap_or(0) > 0 {
                assert_eq!(c["painted"], true, "the box is drawn on the canvas: {c}");
                verified.insert(
                    c["camera"].as_str().unwrap().to_string(),
                    (
                        c["frame"].as_i64().unwrap(),
                        c["boxes"].as_u64().unwrap() as usize,
                    ),
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The boxes are the results' boxes for that frame.
    let out = tmp.path().join("out.jsonl");
    for (camera, (frame, boxes)) in &verified {
        let mut found = None;
        wait_until(
            &format!("{camera} frame {frame} in the results"),
            Duration::from_secs(30),
            || {
                let text = std::fs::read_to_string(&out).unwrap_or_default();
                found = text
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .find(|r| r["camera_id"] == camera.as_str() && r["frame"] == *frame);
                found.is_some()
            },
        );
        let row = found.unwrap();
        assert_eq!(
            row["detections_count"].as_u64(),
            Some(*boxes as u64),
            "{camera} frame {frame}: the page drew {boxes} boxes, the results say {row}"
        );
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
        let shown = browser.execute(CAMERAS_JS, vec![]).await.unwrap();
        let boxed = shown
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["boxes"].as_u64().unwrap_or(0) > 0)
            .count();
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
