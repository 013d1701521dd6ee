//! Progress-driven checkpoints: when the sink's frontier passes an epoch on every worker, the
//! source positions up to that epoch are written to the checkpoint store; a run with a store
//! resumes from the newest intact checkpoint.
//!
//! Positions travel through the dataflow itself: every worker sends the next offset of each
//! partition it read in epoch `e` at time `e`, exchanged to worker 0. Once both that stream's
//! frontier and the sink's pass `e`, every result of epochs ≤ `e` is written and every position
//! of those epochs has arrived, so the checkpoint for `e` is safe to write.
//!
//! - `collect`: the positions and operator-state streams gathered on worker 0.
//! - `checkpointer`: worker 0's writer of checkpoints, and what a failing store does to it.

mod checkpointer;
mod collect;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use riffle_storage::Location;

use crate::checkpoint::lease::Lease;
use crate::checkpoint::writer::Writer;
use crate::checkpoint::{store_error, Checkpoint, CheckpointStore};
use crate::sink::Recovery;
use crate::state::SavedState;
use crate::{DataflowError, DataflowResult, Epoch, SourceFactory};

use super::chain::Restored;
use super::{CheckpointPolicy, CheckpointTarget, Job};

pub use checkpointer::{Checkpointer, SinkCommit};
pub use collect::{OperatorState, Positions};

/// Partition → next offset.
pub type Offsets = BTreeMap<i32, i64>;

/// Where a run starts: its source (moved to checkpointed offsets when resuming), its first
/// epoch, and the store to write to.
pub struct Start {
    pub source: Arc<dyn SourceFactory>,
    pub first_epoch: Epoch,
    pub store: Option<CheckpointStore>,
    /// An object store's writer thread, holding the lease (process 0 only); worker 0's
    /// checkpointer takes it. Dropped, it releases the lease.
    pub writer: Mutex<Option<Writer>>,
    /// Positions already covered by the checkpoint resumed from.
    pub resumed: Offsets,
    /// Where the results sink stood at that checkpoint.
    pub sink_position: Option<u64>,
    /// Stateful stages' checkpointed state, by stage name.
    pub restored: Restored,
    /// This run's generation, when it checkpoints (its output is then exactly-once): the
    /// start time in milliseconds, or one past the last run's when the clock is behind it
    /// ([`crate::checkpoint::generation`]), so a later run always has a larger one.
    pub generation: Option<u64>,
    /// The generation that wrote the checkpoint resumed from, and its epoch.
    pub previous: Option<(u64, Epoch)>,
}

fn clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Opens the checkpoints of `policy`: a local directory, or an object store's prefix.
pub fn open_store(policy: &CheckpointPolicy) -> DataflowResult<CheckpointStore> {
    match &policy.at {
        CheckpointTarget::Dir(dir) => CheckpointStore::open(dir, policy.keep),
        CheckpointTarget::Store { url, options } => {
            let at = Location::parse(url, options)
                .map_err(|e| store_error("opening the checkpoint store", e))?;
            Ok(CheckpointStore::on(at, policy.keep))
        }
    }
}

/// Opens the job's checkpoint store, if any, and resumes from its newest checkpoint — or, when
/// the sink is transactional, from the checkpoint its last committed transaction recorded.
/// `leader`: this process opens the sink (and, on an object store, holds the lease).
pub fn start(job: &Job, leader: bool) -> DataflowResult<Start> {
    let Some(config) = &job.checkpoint else {
        return Ok(Start {
            source: job.source.clone(),
            first_epoch: 0,
            store: None,
            writer: Mutex::new(None),
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
    let store = open_store(config)?;
    let now = clock_ms();
    // Before anything is read or removed: a second cluster on the same prefix stops here.
    let writer = match store.location() {
        Some(at) if leader => {
            let lease = Lease::acquire(at, now, config.lease_timeout)?;
            Some(Writer::spawn(store.clone(), Some(lease))?)
        }
        _ => None,
    };
    // Only the leader's generation is used (the sink and its committer are worker 0's).
    let generation = if leader {
        store.next_generation(now)?
    } else {
        now
    };
    let checkpoint = match job.sink.recover(leader)? {
        Recovery::Latest => {
            let latest = store.latest()?;
            // Unusable newer objects (torn, corrupt) would block this run's own checkpoints
            // of those epochs: objects are never overwritten.
            if leader && store.location().is_some() {
                let removed = store.discard_after(latest.as_ref().map(|c| c.epoch))?;
                if removed > 0 {
                    tracing::warn!(
                        "removed {removed} unusable checkpoint(s) newer than the one resumed                          from in {}",
                        store.describe()
                    );
                }
            }
            latest
        }
        Recovery::Committed(committed) => committed_checkpoint(&store, committed, leader)?,
    };
    let Some(checkpoint) = checkpoint else {
        tracing::info!(
            "no checkpoint to resume from in {}: starting from the source's start",
            store.describe()
        );
        return Ok(Start {
            source: job.source.clone(),
            first_epoch: 0,
            store: Some(store),
            writer: Mutex::new(writer),
            resumed: Offsets::new(),
            sink_position: None,
            restored: Restored::new(),
            generation: Some(generation),
            previous: None,
        });
    };
    if let Some(state) = checkpoint.state.get(SOURCE_STATE) {
        job.source.restore_state(state)?;
    }
    let offsets = checkpoint.sources.get(&id).cloned().unwrap_or_default();
    let resumed = job.source.resume(&offsets)?.ok_or_else(|| {
        DataflowError::Config(format!("source `{id}` cannot resume from offsets"))
    })?;
    tracing::info!(
        "resuming from checkpoint epoch {} in {} ({} partition offsets)",
        checkpoint.epoch,
        store.describe(),
        offsets.len()
    );
    Ok(Start {
        source: resumed,
        first_epoch: checkpoint.epoch + 1,
        store: Some(store),
        writer: Mutex::new(writer),
        resumed: offsets,
        sink_position: checkpoint
            .state
            .get(SINK_POSITION)
            .and_then(|p| p.parse().ok()),
        restored: restored_state(&checkpoint.state)?,
        generation: Some(generation),
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
            "the results sink's last commit recorded epoch {epoch} of run {generation}, but {} \
             holds no checkpoint of it: these checkpoints are not the ones that output was \
             written with (use those, or reset the sink's committed position to start the \
             output over: a new `transactional_id` for a topic, a new `position_key` or \
             `positions_table` for a key-value store or database; docs/sinks/)",
            store.describe()
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

/// Key of the results sink's position in a checkpoint's state.
pub const SINK_POSITION: &str = "sink.position";

/// Key of the source's own state in a checkpoint's state (its camera set).
pub const SOURCE_STATE: &str = "source.state";

/// Key of the generation that wrote a checkpoint.
pub const SINK_GENERATION: &str = "sink.generation";

/// Prefix of a stateful stage's entry in a checkpoint's state (`operator.<stage>`).
pub const OPERATOR_PREFIX: &str = "operator.";
