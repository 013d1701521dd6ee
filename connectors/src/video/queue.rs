//! A camera's bounded frame queue between its decoding thread and the worker reading it, and
//! the frame thinning (`every_nth`, `sample_fps`) applied before frames are queued.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::source::Wake;

use super::config::OnOverload;

/// One decoded frame, RGB8 row-major.
#[derive(Debug)]
pub(crate) struct Frame {
    pub frame: i64,
    pub pts_ms: i64,
    pub ingest_ms: i64,
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// What became of a pushed frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Queued,
    /// Queued after discarding the oldest queued frame.
    DroppedOldest,
    /// Discarded: the queue was full.
    DroppedNewest,
    /// The reader is gone: the camera should stop.
    Closed,
}

/// Wakes a worker waiting on several cameras' queues when any of them changes.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    rings: Mutex<u64>,
    rung: Condvar,
    /// The worker parked between reads, woken on every ring.
    worker: Mutex<Option<Wake>>,
}

impl Bell {
    pub fn ring(&self) {
        *lock(&self.rings) += 1;
        self.rung.notify_all();
        if let Some(w) = lock(&self.worker).as_ref() {
            w.wake();
        }
    }

    /// Wakes `worker` on every ring from now on.
    pub fn wake_with(&self, worker: Wake) {
        *lock(&self.worker) = Some(worker);
    }

    pub fn wakes_worker(&self) -> bool {
        lock(&self.worker).is_some()
    }

    /// The number of rings so far, to wait on with [`Bell::wait`].
    pub fn count(&self) -> u64 {
        *lock(&self.rings)
    }

    /// Waits until rung after `seen` rings, or `timeout` passes.
    pub fn wait(&self, seen: u64, timeout: Duration) {
        let guard = lock(&self.rings);
        let _ = self
            .rung
            .wait_timeout_while(guard, timeout, |rings| *rings == seen);
    }
}

#[derive(Debug, Default)]
struct State {
    frames: VecDeque<Frame>,
    /// Undecodable frames and camera failures. Never dropped: they are rare and small, and a
    /// dead letter must not vanish.
    rejected: Vec<DeadLetter>,
    /// The camera has no more frames (end of file, `max_frames`, or given up).
    finished: bool,
    /// The reader is gone.
    closed: bool,
    high_water: usize,
}

/// A camera's queue: at most `capacity` frames, `policy` deciding what a full queue does.
#[derive(Debug)]
pub(crate) struct FrameQueue {
    state: Mutex<State>,
    room: Condvar,
    capacity: usize,
    policy: OnOverload,
    bell: Arc<Bell>,
}

impl FrameQueue {
    pub fn new(capacity: usize, policy: OnOverload, bell: Arc<Bell>) -> Self {
        FrameQueue {
            state: Mutex::new(State::default()),
            room: Condvar::new(),
            capacity: capacity.max(1),
            policy,
            bell,
        }
    }

    pub fn push(&self, frame: Frame) -> Pushed {
        let mut state = lock(&self.state);
        let mut outcome = Pushed::Queued;
        while !state.closed && state.frames.len() >= self.capacity {
            match self.policy {
                OnOverload::DropOldest => {
                    state.frames.pop_front();
                    outcome = Pushed::DroppedOldest;
                }
                OnOverload::DropNewest => return Pushed::DroppedNewest,
                OnOverload::Wait => {
                    // Timed so a closed reader is noticed even if its wake-up is missed.
                    state = self
                        .room
                        .wait_timeout(state, Duration::from_millis(100))
                        .map_or_else(|p| p.into_inner().0, |(s, _)| s);
                }
            }
        }
        if state.closed {
            return Pushed::Closed;
        }
        state.frames.push_back(frame);
        state.high_water = state.high_water.max(state.frames.len());
        drop(state);
        self.bell.ring();
        outcome
    }

    pub fn reject(&self, dead: DeadLetter) {
        lock(&self.state).rejected.push(dead);
        self.bell.ring();
    }

    /// No more frames will come.
    pub fn finish(&self) {
        lock(&self.state).finished = true;
        self.bell.ring();
    }

    /// The reader is gone: pushes fail from now on, waiting ones wake.
    pub fn close(&self) {
        let mut state = lock(&self.state);
        state.closed = true;
        state.frames.clear();
        drop(state);
        self.room.notify_all();
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    /// Takes the oldest frame, if any.
    pub fn pop(&self) -> Option<Frame> {
        let frame = lock(&self.state).frames.pop_front();
        if frame.is_some() {
            self.room.notify_one();
        }
        frame
    }

    pub fn take_rejected(&self) -> Vec<DeadLetter> {
        std::mem::take(&mut lock(&self.state).rejected)
    }

    /// Finished and drained: nothing more will ever come out.
    pub fn is_done(&self) -> bool {
        let state = lock(&self.state);
        state.finished && state.frames.is_empty() && state.rejected.is_empty()
    }

    /// The most frames the queue ever held.
    pub fn high_water(&self) -> usize {
        lock(&self.state).high_water
    }
}

/// Decides which decoded frames a camera keeps: every `every_nth` frame number, then at most
/// `sample_fps` a second by presentation time.
#[derive(Debug)]
pub(crate) struct Thinning {
    every_nth: u64,
    period_ms: Option<f64>,
    /// Presentation time from which the next frame may be kept.
    next_ms: Option<f64>,
}

impl Thinning {
    pub fn new(every_nth: u64, sample_fps: Option<f64>) -> Self {
        Thinning {
            every_nth: every_nth.max(1),
            period_ms: sample_fps.map(|f| 1000.0 / f),
            next_ms: None,
        }
    }

    pub fn keep(&mut self, frame: i64, pts_ms: i64) -> bool {
        if !frame.unsigned_abs().is_multiple_of(self.every_nth) {
            return false;
        }
        let Some(period) = self.period_ms else {
            return true;
        };
        let pts = pts_ms as f64;
        match self.next_ms {
            // A timestamp jump (a reconnected stream restarts its clock) starts a new schedule.
            Some(next) if pts >= next - period && pts < next + 10.0 * period => {
                if pts < next {
                    return false;
                }
                // Slots advance on the schedule, so rounding never drifts the rate.
                let mut n = next + period;
                while n <= pts {
                    n += period;
                }
                self.next_ms = Some(n);
            }
            _ => self.next_ms = Some(pts + period),
        }
        true
    }
}

// A poisoned lock only means a camera thread panicked mid-update; the queue is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
