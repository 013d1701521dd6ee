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
