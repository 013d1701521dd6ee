//! Worker 0's checkpointer: turns completed epochs into checkpoints, and drives the results
//! sink's commits from them.
//!
//! On an object store the checkpoint goes to the writer thread and its outcome is picked up at
//! a later poll, with at most one write in flight. A write that fails (the store is down or
//! slow past its timeout) is logged with the store's URL and tried again with a growing pause:
//! checkpoints are only delayed, results keep flowing, and nothing is lost or duplicated,
//! because a checkpoint is what a restart resumes from and the sink's commits follow it. A
//! store failing for longer than `give_up` fails the run. A local directory's write is done in
//! place and its failure fails the run at once (a full disk does not heal by waiting).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::dataflow::ProbeHandle;

use super::{
    Offsets, OperatorState, Positions, Start, SINK_GENERATION, SINK_POSITION, SOURCE_STATE,
};
use crate::checkpoint::writer::{Done, Writer};
use crate::checkpoint::{Checkpoint, CheckpointStore};
use crate::{Committer, DataflowError, DataflowResult, Epoch, SourceFactory};

/// A checkpoint's offsets and state entries.
type Content = (Offsets, BTreeMap<String, String>);

/// A checkpoint the writer thread has in hand.
struct InFlight {
    epoch: Epoch,
    content: Content,
    /// `considered` before it, restored if the write fails.
    before: Option<Epoch>,
}

/// Writes failing since `since`; the next try is at `retry_at`.
struct Failing {
    since: Instant,
    delay: Duration,
    retry_at: Instant,
}

/// The first pause after a failed write; each next one doubles, up to the longest.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const LONGEST_RETRY: Duration = Duration::from_secs(5);

/// Worker 0's writer: turns completed epochs into checkpoints.
pub struct Checkpointer {
    store: CheckpointStore,
    source_id: String,
    /// Asked for its own state at each checkpoint.
    source: Arc<dyn SourceFactory>,
    workers: usize,
    committed: Offsets,
    written: Option<Epoch>,
    /// Newest epoch a checkpoint was considered for (written, or found unchanged).
    considered: Option<Epoch>,
    /// Offsets and state of the last checkpoint written.
    last_content: Option<(Offsets, BTreeMap<String, String>)>,
    /// Highest epoch any position was received for (the last one, once everything is done).
    seen: Option<Epoch>,
    /// The results sink's position after each completed epoch, when the sink has one: a
    /// checkpoint is only written for an epoch whose exact sink position is known.
    sink_positions: Option<Rc<RefCell<BTreeMap<Epoch, u64>>>>,
    interval: Duration,
    last_write: Option<Instant>,
    /// Exactly-once output: the sink's acknowledged position, this run's generation, and the
    /// writer of commit markers.
    durable: Option<Arc<AtomicU64>>,
    generation: Option<u64>,
    committer: Option<Box<dyn Committer>>,
    /// An object store's writer thread (none: writes happen in place).
    writer: Option<Writer>,
    in_flight: Option<InFlight>,
    failing: Option<Failing>,
    give_up: Duration,
}

/// What the checkpointer needs from the results sink for exactly-once output.
pub struct SinkCommit {
    pub positions: Option<Rc<RefCell<BTreeMap<Epoch, u64>>>>,
    pub durable: Option<Arc<AtomicU64>>,
    pub committer: Option<Box<dyn Committer>>,
}

impl Checkpointer {
    pub fn new(
        store: CheckpointStore,
        source_id: String,
        workers: usize,
        start: &Start,
        sink: SinkCommit,
        interval: Duration,
        give_up: Duration,
    ) -> Self {
        let SinkCommit {
            positions: sink_positions,
            durable,
            committer,
        } = sink;
        Checkpointer {
            interval,
            last_write: None,
            durable,
            generation: start.generation,
            committer,
            store,
            source_id,
            source: start.source.clone(),
            workers,
            committed: start.resumed.clone(),
            // The checkpoint resumed from is already written.
            written: start.first_epoch.checked_sub(1),
            considered: None,
            last_content: None,
            seen: None,
            sink_positions,
            // Process 0's, for worker 0.
            writer: start.writer.lock().ok().and_then(|mut w| w.take()),
            in_flight: None,
            failing: None,
            give_up,
        }
    }

    /// Whether a checkpoint is still on its way: in the writer's hands, or failed and due
    /// again. The run's last checkpoint waits for it.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some() || self.failing.is_some()
    }

    /// Writes a checkpoint for the newest epoch that is complete at the sink and whose
    /// positions have all arrived, if it is newer than the last one written; on an object
    /// store, first takes in what became of the one handed to the writer.
    pub fn poll(
        &mut self,
        positions: &Positions,
        sink: &ProbeHandle<Epoch>,
        state: Option<&mut OperatorState>,
    ) -> DataflowResult<()> {
        if self.writer.is_some() {
            self.take_outcomes()?;
            // A transactional sink's seal stays while its checkpoint is on its way.
            if self.in_flight.is_some()
                || self
                    .failing
                    .as_ref()
                    .is_some_and(|f| Instant::now() < f.retry_at)
            {
                return Ok(());
            }
        }
        let submitted = self.consider(positions, sink, state)?;
        if !submitted && self.in_flight.is_none() {
            // Nothing is left to write: what failed is covered by what was written since.
            self.failing = None;
        }
        Ok(())
    }

    /// [`Self::poll`]'s work: whether a checkpoint was written or handed to the writer.
    fn consider(
        &mut self,
        positions: &Positions,
        sink: &ProbeHandle<Epoch>,
        state: Option<&mut OperatorState>,
    ) -> DataflowResult<bool> {
        let frontier = |p: &ProbeHandle<Epoch>| p.with_frontier(|f| f.first().copied());
        let state_frontier = state.as_ref().and_then(|s| frontier(&s.probe));
        let sink_frontier = match (frontier(sink), state_frontier) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Epochs strictly below all frontiers are complete (no frontier: everything is).
        let mut target = match (frontier(&positions.probe), sink_frontier) {
            (Some(a), Some(b)) => match a.min(b).checked_sub(1) {
                Some(t) => t,
                None => return Ok(false),
            },
            (Some(a), None) | (None, Some(a)) => match a.checked_sub(1) {
                Some(t) => t,
                None => return Ok(false),
            },
            (None, None) => Epoch::MAX,
        };
        if self.transactional() {
            match self.cut(target)? {
                Some(cut) => target = cut,
                None => return Ok(false),
            }
        }
        let mut sink_position = None;
        if let Some(sink_positions) = &self.sink_positions {
            let known = sink_positions.borrow();
            // Only what the destination has acknowledged counts as written.
            let durable = self.durable.as_ref().map(|d| d.load(Ordering::Acquire));
            let Some((&epoch, &at)) = known
                .range(..=target)
                .rev()
                .find(|(_, at)| durable.is_none_or(|d| **at <= d))
            else {
                return Ok(false);
            };
            target = epoch;
            sink_position = Some(at);
        }
        let mut received = positions.received.borrow_mut();
        let complete: Vec<Epoch> = received.range(..=target).map(|(e, _)| *e).collect();
        for epoch in complete {
            if let Some(offsets) = received.remove(&epoch) {
                for (partition, next) in offsets {
                    let at = self.committed.entry(partition).or_insert(next);
                    *at = (*at).max(next);
                }
            }
            self.seen = self.seen.max(Some(epoch));
        }
        drop(received);
        let epoch = if target == Epoch::MAX {
            self.seen.max(self.written)
        } else {
            Some(target)
        };
        let Some(epoch) = epoch else {
            return self.release().map(|()| false);
        };
        if self
            .written
            .max(self.considered)
            .is_some_and(|w| w >= epoch)
            || self.committed.is_empty()
        {
            return self.release().map(|()| false);
        }
        let last = target == Epoch::MAX;
        if !last && self.last_write.is_some_and(|t| t.elapsed() < self.interval) {
            return self.release().map(|()| false);
        }
        let mut entries = BTreeMap::new();
        if let Some(at) = sink_position {
            entries.insert(SINK_POSITION.to_string(), at.to_string());
        }
        if let Some(g) = self.generation {
            entries.insert(SINK_GENERATION.to_string(), g.to_string());
        }
        if let Some(s) = self.source.checkpoint_state() {
            entries.insert(SOURCE_STATE.to_string(), s);
        }
        if let Some(state) = state {
            state.fold_through(epoch);
            entries.extend(state.serialise()?);
        }
        let before = self.considered;
        self.considered = Some(epoch);
        // Epochs in which nothing moved (idle workers close empty ones) need no new checkpoint:
        // the last one already says the same.
        let content = (self.committed.clone(), entries);
        if self.last_content.as_ref() == Some(&content) {
            return self.release().map(|()| false);
        }
        let checkpoint = Checkpoint {
            epoch,
            workers: self.workers,
            sources: BTreeMap::from([(self.source_id.clone(), content.0.clone())]),
            state: content.1.clone(),
        };
        match &self.writer {
            Some(writer) => {
                writer.submit(checkpoint)?;
                self.in_flight = Some(InFlight {
                    epoch,
                    content,
                    before,
                });
            }
            None => {
                self.store.write(&checkpoint)?;
                self.record_written(epoch, content)?;
            }
        }
        Ok(true)
    }

    /// The checkpoint of `epoch` is written: the sink's commit follows it.
    fn record_written(&mut self, epoch: Epoch, content: Content) -> DataflowResult<()> {
        self.written = Some(epoch);
        self.last_write = Some(Instant::now());
        // The checkpoint makes the epochs final; readers learn it from the commit markers (a
        // crash before they are written is covered: the next run writes them first).
        if let (Some(committer), Some(g)) = (self.committer.as_mut(), self.generation) {
            committer.source_offsets(&content.0);
            if let Some(at) = content.1.get(SINK_POSITION).and_then(|p| p.parse().ok()) {
                committer.sink_position(at);
            }
            committer.commit(g, epoch)?;
        }
        self.last_content = Some(content);
        Ok(())
    }

    /// What the writer thread did with the checkpoint it had, and whether the lease holds.
    fn take_outcomes(&mut self) -> DataflowResult<()> {
        while let Some(done) = self.writer.as_ref().and_then(Writer::try_done) {
            match done {
                Done::Written(epoch, at) => {
                    let Some(flight) = self.in_flight.take() else {
                        continue;
                    };
                    if let Some(failing) = self.failing.take() {
                        tracing::info!(
                            "checkpoint of epoch {epoch} written to {at} after {:.1} s of \
                             failed writes",
                            failing.since.elapsed().as_secs_f64()
                        );
                    }
                    debug_assert_eq!(flight.epoch, epoch);
                    self.record_written(epoch, flight.content)?;
                }
                Done::Failed(epoch, e) => {
                    if let Some(flight) = self.in_flight.take() {
                        self.considered = flight.before;
                    }
                    self.failed(epoch, e)?;
                }
                Done::LeaseLost(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// A write failed: try again after a pause, or fail the run once the store has failed
    /// for `give_up`.
    fn failed(&mut self, epoch: Epoch, e: DataflowError) -> DataflowResult<()> {
        let now = Instant::now();
        let url = self
            .writer
            .as_ref()
            .map_or_else(|| self.store.describe(), |w| w.url().to_string());
        let failing = self.failing.get_or_insert(Failing {
            since: now,
            delay: Duration::ZERO,
            retry_at: now,
        });
        let failed_for = now.duration_since(failing.since);
        if failed_for >= self.give_up {
            return Err(DataflowError::io(
                format!(
                    "giving up on checkpoints at {url}: writes have failed for {:.0} s \
                     (runtime.checkpoint.give_up_s is {})",
                    failed_for.as_secs_f64(),
                    self.give_up.as_secs()
                ),
                std::io::Error::other(e.to_string()),
            ));
        }
        failing.delay = (failing.delay * 2).clamp(FIRST_RETRY, LONGEST_RETRY);
        failing.retry_at = now + failing.delay;
        tracing::warn!(
            "checkpoint of epoch {epoch} delayed: {e}; trying again in {:.1} s (failing for \
             {:.1} s; the run fails after {} s, runtime.checkpoint.give_up_s)",
            failing.delay.as_secs_f64(),
            failed_for.as_secs_f64(),
            self.give_up.as_secs()
        );
        Ok(())
    }
}

impl Checkpointer {
    fn transactional(&self) -> bool {
        self.committer.as_ref().is_some_and(|c| c.transactional())
    }

    /// A transactional sink's cut: the epoch its open transaction is sealed at, sealing it at
    /// the newest epoch the sink has written once a checkpoint is due. `None` while the
    /// checkpoint must wait (not due, or positions and state not yet through the cut).
    fn cut(&mut self, target: Epoch) -> DataflowResult<Option<Epoch>> {
        let Some(committer) = self.committer.as_mut() else {
            return Ok(None);
        };
        let cut = match committer.sealed() {
            Some(cut) => cut,
            None => {
                let end = target == Epoch::MAX;
                if !end && self.last_write.is_some_and(|t| t.elapsed() < self.interval) {
                    return Ok(None);
                }
                // The sink writes whole epochs in order, so its transaction holds exactly the
                // epochs up to the newest one it has reported.
                let newest = self
                    .sink_positions
                    .as_ref()
                    .and_then(|p| p.borrow().last_key_value().map(|(e, _)| *e));
                let Some(cut) = newest else { return Ok(None) };
                if self.written.max(self.considered).is_some_and(|w| w >= cut) {
                    return Ok(None);
                }
                if !committer.seal(cut) {
                    return Ok(None);
                }
                cut
            }
        };
        Ok((target >= cut).then_some(cut))
    }

    /// Lifts a seal that no checkpoint followed.
    fn release(&mut self) -> DataflowResult<()> {
        match self.committer.as_mut() {
            Some(c) if c.sealed().is_some() => c.release(),
            _ => Ok(()),
        }
    }
}
