//! Pacing of `realtime` file cameras (frames released at their presentation time, like
//! `ffmpeg -re`) and the presentation-time offsets that let a `loop`ed file go on.

use std::time::{Duration, Instant};

/// Frame step assumed for a pass whose frames gave no interval (a one-frame file): 25 fps.
const DEFAULT_STEP_MS: i64 = 40;

/// When a frame is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Due {
    /// On the monotonic clock: when to release it.
    pub at: Instant,
    /// The same instant on the wall clock (ms since the Unix epoch): its capture time.
    pub wall_ms: i64,
}

/// The release schedule of one camera: the first frame paced is due at once, each later one
/// at the first's release plus the difference of their presentation times. The schedule never
/// catches up by skipping: a frame released late stays due when it was due (its lateness
/// counts in its latency), and one with an earlier timestamp than the first is due at once.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// The first paced frame: its release (monotonic, wall ms) and presentation time.
    origin: Option<(Instant, i64, i64)>,
}

impl Pacer {
    /// When the frame presented at `pts_ms` is due; `now` / `now_wall_ms` is the present
    /// (injected so the schedule can be tested without sleeping).
    pub fn due(&mut self, pts_ms: i64, now: Instant, now_wall_ms: i64) -> Due {
        let (at, wall, pts0) = *self.origin.get_or_insert((now, now_wall_ms, pts_ms));
        let ahead = pts_ms.saturating_sub(pts0).max(0);
        Due {
            at: at + Duration::from_millis(ahead.unsigned_abs()),
            wall_ms: wall.saturating_add(ahead),
        }
    }
}

/// Presentation times of a looped file: each pass is shifted to start one frame step after
/// the previous pass's last frame, so times keep increasing across passes.
#[derive(Debug, Default)]
pub(crate) struct Looping {
    offset_ms: i64,
    /// Last presentation time of this pass (offset applied), and frames in it.
    last_ms: Option<i64>,
    step_ms: Option<i64>,
    frames: u64,
}

impl Looping {
    /// The presentation time of a frame of this pass, shifted; notes it.
    pub fn shift(&mut self, pts_ms: i64) -> i64 {
        let pts = pts_ms.saturating_add(self.offset_ms);
        if let Some(last) = self.last_ms {
            if pts > last {
                self.step_ms = Some(pts - last);
            }
        }
        self.last_ms = Some(self.last_ms.map_or(pts, |l| l.max(pts)));
        self.frames += 1;
        pts
    }

    /// The file ended: the next pass starts one step after this one's last frame. False when
    /// the pass had no frames (looping again would spin).
    pub fn next_pass(&mut self) -> bool {
        if self.frames == 0 {
            return false;
        }
        let last = self.last_ms.unwrap_or(self.offset_ms);
        self.offset_ms = last.saturating_add(self.step_ms.unwrap_or(DEFAULT_STEP_MS));
        self.frames = 0;
        true
    }
}

/// Presentation times of one connection to a stream, for frames that carry none (an RTSP
/// stream's first frame, a stream without timestamps): they stay on the stream's clock, never
/// another one, so times never go back across a connection's first frames.
/// - Before any timestamp: the first frame is the stream's start (0 ms), later ones are timed
///   by their arrival from the first's.
/// - After one: a frame without a timestamp takes the last one's (the stream's clock holds).
/// - The first timestamp seen is raised to the last time given if below it (the frames before
///   it were stamped by arrival); later ones are the stream's own.
#[derive(Debug, Default)]
pub(crate) struct StreamClock {
    /// When the connection's first frame arrived (arrival timing before any timestamp).
    first_arrival: Option<Instant>,
    /// The last time given.
    last_ms: Option<i64>,
    /// A frame of this connection carried a timestamp.
    timed: bool,
}

impl StreamClock {
    /// The presentation time of a frame with timestamp `pts_ms` arriving at `now`.
    pub fn stamp(&mut self, pts_ms: Option<i64>, now: Instant) -> i64 {
        let ms = match pts_ms {
            Some(pts) if self.timed => pts,
            Some(pts) => {
                self.timed = true;
                self.last_ms.map_or(pts, |last| pts.max(last))
            }
            None if self.timed => self.last_ms.unwrap_or(0),
            None => {
                let first = *self.first_arrival.get_or_insert(now);
                i64::try_from(now.saturating_duration_since(first).as_millis()).unwrap_or(i64::MAX)
            }
        };
        self.last_ms = Some(ms);
        ms
    }
}

/// Whether a live connection's frames are still its opening burst: what the stream buffered
/// while it was being opened (an RTSP stream's probing reads about a second of frames), handed
/// over at once. The burst lasts until a frame arrives at least half its presentation interval
/// after the one before (the stream's own pace); frames dropped before that are skipped on
/// connect, not overload.
#[derive(Debug, Default)]
pub(crate) struct ConnectBurst {
    /// The previous frame's arrival and presentation time.
    last: Option<(Instant, i64)>,
    over: bool,
}

impl ConnectBurst {
    /// Notes a decoded frame presented at `pts_ms` arriving at `now`; true while the burst
    /// lasts (this frame included).
    pub fn frame(&mut self, pts_ms: i64, now: Instant) -> bool {
        if self.over {
            return false;
        }
        if let Some((at, pts)) = self.last {
            let interval = pts_ms.saturating_sub(pts);
            let gap =
                i64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(i64::MAX);
            if interval > 0 && gap.saturating_mul(2) >= interval {
                self.over = true;
                return false;
            }
        }
        self.last = Some((now, pts_ms));
        true
    }
}

/// The waits between a live camera's attempts to open: `backoff_ms`, doubled after each
/// failure up to `max_backoff_ms` (the cap: no wait is longer), each shortened by up to 20% at
/// random so cameras that broke together do not retry in step.
#[derive(Debug)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
    random: std::collections::hash_map::RandomState,
    tries: u64,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max: max.max(first),
            next: first,
            random: std::collections::hash_map::RandomState::new(),
            tries: 0,
        }
    }

    /// The wait before the next attempt.
    pub fn wait(&mut self) -> Duration {
        use std::hash::BuildHasher;
        self.tries += 1;
        let unit = (self.random.hash_one(self.tries) >> 11) as f64 / (1u64 << 53) as f64;
        let wait = self.next.min(self.max).mul_f64(1.0 - 0.2 * unit);
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// The camera came up: the next outage starts from `backoff_ms` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}
