//! One camera's decoding thread: opens its stream, reconnects a broken live stream with
//! backoff, thins and converts frames and queues them under the camera's overload policy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use riffle_dataflow::dead_letter::DeadLetter;

use super::config::Camera;
use super::decoder::{self, Decoded, Ended, Flow, Image, OpenOptions, VideoError};
use super::metrics::CameraMetrics;
use super::pace::{Backoff, ConnectBurst, Looping, Pacer, StreamClock};
use super::queue::{Frame, FrameQueue, Pushed, Thinning};

/// Retry settings of live cameras.
#[derive(Clone, Debug)]
pub(crate) struct Retry {
    pub attempts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
}

/// Everything a camera's thread needs.
pub(crate) struct CameraTask {
    pub camera: Camera,
    pub open: OpenOptions,
    pub retry: Retry,
    /// Frames numbered below this were delivered by an earlier run (resume): skipped.
    pub resume_from: i64,
    pub queue: Arc<FrameQueue>,
    pub metrics: CameraMetrics,
    pub stop: Arc<AtomicBool>,
}

/// Where the camera stands, across reconnections.
struct Progress {
    /// Number of the next decoded frame (frame numbers go on across reconnections).
    next_frame: i64,
    /// Frames kept by the thinning so far (what `max_frames` counts).
    kept: u64,
    thinning: Thinning,
    /// This connection's presentation times (reset on each open).
    clock: StreamClock,
    /// This connection's opening burst (reset on each open).
    burst: ConnectBurst,
    /// `realtime`: when each frame is released.
    pacer: Pacer,
    /// `loop`: presentation times shifted pass after pass.
    looping: Looping,
}

impl Progress {
    fn start(camera: &Camera, resume_from: i64) -> Self {
        Progress {
            // A live stream cannot be rewound: a resumed one numbers its frames on from the
            // checkpoint instead (per-camera state downstream expects them to go on).
            next_frame: if camera.live { resume_from } else { 0 },
            kept: 0,
            thinning: Thinning::new(camera.every_nth, camera.sample_fps),
            clock: StreamClock::default(),
            burst: ConnectBurst::default(),
            pacer: Pacer::default(),
            looping: Looping::default(),
        }
    }
}

/// The state of a live stream's connection attempts.
struct Link {
    /// Failed opens in a row.
    failures: u32,
    backoff: Backoff,
    /// Since when a live stream has been down (`None` while up, or before it first came up).
    outage: Option<Instant>,
}

/// What follows the end of a connection's stream.
enum AfterStream {
    /// The camera is finished (its queue too).
    Done,
    /// A looped file plays again.
    PlayAgain,
    /// A live stream reconnects.
    Reconnect,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl CameraTask {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name(format!("video-{}", self.camera.id))
            .spawn(move || self.run())
    }

    fn run(self) {
        let uri = self.camera.uri.as_ffmpeg();
        let mut progress = Progress::start(&self.camera, self.resume_from);
        let mut link = Link {
            failures: 0,
            backoff: Backoff::new(self.retry.backoff, self.retry.max_backoff),
            outage: None,
        };
        loop {
            if self.stopped() {
                return self.queue.finish();
            }
            let mut stream = match decoder::open(&uri, &self.open, &self.stop) {
                Ok(stream) => stream,
                // Stopping abandons a live stream's opening: not a failure.
                Err(_) if self.stopped() => return self.queue.finish(),
                Err(e) => {
                    if self.retry_open(&mut link, &e) {
                        continue;
                    }
                    return;
                }
            };
            self.connected(&mut link);
            progress.clock = StreamClock::default();
            progress.burst = ConnectBurst::default();
            let ended = stream.run(&self.stop, &mut |d| self.handle(d, &mut progress));
            self.metrics.health.down();
            match self.after_stream(ended, &mut progress) {
                AfterStream::Done => return,
                AfterStream::PlayAgain => continue,
                AfterStream::Reconnect => link.outage = Some(Instant::now()),
            }
        }
    }

    /// Counts a failed open and waits out the backoff before the next try (`true`); gives the
    /// camera up instead (`false`) when it is not live or out of attempts.
    fn retry_open(&self, link: &mut Link, e: &VideoError) -> bool {
        let camera = &self.camera;
        link.failures += 1;
        let failures = link.failures;
        if !camera.live || failures >= self.retry.attempts {
            self.give_up(&format!("{e} ({failures} attempts)"));
            return false;
        }
        if failures == 1 && link.outage.is_none() {
            tracing::warn!("camera `{}`: {e}; retrying with backoff", camera.id);
        }
        self.sleep(link.backoff.wait());
        true
    }

    /// A stream opened: an outage ends, and the retries start over.
    fn connected(&self, link: &mut Link) {
        if let Some(since) = link.outage.take() {
            self.metrics.reconnects.inc();
            tracing::info!(
                "camera `{}`: reconnected after {:.1} s",
                self.camera.id,
                since.elapsed().as_secs_f64()
            );
        }
        link.failures = 0;
        link.backoff.reset();
    }

    /// Ends the camera when its file (or `max_frames`) is done or it fails; a looped file plays
    /// again, a live stream reconnects.
    fn after_stream(&self, ended: Result<Ended, VideoError>, p: &mut Progress) -> AfterStream {
        let camera = &self.camera;
        match ended {
            Ok(Ended::Stopped) => {
                // `max_frames` reached ends a camera as its file's end does.
                if camera.max_frames.is_some_and(|m| p.kept >= m) {
                    self.metrics.health.ended();
                }
                self.queue.finish();
            }
            // A looped file plays again, its frame numbers and times going on.
            Ok(Ended::Eof) if camera.looped && !camera.live => {
                if p.looping.next_pass() {
                    return AfterStream::PlayAgain;
                }
                self.metrics.health.ended();
                self.queue.finish();
            }
            Ok(Ended::Eof) if !camera.live => {
                self.metrics.health.ended();
                self.queue.finish();
            }
            Err(e) if !camera.live => self.give_up(&e.to_string()),
            // Logged once per outage; the retries stay quiet until it ends.
            Ok(Ended::Eof) => {
                tracing::warn!("camera `{}`: stream ended; reconnecting", camera.id);
                return AfterStream::Reconnect;
            }
            Err(e) => {
                tracing::warn!("camera `{}`: {e}; reconnecting", camera.id);
                return AfterStream::Reconnect;
            }
        }
        AfterStream::Done
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.queue.is_closed()
    }

    /// Sleeps `how_long`, waking early when stopped.
    fn sleep(&self, how_long: Duration) {
        let until = Instant::now() + how_long;
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }

    /// The camera is given up: logged, counted and reported as a dead letter; the other cameras
    /// go on.
    fn give_up(&self, reason: &str) {
        let camera = &self.camera;
        tracing::error!("camera `{}` failed: {reason}", camera.id);
        self.metrics.health.down();
        self.metrics.failures.inc();
        self.queue.reject(DeadLetter {
            stage: "source".into(),
            reason: format!("camera `{}` failed: {reason}", camera.id),
            record: serde_json::json!({
                "camera_id": camera.id,
                "uri": camera.uri.to_string(),
            })
            .to_string(),
        });
        self.queue.finish();
    }

    fn handle(&self, decoded: Decoded<'_>, p: &mut Progress) -> Flow {
        match decoded {
            Decoded::Corrupt {
                pts_ms,
                reason,
                frame,
            } => self.corrupt(p, pts_ms, &reason, frame),
            Decoded::Frame { pts_ms, image } => self.frame(p, pts_ms, image),
        }
    }

    /// Something that did not decode: a dead letter (a frame that did still takes a number).
    #[allow(
        clippy::indexing_slicing,
        reason = "`record` is the JSON object built just above: indexing inserts the key"
    )]
    fn corrupt(&self, p: &mut Progress, pts_ms: Option<i64>, reason: &str, frame: bool) -> Flow {
        let camera = &self.camera;
        let number = p.next_frame;
        if frame {
            p.next_frame += 1;
        }
        // Reported by the run that delivered the frames around it.
        if number < self.resume_from {
            return Flow::Continue;
        }
        let mut record = serde_json::json!({
            "camera_id": camera.id,
            "uri": camera.uri.to_string(),
            "pts_ms": pts_ms,
        });
        if frame {
            record["frame"] = number.into();
        }
        self.queue.reject(DeadLetter {
            stage: "source".into(),
            reason: format!("camera `{}`: {reason}", camera.id),
            record: record.to_string(),
        });
        Flow::Continue
    }

    /// A decoded frame: numbered, timed and thinned; then (unless an earlier run delivered
    /// it) paced, converted and queued.
    fn frame(&self, p: &mut Progress, pts_ms: Option<i64>, image: Image<'_>) -> Flow {
        let camera = &self.camera;
        self.metrics.health.frame();
        let number = p.next_frame;
        p.next_frame += 1;
        let arrived = Instant::now();
        let pts_ms = p.clock.stamp(pts_ms, arrived);
        let in_burst = camera.live && p.burst.frame(pts_ms, arrived);
        let pts_ms = if camera.looped {
            p.looping.shift(pts_ms)
        } else {
            pts_ms
        };
        if !p.thinning.keep(number, pts_ms) {
            return Flow::Continue;
        }
        p.kept += 1;
        let last = camera.max_frames.is_some_and(|m| p.kept >= m);
        let end = if last { Flow::Stop } else { Flow::Continue };
        if number < self.resume_from {
            return end;
        }
        let Some(ingest_ms) = self.ingest_ms(p, pts_ms) else {
            return Flow::Stop;
        };
        let (width, height, pixels) = match image.rgb() {
            Ok(rgb) => rgb,
            Err(e) => {
                self.reject_unconverted(number, pts_ms, &e);
                return end;
            }
        };
        self.metrics.frames.inc();
        let pushed = self.queue.push(Frame {
            frame: number,
            pts_ms,
            ingest_ms,
            width,
            height,
            pixels,
        });
        self.metrics
            .queue_high_water
            .set(self.queue.high_water() as i64);
        self.pushed(pushed, in_burst, end)
    }

    /// The frame's ingest time: now, or with `realtime` its time once waited for (`None`:
    /// stopped while waiting).
    fn ingest_ms(&self, p: &mut Progress, pts_ms: i64) -> Option<i64> {
        if !self.camera.realtime {
            return Some(now_ms());
        }
        // A realtime file waits for the frame's time; it is stamped as captured then.
        let due = p.pacer.due(pts_ms, Instant::now(), now_ms());
        self.sleep(due.at.saturating_duration_since(Instant::now()));
        if self.stopped() {
            return None;
        }
        Some(due.wall_ms)
    }

    /// A frame that did not convert to RGB: a dead letter.
    fn reject_unconverted(&self, number: i64, pts_ms: i64, e: &ffmpeg_next::Error) {
        let camera = &self.camera;
        self.queue.reject(DeadLetter {
            stage: "source".into(),
            reason: format!("camera `{}`: converting to RGB: {e}", camera.id),
            record: serde_json::json!({
                "camera_id": camera.id,
                "frame": number,
                "pts_ms": pts_ms,
            })
            .to_string(),
        });
    }

    /// Counts what the queue dropped; `end` unless the queue is closed.
    fn pushed(&self, pushed: Pushed, in_burst: bool, end: Flow) -> Flow {
        match pushed {
            Pushed::Queued => end,
            Pushed::DroppedOldest | Pushed::DroppedNewest => {
                // What a connection buffered while opening is stale, not overload.
                if in_burst {
                    self.metrics.skipped_on_connect.inc();
                } else {
                    self.metrics.dropped.inc();
                }
                end
            }
            Pushed::Closed => Flow::Stop,
        }
    }
}
