//! One worker's loop: read a batch, put it in the current epoch, close epochs, wait for the
//! sink when too far ahead (flow control), write checkpoints (worker 0) and beat the heart.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timely::dataflow::InputHandle;

use super::chain::{build_chain, worker_steps};
use super::checkpointing::{Checkpointer, OperatorState, Positions, SinkCommit};
use super::liveness::Liveness;
use super::pending::PendingStart;
use super::Job;
use crate::batch::now_ns;
use crate::dead_letter;
use crate::observe::RunContext;
use crate::operators::{SinkOptions, WriteToSink};
use crate::{Batch, DataflowError, Epoch};

/// How often a worker with nothing to read closes an empty epoch.
const IDLE_EPOCH: Duration = Duration::from_millis(100);

pub(crate) fn run_worker(
    worker: &mut timely::worker::Worker,
    job: &Job,
    start: &PendingStart,
    context: &RunContext,
    errors: &Arc<Mutex<Vec<DataflowError>>>,
    gate: &super::StartGate,
) -> Result<(), DataflowError> {
    let index = worker.index();
    let peers = worker.peers();
    let metrics = &context.metrics;
    // Built first, and by every worker, so the dataflows match across the cluster.
    let mut liveness = Liveness::build(worker, job.peer_timeout, gate.workers, gate.pulses.clone());
    let steps = worker_steps(&job.steps, index, peers, job.slow_worker.as_ref())?;
    // Stages (models) are loaded: now the restored state and first epoch are needed. Heartbeats
    // go on meanwhile, so that peers don't take a slow recovery here for a dead process.
    while !start.settled() {
        worker.step_or_park(Some(Duration::from_millis(1)));
        liveness.tick()?;
    }
    let Some(start) = start.get()? else {
        return Ok(());
    };
    let start = &*start;
    // Only worker 0 writes: the sink operator routes every batch there. After a restart the
    // results sink continues from the checkpointed position.
    let (results, dead) = if index == 0 {
        let results = match start.sink_position {
            Some(at) => job.sink.open_at(at)?,
            None => job.sink.open()?,
        };
        (Some(results), Some(job.dead_letter.open()?))
    } else {
        (None, None)
    };
    let live = match (&job.live_sink, index) {
        (Some(factory), 0) => Some(factory.open()?),
        _ => None,
    };
    let events = match (&job.events, index) {
        (Some(out), 0) => Some((out.spec.clone(), out.schema.clone(), out.sink.open()?)),
        _ => None,
    };
    let sink_positions = results
        .as_ref()
        .and_then(|r| r.position())
        .map(|_| Rc::new(RefCell::new(BTreeMap::new())));
    let durable = results.as_ref().and_then(|r| r.durable());
    // Exactly-once into destinations that keep what a failed run wrote: first make final what
    // the checkpoint we resume from covers, then void the rest of older runs' output.
    let committer = match (index, start.generation) {
        (0, Some(generation)) => match job.sink.committer()? {
            // A transactional destination needs neither: what never committed is void.
            Some(c) if c.transactional() => Some(c),
            Some(mut c) => {
                if let Some((g, through)) = start.previous {
                    c.commit(g, through)?;
                }
                c.fence(generation)?;
                Some(c)
            }
            None => None,
        },
        _ => None,
    };
    let mut input: InputHandle<Epoch, timely::container::CapacityContainerBuilder<Vec<Batch>>> =
        InputHandle::new();
    let options = SinkOptions {
        results,
        dead_letters: dead,
        latency_column: job.latency_column.clone(),
        positions: sink_positions.clone(),
        generation: start.generation,
        errors: errors.clone(),
        live,
        events,
    };
    let mut positions: Option<Positions> = None;
    let mut state: Option<OperatorState> = None;
    let probe = worker.dataflow::<Epoch, _, _>(|scope| {
        positions = Some(Positions::build(scope));
        let stream = input.to_stream(scope);
        let (stream, states) =
            build_chain(stream, steps, metrics, &start.restored, start.first_epoch)?;
        // Gathered only for checkpoints: without them nothing would ever fold the updates in,
        // and worker 0 would keep every one for the whole run. The same on every worker, as
        // timely needs (store and source are the job's).
        let checkpointed = start.store.is_some() && start.source.checkpoint_id().is_some();
        if !states.is_empty() && checkpointed {
            state = Some(OperatorState::build(scope, states));
        }
        Ok::<_, DataflowError>(stream.write_to_sink(options, context.clone()))
    })?;

    let mut positions =
        positions.ok_or_else(|| DataflowError::Cluster("dataflow not built".into()))?;
    // Worker 0 writes the checkpoints.
    let mut checkpointer = match (&start.store, start.source.checkpoint_id()) {
        (Some(store), Some(id)) if index == 0 => Some(Checkpointer::new(
            store.clone(),
            id,
            peers,
            start,
            SinkCommit {
                positions: sink_positions,
                durable,
                committer,
            },
            job.checkpoint
                .as_ref()
                .map_or(Duration::ZERO, |c| c.interval),
            job.checkpoint
                .as_ref()
                .map_or(Duration::ZERO, |c| c.give_up),
        )),
        _ => None,
    };
    let source_metrics = metrics.stage("source")?;
    let mut source = start.source.partition(index, peers)?;
    context.readiness.worker_ready();
    gate.ready.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    while gate.ready.load(std::sync::atomic::Ordering::SeqCst) < gate.workers && healthy(errors) {
        worker.step_or_park(Some(Duration::from_millis(1)));
        liveness.tick()?;
    }
    let released = *gate.released.get_or_init(Instant::now);
    let epoch_records = job.epochs.records;
    let max_duration = job.epochs.max_duration;
    let in_flight = job.epochs.max_in_flight;
    let mut epoch: Epoch = start.first_epoch;
    input.advance_to(epoch);
    positions.input.advance_to(epoch);
    // The epochs this worker opened, newest last (flow control counts epochs, whatever their
    // numbers: clocked epochs are numbered in ms).
    let mut opened = Opened::new(epoch, in_flight);
    // ms since the workers started, after the first epoch: a clocked epoch's number.
    let slot = |at: Instant| {
        let ms = at.saturating_duration_since(released).as_millis();
        start
            .first_epoch
            .saturating_add(Epoch::try_from(ms).unwrap_or(Epoch::MAX))
    };
    let mut records_in_epoch = 0;
    let mut last_epoch = Instant::now();
    loop {
        // A stop request (SIGTERM) ends the input here, as the end of a file would: what was
        // read completes its epochs, the last checkpoint covers it, and a restart goes on
        // from there.
        if super::stop_requested() {
            tracing::info!("worker {index}: stop requested, finishing the open epochs");
            break;
        }
        let read_started = Instant::now();
        // A source with nothing due yet: the stages run (and park) until it has, and the wait
        // counts as an empty read, so the epoch closes and its results complete meanwhile.
        if let Some((at, wait)) = source
            .next_due()
            .and_then(|at| Some((at, at.checked_duration_since(read_started)?)))
            .filter(|(_, wait)| !wait.is_zero())
        {
            if records_in_epoch > 0 {
                records_in_epoch = 0;
                last_epoch = Instant::now();
                // Numbered by when the next records are due (ms since the workers started),
                // so every worker's records due together share an epoch: counting epochs per
                // worker would drift apart (a worker that fell behind reads two frames in one
                // epoch), and each epoch completes only when every worker has passed it.
                epoch = (epoch + 1).max(slot(at));
                input.advance_to(epoch);
                positions.input.advance_to(epoch);
                opened.open(epoch);
            }
            worker.step_or_park(Some(wait));
            liveness.tick()?;
            checkpoint(&mut checkpointer, &positions, &probe, state.as_mut())?;
            if !healthy(errors) {
                break;
            }
            continue;
        }
        let Some(batch) = source.next_batch()? else {
            break;
        };
        let rows = batch.records.num_rows();
        if let Some(live) = &context.live {
            live.sample_frames(&batch.records);
        }
        source_metrics.record_batch(rows, rows, batch.rejected.len(), read_started.elapsed());
        let ingest = now_ns();
        for p in &batch.positions {
            positions.input.send((p.partition, p.last_offset + 1));
        }
        if rows > 0 {
            input.send(Batch::records(batch.records, ingest));
        }
        if !batch.rejected.is_empty() {
            input.send(Batch::dead_letters(
                dead_letter::to_batch(&batch.rejected)?,
                ingest,
            ));
        }
        // The epoch closes after a retirement: rows of a key started again later (a camera
        // id added back) fall in a later epoch than the keyed stages' drop of its old state.
        let retired = match source.retired().filter(|k| k.num_rows() > 0) {
            Some(keys) => {
                input.send(Batch::retired(keys, ingest));
                true
            }
            None => false,
        };
        // Sent on now, not when the input handle's buffer fills or the epoch closes: results
        // then exist (live view, metrics, uncommitted outputs) as soon as the stages are done.
        input.flush();
        let read = rows + batch.rejected.len();
        records_in_epoch += read;
        // An epoch closes when full, or when the source goes idle (an empty read from a
        // stream), so results of a quiet stream still complete and get flushed. A worker with
        // nothing to read (its cameras down, its partitions quiet) still closes empty epochs
        // now and then: its open epoch would otherwise hold back every other worker's.
        let idle = read == 0 && records_in_epoch == 0 && last_epoch.elapsed() >= IDLE_EPOCH;
        // With `epoch_ms`, an epoch also closes once it has been open that long: results wait
        // for their epoch, so this bounds the wait however slowly records come.
        let due = records_in_epoch > 0 && max_duration.is_some_and(|d| last_epoch.elapsed() >= d);
        if records_in_epoch >= epoch_records
            || (read == 0 && records_in_epoch > 0)
            || idle
            || due
            || retired
        {
            records_in_epoch = 0;
            last_epoch = Instant::now();
            epoch = if source.clocked() {
                (epoch + 1).max(slot(last_epoch))
            } else {
                epoch + 1
            };
            input.advance_to(epoch);
            positions.input.advance_to(epoch);
            opened.open(epoch);
            // Flow control: wait while the sink is more than `in_flight` epochs behind, i.e.
            // has not passed the epoch opened `in_flight` epochs before this one.
            let behind = opened.oldest();
            // Park rather than spin: on a small machine a spinning worker steals the core
            // another worker's model is running on. Messages and timers unpark it.
            while behind.is_some_and(|b| probe.less_than(&b)) && healthy(errors) {
                worker.step_or_park(Some(Duration::from_millis(1)));
                checkpoint(&mut checkpointer, &positions, &probe, state.as_mut())?;
                liveness.tick()?;
            }
        }
        worker.step();
        liveness.tick()?;
        checkpoint(&mut checkpointer, &positions, &probe, state.as_mut())?;
        if !healthy(errors) {
            break;
        }
    }
    input.close();
    positions.close();
    // A failed worker (any process) stops everyone: the others would wait for it forever.
    let state_done = |s: &Option<OperatorState>| s.as_ref().is_none_or(|s| s.probe.done());
    while (!probe.done() || !positions.probe.done() || !state_done(&state)) && healthy(errors) {
        worker.step_or_park(Some(Duration::from_millis(1)));
        liveness.tick()?;
        checkpoint(&mut checkpointer, &positions, &probe, state.as_mut())?;
    }
    // Only a run that wrote all its results may record that it got this far. A transactional
    // sink may need two commits here: the one sealed before the input ended, then the rest
    // (each poll does at most one). An object store's last checkpoint may still be on its
    // way, or failing: the run ends once it is written (or the store has failed too long).
    let mut polls = 0;
    while healthy(errors) && (polls < 2 || checkpointer.as_ref().is_some_and(|c| c.busy())) {
        if polls >= 2 {
            // No heartbeat check here: peers that are done have stopped beating.
            worker.step_or_park(Some(Duration::from_millis(10)));
            liveness.pulse();
        }
        checkpoint(&mut checkpointer, &positions, &probe, state.as_mut())?;
        polls += 1;
    }
    if let Some(store) = start.store.as_ref().filter(|_| index == 0) {
        if let Some(t) = store.write_times() {
            tracing::info!(
                "checkpoint writes to {}: {}, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                store.describe(),
                t.count,
                t.p50.as_secs_f64() * 1e3,
                t.p99.as_secs_f64() * 1e3,
                t.max.as_secs_f64() * 1e3
            );
        }
    }
    liveness.close();
    Ok(())
}

/// The last `in_flight + 1` epochs a worker opened, oldest first.
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

fn checkpoint(
    checkpointer: &mut Option<Checkpointer>,
    positions: &Positions,
    sink: &timely::dataflow::ProbeHandle<Epoch>,
    state: Option<&mut OperatorState>,
) -> Result<(), DataflowError> {
    match checkpointer {
        Some(c) => c.poll(positions, sink, state),
        None => Ok(()),
    }
}

/// Steps `worker`'s dataflows until they complete, or drops them once any worker of this
/// process has failed (they can never complete then: a peer stopped feeding them). timely
/// would step them itself after the worker's closure, but parked without a timeout: a worker
/// done before a peer failed would wait there forever, and the run with it.
pub(crate) fn wind_down(
    worker: &mut timely::worker::Worker,
    errors: &Arc<Mutex<Vec<DataflowError>>>,
    gate: &super::StartGate,
) {
    let local = worker.index() % gate.workers.max(1);
    while worker.has_dataflows() {
        if !healthy(errors) {
            for id in worker.installed_dataflows() {
                worker.drop_dataflow(id);
            }
            break;
        }
        gate.pulses.beat(local);
        worker.step_or_park(Some(Duration::from_millis(10)));
    }
}

/// No worker of this process has failed.
pub(crate) fn healthy(errors: &Arc<Mutex<Vec<DataflowError>>>) -> bool {
    errors.lock().map(|e| e.is_empty()).unwrap_or(false)
}
