//! Progress-driven checkpoints: when the sink's frontier passes an epoch on every worker, the
//! source positions up to that epoch are written to the checkpoint store; a run with a store
//! resumes from the newest intact checkpoint.
//!
//! Positions travel through the dataflow itself: every worker sends the next offset of each
//! partition it read in epoch `e` at time `e`, exchanged to worker 0. Once both that stream's
//! frontier and the sink's pass `e`, every result of epochs ≤ `e` is written and every position
//! of those epochs has arrived, so the checkpoint for `e` is safe to write.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::{Checkpoint, CheckpointStore};
use crate::sink::Recovery;
use crate::state::{Envelope, SavedState};
use crate::{Committer, DataflowError, DataflowResult, Epoch, SourceFactory};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Concatenate, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle, Scope};

use super::chain::{Restored, StepState};
use super::Job;

/// Partition → next offset.
pub type Offsets = BTreeMap<i32, i64>;

/// Where a run starts: its source (moved to checkpointed offsets when resuming), its first
/// epoch, and the store to write to.
pub struct Start {
    pub source: Arc<dyn SourceFactory>,
    pub first_epoch: Epoch,
    pub store: Option<CheckpointStore>,
    /// Positions already covered by the checkpoint resumed from.
    pub resumed: Offsets,
    /// Where the results sink stood at that checkpoint.
    pub sink_position: Option<u64>,
    /// Stateful stages' checkpointed state, by stage name.
    pub restored: Restored,
    /// This run's generation, when it checkpoints (its output is then exactly-once): the
    /// start time in milliseconds, so a later run always has a larger one.
    pub generation: Option<u64>,
    /// The generation that wrote the checkpoint resumed from, and its epoch.
    pub previous: Option<(u64, Epoch)>,
}

fn new_generation() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Opens the job's checkpoint store, if any, and resumes from its newest checkpoint — or, when
/// the sink is transactional, from the checkpoint its last committed transaction recorded.
/// `leader`: this process opens the sink.
pub fn start(job: &Job, leader: bool) -> DataflowResult<Start> {
    let Some(config) = &job.checkpoint else {
        return Ok(Start {
            source: job.source.clone(),
            first_epoch: 0,
            store: None,
            resumed: Offsets::new(),
            sink_position: None,
            restored: Restored::new(),
            generation: None,
            previous: None,
        });
    };
    let Some(id) = job.source.checkpoint_id() else {
        return Err(DataflowError::Config(format!(
            "{}: runtime.checkpoint needs a source that can resume from offsets",
            job.name
        )));
    };
    let store = CheckpointStore::open(&config.dir, config.keep)?;
    let checkpoint = match job.sink.recover(leader)? {
        Recovery::Latest => store.latest()?,
        Recovery::Committed(committed) => committed_checkpoint(&store, committed, leader)?,
    };
    let Some(checkpoint) = checkpoint else {
        tracing::info!(
            "no checkpoint to resume from in {}: starting from the source's start",
            config.dir.display()
        );
        return Ok(Start {
            source: job.source.clone(),
            first_epoch: 0,
            store: Some(store),
            resumed: Offsets::new(),
            sink_position: None,
            restored: Restored::new(),
            generation: Some(new_generation()),
            previous: None,
        });
    };
    let offsets = checkpoint.sources.get(&id).cloned().unwrap_or_default();
    let resumed = job.source.resume(&offsets)?.ok_or_else(|| {
        DataflowError::Config(format!("source `{id}` cannot resume from offsets"))
    })?;
    tracing::info!(
        "resuming from checkpoint epoch {} in {} ({} partition offsets)",
        checkpoint.epoch,
        config.dir.display(),
        offsets.len()
    );
    Ok(Start {
        source: resumed,
        first_epoch: checkpoint.epoch + 1,
        store: Some(store),
        resumed: offsets,
        sink_position: checkpoint
            .state
            .get(SINK_POSITION)
            .and_then(|p| p.parse().ok()),
        restored: restored_state(&checkpoint.state)?,
        generation: Some(new_generation()),
        previous: checkpoint
            .state
            .get(SINK_GENERATION)
            .and_then(|g| g.parse().ok())
            .map(|g| (g, checkpoint.epoch)),
    })
}

/// The checkpoint a transactional sink's last commit recorded. The leader first removes newer
/// ones: their transactions never committed, so their output is void and their input is read
/// again.
fn committed_checkpoint(
    store: &CheckpointStore,
    committed: Option<(u64, Epoch)>,
    leader: bool,
) -> DataflowResult<Option<Checkpoint>> {
    if leader {
        let discarded = store.discard_after(committed.map(|(_, e)| e))?;
        if discarded > 0 {
            tracing::info!("discarded {discarded} checkpoint(s) whose transaction never committed");
        }
    }
    let Some((generation, epoch)) = committed else {
        return Ok(None);
    };
    match store.at(epoch)? {
        Some(c) if c.state.get(SINK_GENERATION) == Some(&generation.to_string()) => Ok(Some(c)),
        _ => Err(DataflowError::Config(format!(
            "the results topic's last transaction committed epoch {epoch} of run {generation}, \
             but {} holds no checkpoint of it: this checkpoint directory is not the one that \
             output was written with (use that directory, or give the sink a new \
             `transactional_id` to start the output over)",
            store.dir().display()
        ))),
    }
}

/// The operator states in a checkpoint's state map.
fn restored_state(state: &BTreeMap<String, String>) -> DataflowResult<Restored> {
    let mut restored = Restored::new();
    for (key, value) in state {
        let Some(stage) = key.strip_prefix(OPERATOR_PREFIX) else {
            continue;
        };
        let saved = SavedState::parse(value)
            .map_err(|e| DataflowError::Config(format!("checkpointed state of `{stage}`: {e}")))?;
        restored.insert(stage.to_string(), saved);
    }
    Ok(restored)
}

/// Epoch → (stage, record, diff).
type StateByEpoch = BTreeMap<Epoch, Vec<(String, String, isize)>>;

/// Stateful stages' state updates, gathered on worker 0 and consolidated as epochs complete.
pub struct OperatorState {
    pub probe: ProbeHandle<Epoch>,
    /// Epoch → (stage, record, diff), filled on worker 0.
    received: Rc<RefCell<StateByEpoch>>,
    /// Stage → record → count, for the epochs folded in so far.
    current: BTreeMap<String, HashMap<String, isize>>,
    /// Stage → its records' kind.
    kinds: BTreeMap<String, &'static str>,
}

impl OperatorState {
    /// Gathers `streams` on worker 0.
    pub fn build<'scope>(
        scope: Scope<'scope, Epoch>,
        streams: Vec<StepState<'scope>>,
    ) -> OperatorState {
        let received: Rc<RefCell<StateByEpoch>> = Rc::default();
        let sink = received.clone();
        let kinds = streams
            .iter()
            .map(|(name, kind, _)| (name.clone(), *kind))
            .collect();
        let tagged = streams.into_iter().map(|(name, _, updates)| {
            updates.map(move |(record, diff)| (name.clone(), record, diff))
        });
        let (probe, _) = scope
            .concatenate(tagged)
            .unary_frontier::<CapacityContainerBuilder<Vec<()>>, _, _, _>(
                Exchange::new(|_: &(String, String, isize)| 0),
                "CollectState",
                move |_, _| {
                    move |(input, _), _| {
                        input.for_each(|cap, data| {
                            if let Some(epoch) = cap.least().copied() {
                                sink.borrow_mut().entry(epoch).or_default().append(data);
                            }
                        });
                    }
                },
            )
            .probe();
        OperatorState {
            probe,
            received,
            current: BTreeMap::new(),
            kinds,
        }
    }

    /// Folds the updates of epochs ≤ `epoch` into the current state.
    fn fold_through(&mut self, epoch: Epoch) {
        let mut received = self.received.borrow_mut();
        while let Some(entry) = received.first_entry() {
            if *entry.key() > epoch {
                break;
            }
            for (stage, record, diff) in entry.remove() {
                let records = self.current.entry(stage).or_default();
                match records.get_mut(&record) {
                    Some(count) => {
                        *count += diff;
                        if *count == 0 {
                            records.remove(&record);
                        }
                    }
                    None => {
                        records.insert(record, diff);
                    }
                }
            }
        }
    }

    /// The state map entries for a checkpoint: each stage's records in the versioned envelope
    /// ([`crate::state::Envelope`]).
    fn serialise(&self) -> DataflowResult<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (stage, records) in &self.current {
            let kind = self.kinds.get(stage).copied().unwrap_or_default();
            let records = records.iter().map(|(r, n)| (r.as_str(), *n));
            let text = Envelope::new(kind, records)
                .and_then(|e| e.to_text())
                .map_err(|e| DataflowError::Config(format!("the state of `{stage}`: {e}")))?;
            out.insert(format!("{OPERATOR_PREFIX}{stage}"), text);
        }
        Ok(out)
    }
}

/// The positions side of the dataflow, per worker.
pub struct Positions {
    pub input: InputHandle<Epoch, CapacityContainerBuilder<Vec<(i32, i64)>>>,
    pub probe: ProbeHandle<Epoch>,
    /// Epoch → partition → next offset, filled on worker 0.
    received: Rc<RefCell<BTreeMap<Epoch, Offsets>>>,
}

impl Positions {
    /// Builds the positions stream in `scope`, gathered on worker 0.
    pub fn build(scope: Scope<'_, Epoch>) -> Positions {
        let mut input = InputHandle::new();
        let received: Rc<RefCell<BTreeMap<Epoch, Offsets>>> = Rc::default();
        let sink = received.clone();
        let (probe, _) = input
            .to_stream(scope)
            .unary_frontier::<CapacityContainerBuilder<Vec<()>>, _, _, _>(
                Exchange::new(|_: &(i32, i64)| 0),
                "CollectPositions",
                move |_, _| {
                    move |(input, _), _| {
                        input.for_each(|cap, data| {
                            let Some(epoch) = cap.least().copied() else {
                                return;
                            };
                            let mut received = sink.borrow_mut();
                            let offsets = received.entry(epoch).or_default();
                            for (partition, next) in data.drain(..) {
                                let at = offsets.entry(partition).or_insert(next);
                                *at = (*at).max(next);
                            }
                        });
                    }
                },
            )
            .probe();
        Positions {
            input,
            probe,
            received,
        }
    }

    /// Ends the positions stream (with the source).
    pub fn close(&mut self) {
        // Dropping the connected handle closes it; the fresh one is never connected.
        drop(std::mem::replace(&mut self.input, InputHandle::new()));
    }
}

/// Worker 0's writer: turns completed epochs into checkpoints.
pub struct Checkpointer {
    store: CheckpointStore,
    source_id: String,
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
            workers,
            committed: start.resumed.clone(),
            // The checkpoint resumed from is already written.
            written: start.first_epoch.checked_sub(1),
            considered: None,
            last_content: None,
            seen: None,
            sink_positions,
        }
    }

    /// Writes a checkpoint for the newest epoch that is complete at the sink and whose
    /// positions have all arrived, if it is newer than the last one written.
    pub fn poll(
        &mut self,
        positions: &Positions,
        sink: &ProbeHandle<Epoch>,
        state: Option<&mut OperatorState>,
    ) -> DataflowResult<()> {
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
                None => return Ok(()),
            },
            (Some(a), None) | (None, Some(a)) => match a.checked_sub(1) {
                Some(t) => t,
                None => return Ok(()),
            },
            (None, None) => Epoch::MAX,
        };
        if self.transactional() {
            match self.cut(target)? {
                Some(cut) => target = cut,
                None => return Ok(()),
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
                return Ok(());
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
            return self.release();
        };
        if self
            .written
            .max(self.considered)
            .is_some_and(|w| w >= epoch)
            || self.committed.is_empty()
        {
            return self.release();
        }
        let last = target == Epoch::MAX;
        if !last && self.last_write.is_some_and(|t| t.elapsed() < self.interval) {
            return self.release();
        }
        let mut entries = BTreeMap::new();
        if let Some(at) = sink_position {
            entries.insert(SINK_POSITION.to_string(), at.to_string());
        }
        if let Some(g) = self.generation {
            entries.insert(SINK_GENERATION.to_string(), g.to_string());
        }
        if let Some(state) = state {
            state.fold_through(epoch);
            entries.extend(state.serialise()?);
        }
        self.considered = Some(epoch);
        // Epochs in which nothing moved (idle workers close empty ones) need no new checkpoint:
        // the last one already says the same.
        let content = (self.committed.clone(), entries);
        if self.last_content.as_ref() == Some(&content) {
            return self.release();
        }
        let checkpoint = Checkpoint {
            epoch,
            workers: self.workers,
            sources: BTreeMap::from([(self.source_id.clone(), content.0.clone())]),
            state: content.1.clone(),
        };
        self.store.write(&checkpoint)?;
        self.last_content = Some(content);
        self.written = Some(epoch);
        self.last_write = Some(Instant::now());
        // The checkpoint makes the epochs final; readers learn it from the commit markers (a
        // crash before they are written is covered: the next run writes them first).
        if let (Some(committer), Some(g)) = (self.committer.as_mut(), self.generation) {
            committer.source_offsets(&self.committed);
            committer.commit(g, epoch)?;
        }
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

/// Key of the results sink's position in a checkpoint's state.
pub const SINK_POSITION: &str = "sink.position";

/// Key of the generation that wrote a checkpoint.
pub const SINK_GENERATION: &str = "sink.generation";

/// Prefix of a stateful stage's entry in a checkpoint's state (`operator.<stage>`).
pub const OPERATOR_PREFIX: &str = "operator.";
