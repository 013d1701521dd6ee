//! The epochs one worker's input goes through: when one closes, how the next is numbered, and
//! how far the sink may fall behind (flow control).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::{InputHandle, ProbeHandle};

use super::checkpointing::Positions;
use super::EpochPolicy;
use crate::{Batch, Epoch};

/// How often a worker with nothing to read closes an empty epoch, when nothing else moves it:
/// its open epoch would otherwise hold back every other worker's (other processes' too).
pub(crate) const IDLE_EPOCH: Duration = Duration::from_millis(100);

/// The worker's two inputs, advanced together: batches, and the source positions they cover.
pub(crate) struct Inputs {
    pub batches: InputHandle<Epoch, CapacityContainerBuilder<Vec<Batch>>>,
    pub positions: Positions,
}

impl Inputs {
    /// Ends the input: dropping a connected handle closes it; the fresh one is never connected.
    pub(crate) fn close(&mut self) {
        drop(std::mem::replace(&mut self.batches, InputHandle::new()));
        self.positions.close();
    }

    pub(crate) fn advance_to(&mut self, epoch: Epoch) {
        self.batches.advance_to(epoch);
        self.positions.input.advance_to(epoch);
    }
}

/// The workers of this process, for an idle worker to learn that the others sent records at a
/// later epoch than its open one (which would hold their results back) without polling.
#[derive(Debug, Default)]
pub(crate) struct LocalPeers {
    newest: AtomicU64,
    threads: Mutex<Vec<Thread>>,
}

impl LocalPeers {
    /// The calling worker's thread is woken when a peer sends at a new epoch.
    pub(crate) fn join(&self) {
        if let Ok(mut threads) = self.threads.lock() {
            threads.push(std::thread::current());
        }
    }

    /// A worker sent records at `epoch`: peers parked on an older open epoch move past it.
    pub(crate) fn sent(&self, epoch: Epoch) {
        if self.newest.fetch_max(epoch, Ordering::AcqRel) >= epoch {
            return;
        }
        let me = std::thread::current().id();
        if let Ok(threads) = self.threads.lock() {
            threads
                .iter()
                .filter(|t| t.id() != me)
                .for_each(Thread::unpark);
        }
    }

    pub(crate) fn newest(&self) -> Epoch {
        self.newest.load(Ordering::Acquire)
    }
}

/// One worker's epoch clock.
pub(crate) struct Epochs {
    pub current: Epoch,
    /// Records (and dead letters) read into the current epoch.
    records: usize,
    opened_at: Instant,
    opened: Opened,
    clocked: bool,
    policy: EpochPolicy,
    first_epoch: Epoch,
    /// When the workers started: a clocked epoch's number is ms since then.
    released: Instant,
}

impl Epochs {
    pub(crate) fn new(
        first: Epoch,
        policy: &EpochPolicy,
        clocked: bool,
        released: Instant,
    ) -> Self {
        Epochs {
            current: first,
            records: 0,
            opened_at: Instant::now(),
            opened: Opened::new(first, policy.max_in_flight),
            clocked,
            policy: *policy,
            first_epoch: first,
            released,
        }
    }

    /// A clocked epoch's number: ms since the workers started, after the first epoch. Every
    /// worker's records read together share an epoch, however many each read before.
    fn slot(&self, at: Instant) -> Epoch {
        let ms = at.saturating_duration_since(self.released).as_millis();
        self.first_epoch
            .saturating_add(Epoch::try_from(ms).unwrap_or(Epoch::MAX))
    }

    fn open(&mut self, epoch: Epoch, inputs: &mut Inputs) {
        self.current = epoch;
        self.records = 0;
        self.opened_at = Instant::now();
        inputs.advance_to(epoch);
        self.opened.open(epoch);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Before the first records of an epoch are sent: a clocked epoch opened a while ago is
    /// renumbered by now, so it does not hold back what other workers read meanwhile.
    pub(crate) fn stamp(&mut self, inputs: &mut Inputs) {
        if self.clocked && self.records == 0 {
            let now = self.slot(Instant::now());
            if now > self.current {
                self.current = now;
                inputs.advance_to(now);
            }
        }
    }

    pub(crate) fn add(&mut self, records: usize) {
        self.records += records;
    }

    /// Whether the epoch closes now: it is full, its records are all a live source has ready
    /// (`more_ready` false: their results then complete at once), a read found nothing (a
    /// replay's epochs close only so, or when full: a replay after a restart splits records
    /// as before), it has been open `epoch_ms`, or keys were retired (their old rows close
    /// before any new ones).
    pub(crate) fn should_close(&self, more_ready: bool, empty_read: bool, retired: bool) -> bool {
        if self.records == 0 {
            return false;
        }
        let due = self
            .policy
            .max_duration
            .is_some_and(|d| self.opened_at.elapsed() >= d);
        self.records >= self.policy.records
            || (self.clocked && !more_ready)
            || empty_read
            || due
            || retired
    }

    /// Closes the epoch; the next is numbered by `at` (when the next records are due) or now.
    pub(crate) fn close(&mut self, inputs: &mut Inputs, at: Option<Instant>) {
        let next = if self.clocked {
            (self.current + 1).max(self.slot(at.unwrap_or_else(Instant::now)))
        } else {
            self.current + 1
        };
        self.open(next, inputs);
    }

    /// A worker with nothing read into its open epoch: moves it past the records other workers
    /// of this process sent (`newest`), or, after [`IDLE_EPOCH`], on by one step anyway. A
    /// worker `held` (its model full, or the sink behind) moves only a timed epoch: a counted
    /// one must number a replay's records as every run does, whatever the machine's load (a
    /// stage may rely on their order across workers).
    pub(crate) fn idle(
        &mut self,
        inputs: &mut Inputs,
        newest: Epoch,
        due: Option<Instant>,
        held: bool,
    ) {
        if self.records > 0 || (held && !self.clocked) {
            return;
        }
        if let Some(at) = due.filter(|_| self.clocked) {
            let next = self.slot(at);
            if next > self.current {
                self.open(next, inputs);
            }
            return;
        }
        if self.clocked && newest >= self.current {
            self.open(newest + 1, inputs);
        } else if self.opened_at.elapsed() >= IDLE_EPOCH {
            self.close(inputs, None);
        }
    }

    /// Flow control: the sink has not passed the epoch opened `max_in_flight` epochs ago.
    pub(crate) fn behind(&self, sink: &ProbeHandle<Epoch>) -> bool {
        self.opened.oldest().is_some_and(|b| sink.less_than(&b))
    }
}

/// The last `in_flight + 1` epochs a worker opened, oldest first (flow control counts epochs,
/// whatever their numbers: clocked epochs are numbered in ms).
struct Opened {
    epochs: VecDeque<Epoch>,
    keep: usize,
}

impl Opened {
    fn new(first: Epoch, in_flight: Epoch) -> Self {
        let keep = usize::try_from(in_flight)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        Opened {
            epochs: VecDeque::from([first]),
            keep,
        }
    }

    fn open(&mut self, epoch: Epoch) {
        self.epochs.push_back(epoch);
        while self.epochs.len() > self.keep {
            self.epochs.pop_front();
        }
    }

    /// The epoch opened `in_flight` epochs before the newest, which the sink must have passed;
    /// none while fewer have been opened (the run's first epochs go ahead freely).
    fn oldest(&self) -> Option<Epoch> {
        self.epochs
            .front()
            .copied()
            .filter(|_| self.epochs.len() == self.keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_control_waits_for_the_epoch_opened_in_flight_epochs_ago() {
        let mut opened = Opened::new(0, 2);
        assert_eq!(opened.oldest(), None);
        opened.open(5);
        assert_eq!(opened.oldest(), None);
        opened.open(9);
        assert_eq!(opened.oldest(), Some(0));
        opened.open(12);
        assert_eq!(opened.oldest(), Some(5));
    }

    fn policy(records: usize) -> EpochPolicy {
        EpochPolicy {
            records,
            max_duration: None,
            max_in_flight: 2,
        }
    }

    #[test]
    fn a_timed_epoch_closes_when_the_source_has_nothing_more_ready_a_counted_one_when_full() {
        let now = Instant::now();
        for timed in [true, false] {
            let mut epochs = Epochs::new(0, &policy(4), timed, now);
            assert!(
                !epochs.should_close(false, true, false),
                "nothing read: nothing to close"
            );
            epochs.add(2);
            // More is read right after: the epoch stays open either way.
            assert!(!epochs.should_close(true, false, false));
            // The source stopped (nothing ready, or the model is full): a timed epoch's
            // results complete now; a counted one waits to be full or for an empty read.
            assert_eq!(epochs.should_close(false, false, false), timed);
            assert!(epochs.should_close(false, true, false));
            assert!(epochs.should_close(true, false, true), "keys retired");
            epochs.add(2);
            assert!(epochs.should_close(true, false, false), "full");
        }
    }

    #[test]
    fn a_peer_is_woken_once_per_newer_epoch() {
        let peers = LocalPeers::default();
        peers.sent(7);
        assert_eq!(peers.newest(), 7);
        peers.sent(3);
        assert_eq!(peers.newest(), 7, "an older epoch never moves it back");
    }
}
