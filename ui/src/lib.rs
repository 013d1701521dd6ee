//! Riffle's live view and operational endpoints, served by the `riffle` binary.
//!
//! [`serve`] starts one HTTP server (axum on a tokio runtime of its own thread) with:
//! - `GET /metrics`: Prometheus text of this process;
//! - `GET /healthz`: 200 while the process runs; `GET /readyz`: 200 once every worker of the
//!   process has built its dataflow (models loaded) and has its share of the source, and every
//!   input the source waits for has delivered (a source's gauges `riffle_…_awaited{…}` at 1:
//!   a video camera until its first frame, named in the 503's body), else 503;
//! - with the page on ([`ViewConfig::page`]): `GET /` (the page, its assets embedded in the
//!   binary), `GET /events` (server-sent events: the view's JSON snapshot on every change),
//!   `GET /api/state` (the same snapshot), `GET /frame?camera=..&v=..` (a camera's sampled frame
//!   the snapshot's boxes belong to) and `POST /api/report` (the other processes of a
//!   cluster send their [`Report`]s here; the answer carries the camera set they follow);
//! - with the page on and a `video` sink's live folder ([`ViewConfig::video_dir`]):
//!   `GET /video/{camera}/live/index.m3u8` and its segments (the `video` module);
//! - on process 0, when the source's cameras can change (`RunContext::control`):
//!   `GET/POST /api/cameras` and `DELETE /api/cameras/{id}` (the `control` module).
//!
//! The view is fed from the side of the dataflow: frames are sampled at the source at a bounded
//! rate per camera, results and dead letters are copied as they reach the sink; nothing waits
//! for the page. Other processes run a [`PeerReporter`] that sends their stages' counters and
//! sampled frames to process 0.
//!
//! Where the feed comes from, in one hop: [`serve`] (with the page on) and
//! [`PeerReporter::start`] put a [`LiveTap`] ([`tap`]: what a camera frame is, known here) in
//! the [`RunContext`]'s `live` field as its watcher (`riffle_dataflow::observe::live`, the
//! engine's generic hook). The caller hands that context to the run
//! (`riffle_dataflow::runtime::run`), which offers the tap what passes
//! from the source step (`dataflow/src/runtime/worker.rs`) and the sink operator
//! (`dataflow/src/operators/write_to_sink.rs`). `/metrics` and `/readyz` read the same
//! context's registry and readiness.
//!
//! ```no_run
//! use riffle_dataflow::observe::RunContext;
//! use riffle_ui::{serve, ViewConfig};
//!
//! let mut context = RunContext::new()?;
//! let view = serve("127.0.0.1:8080", &mut context, ViewConfig {
//!     pipeline: "demo".into(),
//!     page: true,
//!     ..ViewConfig::default()
//! })?;
//! println!("open http://{}/", view.addr());
//! // ... run the pipeline with this `context` (it now holds the view's tap), then:
//! view.finish();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

mod control;
pub mod hub;
pub mod report;
pub mod tap;
pub mod thumb;
mod video;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::tap::LiveTap;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use riffle_dataflow::control::InputControl;
use riffle_dataflow::observe::RunContext;
use serde::Deserialize;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

pub use hub::{About, Hub};
pub use report::{Report, Reporter};

/// How often the view drains the tap, reads the metrics and tells the page.
pub const TICK: Duration = Duration::from_millis(500);
/// Frames per camera the view samples at most.
pub const FRAMES_PER_SECOND: f64 = 2.0;

#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("serving on {addr}: {cause}")]
    Bind { addr: String, cause: std::io::Error },
    #[error("starting the view's thread: {0}")]
    Thread(std::io::Error),
}

/// What the server shows and how this process fits in its cluster.
#[derive(Clone, Debug, Default)]
pub struct ViewConfig {
    pub pipeline: String,
    /// The plan as `riffle plan` prints it.
    pub plan: String,
    pub process: usize,
    pub processes: usize,
    /// Worker threads of this process (for `/readyz`).
    pub workers: usize,
    /// Serve the page (`--ui`), not only the metrics and health endpoints.
    pub page: bool,
    /// The folder of a `video` sink's live HLS (`<camera>/live/index.m3u8`), served at
    /// `/video/` for the page to play.
    pub video_dir: Option<std::path::PathBuf>,
}

struct Shared {
    context: RunContext,
    config: ViewConfig,
    hub: Mutex<Hub>,
    updates: tokio::sync::watch::Sender<Arc<str>>,
}

/// A running server; [`ViewServer::finish`] tells the page the run is over.
pub struct ViewServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tap: Option<Arc<LiveTap>>,
    finished: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<Reporter>>,
}

/// Serves `/metrics`, `/healthz`, `/readyz` and, with `config.page`, the live view, on `addr`
/// (port 0: any free port, see [`ViewServer::addr`]), from threads of its own, reading
/// `context`'s registry and readiness. With the page on, the view's [`LiveTap`] is put in
/// `context.live` (or the tap already there is used), so the run handed `context` feeds it.
pub fn serve(
    addr: &str,
    context: &mut RunContext,
    config: ViewConfig,
) -> Result<ViewServer, UiError> {
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|cause| UiError::Bind {
            addr: addr.to_string(),
            cause,
        })?;
    let bound = listener.local_addr().map_err(|cause| UiError::Bind {
        addr: addr.to_string(),
        cause,
    })?;
    let tap = config.page.then(|| live_tap(context));
    let (updates, _) = tokio::sync::watch::channel(Arc::<str>::from("{}"));
    let shared = Arc::new(Shared {
        hub: Mutex::new(Hub::new(About {
            pipeline: config.pipeline.clone(),
            plan: config.plan.clone(),
            processes: config.processes.max(1),
        })),
        context: context.clone(),
        config,
        updates,
    });
    let mut app = router(shared.clone());
    if let (Some(dir), true) = (&shared.config.video_dir, shared.config.page) {
        app = app.merge(video::routes(dir.clone()));
    }
    // Process 0 holds the camera set; the others follow it through their reports.
    if let (Some(inputs), 0) = (&shared.context.control, shared.config.process) {
        app = app.merge(control::routes(inputs.clone(), bound.ip().is_loopback()));
    }
    std::thread::Builder::new()
        .name("riffle-view".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("view: no runtime: {e}");
                    return;
                }
            };
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => {
                        if let Err(e) = axum::serve(listener, app).await {
                            tracing::error!("view server: {e}");
                        }
                    }
                    Err(e) => tracing::error!("view server: {e}"),
                }
            });
        })
        .map_err(UiError::Thread)?;
    let finished = Arc::new(AtomicBool::new(false));
    let ticker = match &tap {
        Some(tap) => Some(spawn_ticker(shared.clone(), tap.clone(), finished.clone())?),
        None => None,
    };
    Ok(ViewServer {
        addr: bound,
        shared,
        tap,
        finished,
        ticker,
    })
}

impl ViewServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Pages connected to `/events` now.
    pub fn viewers(&self) -> usize {
        self.shared.updates.receiver_count()
    }

    /// The run of this process is over: a last tick takes what is left in the tap and the
    /// page shows the final state (the server thread keeps serving until the process exits).
    pub fn finish(mut self) {
        self.finished.store(true, Ordering::SeqCst);
        let mut reporter = self
            .ticker
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        if let Some(tap) = &self.tap {
            tick(&self.shared, tap, &mut reporter, true);
        }
    }
}

fn spawn_ticker(
    shared: Arc<Shared>,
    tap: Arc<LiveTap>,
    finished: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Reporter>, UiError> {
    std::thread::Builder::new()
        .name("riffle-view-tick".into())
        .spawn(move || {
            let mut reporter = Reporter::default();
            while !finished.load(Ordering::SeqCst) {
                tick(&shared, &tap, &mut reporter, false);
                std::thread::sleep(TICK);
            }
            reporter
        })
        .map_err(UiError::Thread)
}

fn tick(shared: &Shared, tap: &LiveTap, reporter: &mut Reporter, last: bool) {
    let mut drained = tap.drain();
    let frames = std::mem::take(&mut drained.frames);
    let mut report = reporter.report(
        shared.config.process,
        &shared.context,
        shared.config.workers,
        frames,
    );
    report.finished = last;
    let snapshot = {
        let mut hub = lock(&shared.hub);
        hub.report(report);
        hub.drained(drained);
        hub.tick();
        hub.snapshot()
    };
    shared.updates.send_replace(Arc::from(snapshot.to_string()));
}

/// The tap in `context.live`, put there first if there is none: the run handed `context`
/// feeds it.
fn live_tap(context: &mut RunContext) -> Arc<LiveTap> {
    let there = context
        .live
        .clone()
        .map(|l| l.into_any().downcast::<LiveTap>());
    if let Some(Ok(tap)) = there {
        return tap;
    }
    let tap = Arc::new(LiveTap::new(FRAMES_PER_SECOND, hub::ROWS_SHOWN));
    context.live = Some(tap.clone());
    tap
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    if shared.config.page {
        router = router
            .route("/", get(|| asset("text/html; charset=utf-8", PAGE)))
            .route(
                "/app.js",
                get(|| asset("text/javascript; charset=utf-8", SCRIPT)),
            )
            .route(
                "/style.css",
                get(|| asset("text/css; charset=utf-8", STYLE)),
            )
            .route("/events", get(events))
            .route("/api/state", get(state))
            .route("/frame", get(frame))
            .route("/api/report", post(peer_report));
    } else {
        router = router.route(
            "/",
            get(|| async {
                "Riffle: /metrics, /healthz, /readyz (the live view: riffle run --ui ADDR)\n"
            }),
        );
    }
    router.with_state(shared)
}

const PAGE: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/app.js");
const STYLE: &str = include_str!("../assets/style.css");

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match shared.context.metrics.render_prometheus() {
        Ok(body) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let ready = shared.context.readiness.ready_workers();
    let want = shared.config.workers.max(1);
    if ready >= want {
        let awaited = awaited_inputs(&shared.context.metrics.registered_values());
        if !awaited.is_empty() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: no data yet from {}\n", awaited.join(", ")),
            )
                .into_response();
        }
        (
            StatusCode::OK,
            format!("ready: {ready} of {want} workers\n"),
        )
            .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {ready} of {want} workers have their models and sources\n"),
        )
            .into_response()
    }
}

/// The inputs a source still waits for: its gauges `riffle_…_awaited{…}` at 1 (a video
/// camera until its first frame), each named by its labels (`camera gone`).
fn awaited_inputs(values: &[(String, f64)]) -> Vec<String> {
    values
        .iter()
        .filter(|(_, v)| *v > 0.0)
        .filter_map(|(name, _)| {
            let (metric, labels) = name.split_once('{')?;
            metric.ends_with("_awaited").then_some(())?;
            let labels = labels.trim_end_matches('}');
            Some(labels.replace('=', " `").replace(',', "`, ") + "`")
        })
        .collect()
}

async fn events(
    State(shared): State<Arc<Shared>>,
) -> Sse<impl tokio_stream::Stream<Item = Result<Event, Infallible>>> {
    let stream = WatchStream::new(shared.updates.subscribe())
        .map(|snapshot| Ok(Event::default().data(snapshot.as_ref())));
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn state(State(shared): State<Arc<Shared>>) -> Response {
    let snapshot = shared.updates.borrow().clone();
    (
        [(header::CONTENT_TYPE, "application/json")],
        snapshot.to_string(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct FrameQuery {
    camera: String,
    v: u64,
}

async fn frame(State(shared): State<Arc<Shared>>, Query(q): Query<FrameQuery>) -> Response {
    let picture = lock(&shared.hub).picture(&q.camera, q.v);
    match picture {
        Some(bytes) => (
            [
                (header::CONTENT_TYPE, "image/jpeg"),
                (header::CACHE_CONTROL, "max-age=3600"),
            ],
            bytes.as_ref().clone(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such frame (any more)\n").into_response(),
    }
}

/// Takes a process's report; answers with the camera set the process is to follow, when the
/// source's inputs change at run time.
async fn peer_report(State(shared): State<Arc<Shared>>, Json(report): Json<Report>) -> Response {
    lock(&shared.hub).report(report);
    match &shared.context.control {
        Some(inputs) => Json(inputs.snapshot()).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// A process other than 0 of a cluster with a view: sends its reports to process 0's view.
pub struct PeerReporter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeerReporter {
    /// Puts a tap in `context.live` (as [`serve`] does) and sends a report of `context` to
    /// `view` (`host:port` of process 0's view) every [`TICK`] until [`PeerReporter::finish`].
    pub fn start(
        view: &str,
        context: &mut RunContext,
        process: usize,
        workers: usize,
    ) -> Result<Self, UiError> {
        let tap = live_tap(context);
        let context = context.clone();
        let url = format!("http://{view}/api/report");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("riffle-view-report".into())
            .spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .timeout_global(Some(Duration::from_secs(2)))
                    .build()
                    .into();
                let mut reporter = Reporter::default();
                let mut warned = false;
                loop {
                    let last = flag.load(Ordering::SeqCst);
                    let mut report =
                        reporter.report(process, &context, workers, tap.drain().frames);
                    report.finished = last;
                    match agent.post(&url).send_json(&report) {
                        Ok(mut answer) => {
                            if let Some(inputs) = &context.control {
                                follow(inputs.as_ref(), answer.body_mut(), process);
                            }
                        }
                        // The view may not be up yet, or gone: the run goes on regardless.
                        Err(e) if !warned => {
                            tracing::debug!("process {process}: the view at {url}: {e}");
                            warned = true;
                        }
                        Err(_) => {}
                    }
                    if last {
                        break;
                    }
                    std::thread::sleep(TICK);
                }
            })
            .map_err(UiError::Thread)?;
        Ok(PeerReporter {
            stop,
            thread: Some(thread),
        })
    }

    /// Sends the last report (the process's run is over) and stops.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Applies the camera set process 0 answered a report with.
fn follow(inputs: &dyn InputControl, body: &mut ureq::Body, process: usize) {
    let snapshot = match body.read_json::<serde_json::Value>() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("process {process}: process 0's {} set: {e}", inputs.noun());
            return;
        }
    };
    if let Err(e) = inputs.apply(&snapshot) {
        tracing::warn!("process {process}: process 0's {} set: {e}", inputs.noun());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_names_the_inputs_still_awaited() {
        let values = [
            ("riffle_video_camera_awaited{camera=gone}".to_string(), 1.0),
            ("riffle_video_camera_awaited{camera=good}".to_string(), 0.0),
            ("riffle_video_camera_up{camera=gone}".to_string(), 0.0),
            ("riffle_video_frames_total{camera=x}".to_string(), 3.0),
        ];
        assert_eq!(awaited_inputs(&values), ["camera `gone`"]);
    }
}
