//! Peer liveness: timely waits forever for a peer that died or whose host dropped off the
//! network (its progress never arrives), so every worker broadcasts a heartbeat through a small
//! dataflow of its own and fails the run when a peer in another process has been silent too
//! long. The supervisor (or systemd, Kubernetes) then restarts the process, and the cluster
//! resumes from its last checkpoint once every host is back.
//!
//! Workers of the same process are not judged by heartbeats: a thread cannot be gone while
//! its process lives, only busy in a call (a model, a sink's flush). Their failures reach the
//! run through its shared errors, and [`Pulses`] tell the run which of them is stuck when it is
//! asked to stop.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::DataflowError;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::Operator;
use timely::dataflow::InputHandle;

/// How often a worker says it is alive.
const BEAT: Duration = Duration::from_millis(200);

/// A worker that has not ticked for this long was itself away (in a long call): what it
/// heard meanwhile was not read, so its peers' silence is counted from its return.
const AWAY: Duration = Duration::from_secs(1);

/// When each worker of this process last came back to its own loop, written by the workers
/// and read by the thread that waits for them: a worker stuck in a call stops pulsing.
pub(crate) struct Pulses {
    origin: Instant,
    /// Milliseconds since `origin`, per worker of this process.
    last: Vec<AtomicU64>,
}

impl Pulses {
    pub(crate) fn new(workers: usize) -> Pulses {
        Pulses {
            origin: Instant::now(),
            last: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Worker `local` (its index among this process's workers) is in its loop now.
    pub(crate) fn beat(&self, local: usize) {
        if let Some(last) = self.last.get(local) {
            let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
            last.store(ms, Ordering::Relaxed);
        }
    }

    /// When worker `local` was last in its loop (the start, if never).
    pub(crate) fn last(&self, local: usize) -> Instant {
        let ms = self
            .last
            .get(local)
            .map_or(0, |l| l.load(Ordering::Relaxed));
        self.origin + Duration::from_millis(ms)
    }
}

pub struct Liveness {
    input: InputHandle<u64, CapacityContainerBuilder<Vec<usize>>>,
    index: usize,
    /// This process's workers: not judged by heartbeats.
    local: std::ops::Range<usize>,
    last_beat: Option<Instant>,
    /// When each worker was last heard from (none yet: counted from `started`).
    heard: Rc<RefCell<Vec<Option<Instant>>>>,
    started: Instant,
    /// When this worker last came back from being away (see [`AWAY`]).
    back: Instant,
    last_tick: Instant,
    timeout: Duration,
    pulses: std::sync::Arc<Pulses>,
}

impl Liveness {
    /// Builds the heartbeat dataflow on `worker`, one of `threads` per process. A peer in
    /// another process silent for `timeout` is gone; before its first heartbeat (it may still
    /// be loading models) it gets `timeout` plus a minute. Every tick also pulses `pulses`.
    pub(crate) fn build(
        worker: &mut timely::worker::Worker,
        timeout: Duration,
        threads: usize,
        pulses: std::sync::Arc<Pulses>,
    ) -> Liveness {
        let peers = worker.peers();
        let threads = threads.max(1);
        let first = worker.index() / threads * threads;
        let heard: Rc<RefCell<Vec<Option<Instant>>>> = Rc::new(RefCell::new(vec![None; peers]));
        let sink = heard.clone();
        let mut input = InputHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            input
                .to_stream(scope)
                .broadcast()
                .sink(Pipeline, "Liveness", move |(input, _)| {
                    input.for_each(|_, data| {
                        let now = Instant::now();
                        let mut heard = sink.borrow_mut();
                        for peer in data.drain(..) {
                            if let Some(at) = heard.get_mut(peer) {
                                *at = Some(now);
                            }
                        }
                    });
                });
        });
        let now = Instant::now();
        Liveness {
            input,
            index: worker.index(),
            local: first..first + threads,
            last_beat: None,
            heard,
            started: now,
            back: now,
            last_tick: now,
            timeout,
            pulses,
        }
    }

    /// This worker is in its loop (for the run's watch), without a heartbeat check.
    pub fn pulse(&self) {
        self.pulses.beat(self.index - self.local.start);
    }

    /// Sends a heartbeat when one is due, and fails if a peer in another process has been
    /// silent too long.
    pub fn tick(&mut self) -> Result<(), DataflowError> {
        let now = Instant::now();
        self.pulse();
        if now.duration_since(self.last_tick) > AWAY {
            self.back = now;
        }
        self.last_tick = now;
        if self.last_beat.is_none_or(|t| t.elapsed() >= BEAT) {
            self.input.send(self.index);
            self.input.flush();
            self.last_beat = Some(Instant::now());
        }
        let silent = first_silent(
            &self.heard.borrow(),
            &self.local,
            self.started.max(self.back),
            self.back,
            now,
            self.timeout,
        );
        match silent {
            Some(peer) => Err(DataflowError::Cluster(format!(
                "worker {peer} has been silent for over {:.1} s: its process or host is gone \
                 (runtime.peer_timeout_ms); stopping so the cluster can restart from its \
                 last checkpoint",
                self.timeout.as_secs_f64()
            ))),
            None => Ok(()),
        }
    }

    /// Stops the heartbeats (the run is over).
    pub fn close(&mut self) {
        drop(std::mem::replace(&mut self.input, InputHandle::new()));
    }
}

/// The first peer outside `local` silent for longer than `timeout` at `now`: heard last
/// before `back` counts as heard at `back` (this worker was away and read nothing), never
/// heard counts from `since` with a minute's grace (it may still be loading models).
fn first_silent(
    heard: &[Option<Instant>],
    local: &std::ops::Range<usize>,
    since: Instant,
    back: Instant,
    now: Instant,
    timeout: Duration,
) -> Option<usize> {
    let grace = timeout + Duration::from_secs(60);
    heard.iter().enumerate().find_map(|(peer, at)| {
        let silent = match at {
            Some(at) => now.saturating_duration_since((*at).max(back)) > timeout,
            None => now.saturating_duration_since(since) > grace,
        };
        (silent && !local.contains(&peer)).then_some(peer)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_peers_of_other_processes_are_judged_and_never_for_this_workers_absence() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(30);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Two processes of two workers; this is worker 0 of process 0 (workers 0, 1).
        let local = 0..2;
        let heard = [Some(at(0)), Some(at(0)), Some(at(10)), Some(at(50))];
        // At 45 s, worker 1 (this process) and 2 (the other) were last heard long ago.
        assert_eq!(
            first_silent(&heard, &local, t0, t0, at(45), timeout),
            Some(2)
        );
        // The same, but this worker was itself away until 40 s: nobody is silent yet.
        assert_eq!(
            first_silent(&heard, &local, t0, at(40), at(45), timeout),
            None
        );
        assert_eq!(
            first_silent(&heard, &local, t0, at(40), at(71), timeout),
            Some(2)
        );
        // One process: its workers are never judged by heartbeats, however quiet.
        let alone = [Some(at(0)), None];
        assert_eq!(
            first_silent(&alone, &(0..2), t0, t0, at(1000), timeout),
            None
        );
        // Never heard: a minute's grace on top of the timeout.
        let unheard = [Some(at(0)), None];
        assert_eq!(
            first_silent(&unheard, &(0..1), t0, t0, at(80), timeout),
            None
        );
        assert_eq!(
            first_silent(&unheard, &(0..1), t0, t0, at(91), timeout),
            Some(1)
        );
    }

    #[test]
    fn pulses_tell_when_each_worker_was_last_in_its_loop() {
        let pulses = Pulses::new(2);
        let start = pulses.last(0);
        std::thread::sleep(Duration::from_millis(20));
        pulses.beat(1);
        assert_eq!(pulses.last(0), start);
        assert!(pulses.last(1) >= start + Duration::from_millis(20));
        // Out of range: ignored, not a panic.
        pulses.beat(7);
    }
}
