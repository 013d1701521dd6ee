//! One worker's loop: read what the source has ready (as far as the model can take it), put it
//! in the current epoch, close epochs, run the stages until the next read, park when there is
//! nothing to do, write checkpoints (worker 0) and beat the heart.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timely::dataflow::{InputHandle, ProbeHandle};

use super::chain::{balanced_model, build_chain, first_model, worker_steps, WorkerStep};
use super::checkpointing::{Checkpointer, OperatorState, Positions, SinkCommit, Start};
use super::epochs::{Epochs, Inputs, LocalPeers, IDLE_EPOCH};
use super::liveness::Liveness;
use super::pending::PendingStart;
use super::Job;
use crate::batch::now_ns;
use crate::credit::Credit;
use crate::dead_letter;
use crate::observe::registry::StageMetrics;
use crate::observe::RunContext;
use crate::operators::{SinkOptions, WriteToSink};
use crate::source::{Source, SourceBatch, Wake};
use crate::{Batch, Committer, DataflowError, Epoch};

/// How long a worker held back (no credit, or the sink too far behind) parks at most before it
/// looks again: what frees it may be a peer's progress, which wakes it, or a timer.
const HELD_PARK: Duration = Duration::from_millis(10);

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
    // Built first, and by every worker, so the dataflows match across the cluster.
    let mut liveness = Liveness::build(worker, job.peer_timeout, gate.workers, gate.pulses.clone());
    let steps = worker_steps(&job.steps, index, peers, job.slow_worker.as_ref())?;
    let Some(start) = wait_for_start(worker, start, &mut liveness)? else {
        return Ok(());
    };
    let start = &*start;
    super::agree::agree_on_start(worker, start.first_epoch, || liveness.tick())?;
    let (options, commit) = open_outputs(job, start, index, errors)?;
    let credit = first_model(&steps)
        .or_else(|| balanced_model(&steps))
        .map(|(_, limit)| Credit::new(limit));
    let built = build_dataflow(worker, start, steps, options, context, credit.clone())?;
    // Worker 0 writes the checkpoints.
    let checkpointer = match (&start.store, start.source.checkpoint_id()) {
        (Some(store), Some(id)) if index == 0 => {
            let every = |f: fn(&super::CheckpointPolicy) -> Duration| {
                job.checkpoint.as_ref().map_or(Duration::ZERO, f)
            };
            Some(Checkpointer::new(
                store.clone(),
                id,
                peers,
                start,
                commit,
                every(|c| c.interval),
                every(|c| c.give_up),
            ))
        }
        _ => None,
    };
    let mut source = start.source.partition(index, peers)?;
    let wake = Wake::current();
    let wakes = source.wake_with(wake.clone()).then_some(wake);
    gate.local.join();
    context.readiness.worker_ready();
    gate.ready.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    while gate.ready.load(std::sync::atomic::Ordering::SeqCst) < gate.workers && healthy(errors) {
        worker.step_or_park(Some(Duration::from_millis(1)));
        liveness.tick()?;
    }
    let released = *gate.released.get_or_init(Instant::now);
    // A source that feeds a model through credit stops reading whenever the model is full:
    // its epochs close then, and are numbered by the clock too, so that neither worker's
    // results wait for the other to count as many epochs.
    let timed = source.clocked() || credit.is_some();
    let epochs = Epochs::new(start.first_epoch, &job.epochs, timed, released);
    let mut reader = Reader {
        worker,
        inputs: built.inputs,
        probe: built.probe,
        state: built.state,
        checkpointer,
        liveness,
        errors,
        source,
        wakes,
        quiet_since: None,
        source_metrics: context.metrics.stage("source")?,
        context,
        epochs,
        credit,
        unfinished: VecDeque::new(),
        local: &gate.local,
    };
    reader.inputs.advance_to(start.first_epoch);
    reader.run()?;
    reader.finish(index, start)
}

/// Steps the (empty) dataflows until the run's start (restored state, first epoch) is made,
/// heartbeats going on meanwhile so that peers don't take a slow recovery for a dead process.
/// `None`: the run ended before it started (a stop request).
fn wait_for_start(
    worker: &mut timely::worker::Worker,
    start: &PendingStart,
    liveness: &mut Liveness,
) -> Result<Option<Arc<Start>>, DataflowError> {
    while !start.settled() {
        worker.step_or_park(Some(Duration::from_millis(1)));
        liveness.tick()?;
    }
    start.get()
}

/// The sink operator's outputs (worker 0 writes them all: the others get none) and what the
/// checkpointer commits with them.
fn open_outputs(
    job: &Job,
    start: &Start,
    index: usize,
    errors: &Arc<Mutex<Vec<DataflowError>>>,
) -> Result<(SinkOptions, SinkCommit), DataflowError> {
    let leader = index == 0;
    // After a restart the results sink continues from the checkpointed position.
    let results = match (leader, start.sink_position) {
        (false, _) => None,
        (true, Some(at)) => Some(job.sink.open_at(at)?),
        (true, None) => Some(job.sink.open()?),
    };
    let dead_letters = leader.then(|| job.dead_letter.open()).transpose()?;
    let live = match &job.live_sink {
        Some(factory) if leader => Some(factory.open()?),
        _ => None,
    };
    let events = match &job.events {
        Some(out) if leader => Some((out.spec.clone(), out.schema.clone(), out.sink.open()?)),
        _ => None,
    };
    let positions = results
        .as_ref()
        .and_then(|r| r.position())
        .map(|_| Rc::new(RefCell::new(BTreeMap::new())));
    let durable = results.as_ref().and_then(|r| r.durable());
    let committer = if leader { committer(job, start)? } else { None };
    let options = SinkOptions {
        results,
        dead_letters,
        latency_column: job.latency_column.clone(),
        positions: positions.clone(),
        generation: start.generation,
        errors: errors.clone(),
        live,
        events,
    };
    let commit = SinkCommit {
        positions,
        durable,
        committer,
    };
    Ok((options, commit))
}

/// Exactly-once into destinations that keep what a failed run wrote: first make final what
/// the checkpoint we resume from covers, then void the rest of older runs' output.
fn committer(job: &Job, start: &Start) -> Result<Option<Box<dyn Committer>>, DataflowError> {
    let Some(generation) = start.generation else {
        return Ok(None);
    };
    match job.sink.committer()? {
        // A transactional destination needs neither: what never committed is void.
        Some(c) if c.transactional() => Ok(Some(c)),
        Some(mut c) => {
            if let Some((g, through)) = start.previous {
                if let Some(at) = start.sink_position {
                    c.sink_position(at);
                }
                c.commit(g, through)?;
            }
            c.fence(generation)?;
            Ok(Some(c))
        }
        None => Ok(None),
    }
}

/// What [`build_dataflow`] gives the read loop.
struct Built {
    inputs: Inputs,
    probe: ProbeHandle<Epoch>,
    state: Option<OperatorState>,
}

fn build_dataflow(
    worker: &mut timely::worker::Worker,
    start: &Start,
    steps: Vec<(String, WorkerStep)>,
    options: SinkOptions,
    context: &RunContext,
    credit: Option<Credit>,
) -> Result<Built, DataflowError> {
    let mut batches = InputHandle::new();
    let mut positions: Option<Positions> = None;
    let mut state: Option<OperatorState> = None;
    let metrics = &context.metrics;
    let probe = worker.dataflow::<Epoch, _, _>(|scope| {
        positions = Some(Positions::build(scope));
        let stream = batches.to_stream(scope);
        let (stream, states) = build_chain(
            stream,
            steps,
            metrics,
            &start.restored,
            start.first_epoch,
            credit,
        )?;
        // Gathered only for checkpoints: without them nothing would ever fold the updates in,
        // and worker 0 would keep every one for the whole run. The same on every worker, as
        // timely needs (store and source are the job's).
        let checkpointed = start.store.is_some() && start.source.checkpoint_id().is_some();
        if !states.is_empty() && checkpointed {
            state = Some(OperatorState::build(scope, states));
        }
        Ok::<_, DataflowError>(stream.write_to_sink(options, context.clone()))
    })?;
    let positions = positions.ok_or_else(|| DataflowError::Cluster("dataflow not built".into()))?;
    Ok(Built {
        inputs: Inputs { batches, positions },
        probe,
        state,
    })
}

/// What one look at the source found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    /// Records or dead letters were sent (`retired`: keys were retired after them).
    Sent { retired: bool },
    /// Nothing ready now.
    Nothing,
    /// Nothing until then (a paced camera's next frame).
    NotBefore(Instant),
    /// Not read: the model has no room, or the sink is too far behind.
    Held,
    /// The input has ended.
    Ended,
}

/// The read loop's state.
struct Reader<'a> {
    worker: &'a mut timely::worker::Worker,
    inputs: Inputs,
    probe: ProbeHandle<Epoch>,
    state: Option<OperatorState>,
    checkpointer: Option<Checkpointer>,
    liveness: Liveness,
    errors: &'a Arc<Mutex<Vec<DataflowError>>>,
    source: Box<dyn Source>,
    /// The source wakes the worker when records arrive: it may park between reads.
    wakes: Option<Wake>,
    /// Since when a source that wakes the worker has had nothing: it is read again once it
    /// wakes the worker, or after an idle epoch (cameras added meanwhile).
    quiet_since: Option<Instant>,
    source_metrics: Arc<StageMetrics>,
    context: &'a RunContext,
    epochs: Epochs,
    credit: Option<Credit>,
    /// Rows sent per epoch not yet passed by the sink, oldest first (bounds the credit).
    unfinished: VecDeque<(Epoch, usize)>,
    local: &'a LocalPeers,
}

impl Reader<'_> {
    fn run(&mut self) -> Result<(), DataflowError> {
        loop {
            // A stop request (SIGTERM) ends the input here, as the end of a file would: what
            // was read completes its epochs, the last checkpoint covers it, and a restart goes
            // on from there.
            if super::stop_requested() {
                let index = self.worker.index();
                tracing::info!("worker {index}: stop requested, finishing the open epochs");
                return Ok(());
            }
            let read = if !self.may_read() {
                Read::Held
            } else if self.quiet() {
                Read::Nothing
            } else {
                self.read()?
            };
            if read == Read::Ended {
                return Ok(());
            }
            let more = matches!(read, Read::Sent { .. }) && self.may_read();
            if let Some(c) = &self.credit {
                c.set_more_coming(more);
            }
            self.close_epoch(read, more);
            self.run_stages(read, more)?;
            if !healthy(self.errors) {
                return Ok(());
            }
        }
    }

    /// The model has room (credit) and the sink is within `max_epochs_in_flight`.
    fn may_read(&mut self) -> bool {
        if let Some(c) = &self.credit {
            while let Some(&(epoch, _)) = self.unfinished.front() {
                if self.probe.less_equal(&epoch) {
                    break;
                }
                self.unfinished.pop_front();
            }
            c.bound(self.unfinished.iter().map(|(_, rows)| rows).sum());
            if !c.available() {
                return false;
            }
        }
        !self.epochs.behind(&self.probe)
    }

    /// A source that wakes the worker had nothing, and has not woken it since.
    fn quiet(&mut self) -> bool {
        let (Some(since), Some(wake)) = (self.quiet_since, &self.wakes) else {
            return false;
        };
        if wake.take() || since.elapsed() >= IDLE_EPOCH {
            self.quiet_since = None;
            return false;
        }
        true
    }

    fn read(&mut self) -> Result<Read, DataflowError> {
        let started = Instant::now();
        if let Some(at) = self.source.next_due().filter(|at| *at > started) {
            return Ok(Read::NotBefore(at));
        }
        let Some(batch) = self.source.next_batch()? else {
            return Ok(Read::Ended);
        };
        let rows = batch.records.num_rows();
        let read = rows + batch.rejected.len();
        let retired = self.source.retired().filter(|k| k.num_rows() > 0);
        if read == 0 && retired.is_none() {
            if self.wakes.is_some() {
                self.quiet_since = Some(Instant::now());
            }
            return Ok(Read::Nothing);
        }
        if let Some(live) = &self.context.live {
            live.source_batch(&batch.records);
        }
        let (rejected, took) = (batch.rejected.len(), started.elapsed());
        self.source_metrics.record_batch(rows, rows, rejected, took);
        self.send(batch)?;
        // The epoch closes after a retirement: rows of a key started again later (a camera id
        // added back) fall in a later epoch than the keyed stages' drop of its old state.
        if let Some(keys) = &retired {
            self.inputs
                .batches
                .send(Batch::retired(keys.clone(), now_ns()));
        }
        // Sent on now, not when the input handle's buffer fills or the epoch closes: results
        // then exist (live view, metrics, uncommitted outputs) as soon as the stages are done.
        self.inputs.batches.flush();
        Ok(Read::Sent {
            retired: retired.is_some(),
        })
    }

    /// Sends one read batch into the current epoch: its positions, records and dead letters.
    fn send(&mut self, batch: SourceBatch) -> Result<(), DataflowError> {
        self.epochs.stamp(&mut self.inputs);
        let epoch = self.epochs.current;
        let ingest = now_ns();
        for p in &batch.positions {
            self.inputs
                .positions
                .input
                .send((p.partition, p.last_offset + 1));
        }
        let rows = batch.records.num_rows();
        if rows > 0 {
            let mut records = Batch::records(batch.records, ingest);
            records.trace.queued_ns = batch.ready_ns.map_or(0, |r| ingest.saturating_sub(r));
            self.inputs.batches.send(records);
            if let Some(c) = &self.credit {
                c.sent(rows);
                self.unfinished.push_back((epoch, rows));
            }
            self.local.sent(epoch);
        }
        if !batch.rejected.is_empty() {
            let letters = dead_letter::to_batch(&batch.rejected)?;
            self.inputs
                .batches
                .send(Batch::dead_letters(letters, ingest));
        }
        self.epochs.add(rows + batch.rejected.len());
        Ok(())
    }

    /// Closes the epoch when its records should complete now; an idle worker moves its empty
    /// epoch along so that it holds back no one's results.
    fn close_epoch(&mut self, read: Read, more: bool) {
        let (empty, retired, due) = match read {
            Read::Sent { retired } => (false, retired, None),
            Read::Nothing => (true, false, None),
            Read::NotBefore(at) => (true, false, Some(at)),
            Read::Held | Read::Ended => (false, false, None),
        };
        if self.epochs.should_close(more, empty, retired) {
            // Numbered by when the next records are due (ms since the workers started), so
            // every worker's records due together share an epoch.
            self.epochs.close(&mut self.inputs, due);
        } else if self.epochs.is_empty() {
            let newest = self.local.newest();
            self.epochs
                .idle(&mut self.inputs, newest, due, read == Read::Held);
        }
    }

    /// Runs the stages: one step when the source is read again right after, else until the
    /// next thing to do (a message, a timer, the source's next record: each wakes the worker).
    /// Park rather than spin: on a small machine a spinning worker steals the core another
    /// worker's model is running on.
    fn run_stages(&mut self, read: Read, more: bool) -> Result<(), DataflowError> {
        let park = match read {
            _ if more => Duration::ZERO,
            Read::Sent { .. } | Read::Held => HELD_PARK,
            Read::NotBefore(at) => at.saturating_duration_since(Instant::now()).min(IDLE_EPOCH),
            // A source that cannot wake the worker waited in its read already.
            Read::Nothing if self.wakes.is_some() => IDLE_EPOCH,
            Read::Nothing | Read::Ended => Duration::ZERO,
        };
        self.worker.step_or_park(Some(park));
        self.liveness.tick()?;
        self.checkpoint()
    }

    fn checkpoint(&mut self) -> Result<(), DataflowError> {
        match &mut self.checkpointer {
            Some(c) => c.poll(&self.inputs.positions, &self.probe, self.state.as_mut()),
            None => Ok(()),
        }
    }

    /// The input has ended: closes it, steps until every result is written, and, on worker 0,
    /// until the last checkpoint is.
    fn finish(mut self, index: usize, start: &Start) -> Result<(), DataflowError> {
        if let Some(c) = &self.credit {
            c.set_more_coming(false);
        }
        self.inputs.close();
        // A failed worker (any process) stops everyone: the others would wait for it forever.
        let state_done = |s: &Option<OperatorState>| s.as_ref().is_none_or(|s| s.probe.done());
        while (!self.probe.done()
            || !self.inputs.positions.probe.done()
            || !state_done(&self.state))
            && healthy(self.errors)
        {
            self.worker.step_or_park(Some(HELD_PARK));
            self.liveness.tick()?;
            self.checkpoint()?;
        }
        // Only a run that wrote all its results may record that it got this far. A
        // transactional sink may need two commits here: the one sealed before the input ended,
        // then the rest (each poll does at most one). An object store's last checkpoint may
        // still be on its way, or failing: the run ends once it is written (or the store has
        // failed too long).
        let mut polls = 0;
        while healthy(self.errors)
            && (polls < 2 || self.checkpointer.as_ref().is_some_and(|c| c.busy()))
        {
            if polls >= 2 {
                // No heartbeat check here: peers that are done have stopped beating.
                self.worker.step_or_park(Some(Duration::from_millis(10)));
                self.liveness.pulse();
            }
            self.checkpoint()?;
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
        self.liveness.close();
        Ok(())
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
