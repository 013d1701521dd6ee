//! Progress-driven checkpoints: when the sink's frontier passes an epoch on every worker, the
//! source positions up to that epoch are written to the checkpoint store; a run with a store
//! resumes from the newest intact checkpoint.
//!
//! Positions travel through the dataflow itself: every worker sends the next offset of each
//! partition it read in epoch `e` at time `e`, exchanged to worker 0. Once both that stream's
//! frontier and the sink's pass `e`, every result of epochs ≤ `e` is written and every position
//! of those epochs has arrived, so the checkpoint for `e` is safe to write.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use riffle_dataflow::checkpoint::{Checkpoint, CheckpointStore};
use riffle_dataflow::{DataflowError, DataflowResult, Epoch, SourceFactory};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::{Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle, Scope};

use crate::validate::Pipeline;

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
}

/// Opens the pipeline's checkpoint store, if any, and resumes from its newest checkpoint.
pub fn start(pipeline: &Pipeline) -> DataflowResult<Start> {
    let Some(config) = &pipeline.runtime.checkpoint else {
        return Ok(Start {
            source: pipeline.source.clone(),
            first_epoch: 0,
            store: None,
            resumed: Offsets::new(),
            sink_position: None,
        });
    };
    let Some(id) = pipeline.source.checkpoint_id() else {
        return Err(DataflowError::Config(format!(
            "{}: runtime.checkpoint needs a source that can resume from offsets (kafka)",
            pipeline.file.display()
        )));
    };
    let store = CheckpointStore::open(&config.dir, config.keep)?;
    let Some(checkpoint) = store.latest()? else {
        tracing::info!(
            "no checkpoint in {}: starting from the source's start",
            config.dir.display()
        );
        return Ok(Start {
            source: pipeline.source.clone(),
            first_epoch: 0,
            store: Some(store),
            resumed: Offsets::new(),
            sink_position: None,
        });
    };
    let offsets = checkpoint.sources.get(&id).cloned().unwrap_or_default();
    let resumed = pipeline
        .spec
        .source
        .value
        .resumed(&offsets)
        .ok_or_else(|| {
            DataflowError::Config(format!("source `{id}` cannot resume from offsets"))
        })?;
    tracing::info!(
        "resuming from checkpoint epoch {} in {} ({} partition offsets)",
        checkpoint.epoch,
        config.dir.display(),
        offsets.len()
    );
    Ok(Start {
        source: Arc::from(resumed.build()?),
        first_epoch: checkpoint.epoch + 1,
        store: Some(store),
        resumed: offsets,
        sink_position: checkpoint
            .state
            .get(SINK_POSITION)
            .and_then(|p| p.parse().ok()),
    })
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
    /// Highest epoch any position was received for (the last one, once everything is done).
    seen: Option<Epoch>,
    /// The results sink's position after each completed epoch, when the sink has one: a
    /// checkpoint is only written for an epoch whose exact sink position is known.
    sink_positions: Option<Rc<RefCell<BTreeMap<Epoch, u64>>>>,
}

impl Checkpointer {
    pub fn new(
        store: CheckpointStore,
        source_id: String,
        workers: usize,
        start: &Start,
        sink_positions: Option<Rc<RefCell<BTreeMap<Epoch, u64>>>>,
    ) -> Self {
        Checkpointer {
            store,
            source_id,
            workers,
            committed: start.resumed.clone(),
            // The checkpoint resumed from is already written.
            written: start.first_epoch.checked_sub(1),
            seen: None,
            sink_positions,
        }
    }

    /// Writes a checkpoint for the newest epoch that is complete at the sink and whose
    /// positions have all arrived, if it is newer than the last one written.
    pub fn poll(&mut self, positions: &Positions, sink: &ProbeHandle<Epoch>) -> DataflowResult<()> {
        let frontier = |p: &ProbeHandle<Epoch>| p.with_frontier(|f| f.first().copied());
        // Epochs strictly below both frontiers are complete (no frontier: everything is).
        let mut target = match (frontier(&positions.probe), frontier(sink)) {
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
        let mut sink_position = None;
        if let Some(sink_positions) = &self.sink_positions {
            let known = sink_positions.borrow();
            let Some((&epoch, &at)) = known.range(..=target).next_back() else {
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
        let Some(epoch) = epoch else { return Ok(()) };
        if self.written.is_some_and(|w| w >= epoch) || self.committed.is_empty() {
            return Ok(());
        }
        let mut state = BTreeMap::new();
        if let Some(at) = sink_position {
            state.insert(SINK_POSITION.to_string(), at.to_string());
        }
        let checkpoint = Checkpoint {
            epoch,
            workers: self.workers,
            sources: BTreeMap::from([(self.source_id.clone(), self.committed.clone())]),
            state,
        };
        self.store.write(&checkpoint)?;
        self.written = Some(epoch);
        Ok(())
    }
}

/// Key of the results sink's position in a checkpoint's state.
pub const SINK_POSITION: &str = "sink.position";
