//! Executing a validated pipeline on timely workers.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use riffle_dataflow::batch::now_ns;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::dead_letter;
use riffle_dataflow::metrics::{Metrics, Summary};
use riffle_dataflow::operators::{SinkOptions, WriteToSink};
use riffle_dataflow::{Batch, DataflowError, Epoch};
use timely::dataflow::InputHandle;

use crate::checkpointing::{self, Checkpointer, OperatorState, Positions, SinkCommit, Start};
use crate::liveness::Liveness;
use crate::plan::{build_chain, worker_steps};
use crate::validate::Pipeline;

/// How to run: where the workers are, and the metrics to fill.
#[derive(Clone)]
pub struct RunOptions {
    pub cluster: ClusterConfig,
    pub metrics: Arc<Metrics>,
}

/// What a run did (this process's view).
#[derive(Debug)]
pub struct RunReport {
    pub summary: Summary,
    pub workers: usize,
}

/// Runs the pipeline to the end of its sources. Worker errors (a sink that cannot write, a
/// source that fails) end the run and are returned; bad records never do: they go to the
/// dead-letter sink.
pub fn run(pipeline: Arc<Pipeline>, options: RunOptions) -> Result<RunReport, DataflowError> {
    let started = Instant::now();
    let metrics = options.metrics.clone();
    // Registered up front so the summary lists stages in pipeline order.
    metrics.stage("source")?;
    for (name, spec) in crate::plan::stage_names(&pipeline)
        .iter()
        .zip(&pipeline.spec.stages)
    {
        // Exchanges only move rows; they have no per-batch work to report.
        if !matches!(spec.value, crate::spec::StageSpec::Exchange(_)) {
            metrics.stage(name)?;
        }
    }
    metrics.stage("sink")?;
    metrics.stage("dead-letters")?;
    pipeline.source.attach_metrics(&metrics)?;
    pipeline.sink.attach_metrics(&metrics)?;
    pipeline.dead_letter.attach_metrics(&metrics)?;
    let start = Arc::new(checkpointing::start(&pipeline)?);
    let (builders, communication) = options.cluster.build().map_err(DataflowError::Cluster)?;
    let errors: Arc<Mutex<Vec<DataflowError>>> = Arc::default();
    let worker_errors = errors.clone();
    let worker_pipeline = pipeline.clone();
    let guards = timely::execute::execute_from(
        builders,
        communication,
        timely::WorkerConfig::default(),
        move |worker| {
            let result = run_worker(worker, &worker_pipeline, &start, &metrics, &worker_errors);
            if let Err(e) = result {
                tracing::error!(worker = worker.index(), "{e}");
                if let Ok(mut errs) = worker_errors.lock() {
                    errs.push(e);
                }
            }
            // After a failure the dataflows can never complete (a peer stopped feeding them);
            // timely would wait for them forever, so drop them.
            if !healthy(&worker_errors) {
                for id in worker.installed_dataflows() {
                    worker.drop_dataflow(id);
                }
            }
        },
    )
    .map_err(DataflowError::Cluster)?;
    // A lost peer makes timely's network threads panic, its workers follow, and joining the
    // network threads panics in turn: all of it is one error here.
    // (The panic payloads say nothing more: the network thread's message was logged.)
    let lost = || {
        DataflowError::Cluster(
            "lost the connection to another process of the cluster (it exited, or its host is \
             unreachable)"
                .into(),
        )
    };
    let outcomes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guards.join()))
        .map_err(|_| lost())?;
    for outcome in outcomes {
        outcome.map_err(|e| DataflowError::Cluster(format!("a worker thread panicked: {e}")))?;
    }
    let mut errors = errors
        .lock()
        .map_err(|_| DataflowError::Cluster("a worker panicked".into()))?;
    if let Some(e) = errors.drain(..).next() {
        return Err(e);
    }
    Ok(RunReport {
        summary: options.metrics.summary(started.elapsed()),
        workers: options.cluster.total_workers(),
    })
}

fn run_worker(
    worker: &mut timely::worker::Worker,
    pipeline: &Pipeline,
    start: &Start,
    metrics: &Arc<Metrics>,
    errors: &Arc<Mutex<Vec<DataflowError>>>,
) -> Result<(), DataflowError> {
    let index = worker.index();
    let peers = worker.peers();
    // Built first, and by every worker, so the dataflows match across the cluster.
    let mut liveness = Liveness::build(
        worker,
        Duration::from_millis(pipeline.runtime.peer_timeout_ms),
    );
    let steps = worker_steps(pipeline, index, peers)?;
    // Only worker 0 writes: the sink operator routes every batch there. After a restart the
    // results sink continues from the checkpointed position.
    let (results, dead) = if index == 0 {
        let results = match start.sink_position {
            Some(at) => pipeline.sink.open_at(at)?,
            None => pipeline.sink.open()?,
        };
        (Some(results), Some(pipeline.dead_letter.open()?))
    } else {
        (None, None)
    };
    let sink_positions = results
        .as_ref()
        .and_then(|r| r.position())
        .map(|_| Rc::new(RefCell::new(BTreeMap::new())));
    let durable = results.as_ref().and_then(|r| r.durable());
    // Exactly-once into destinations that keep what a failed run wrote: first make final what
    // the checkpoint we resume from covers, then void the rest of older runs' output.
    let committer = match (index, start.generation) {
        (0, Some(generation)) => match pipeline.sink.committer()? {
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
        latency_column: pipeline.runtime.latency_column.clone(),
        positions: sink_positions.clone(),
        generation: start.generation,
        errors: errors.clone(),
    };
    let mut positions: Option<Positions> = None;
    let mut state: Option<OperatorState> = None;
    let probe = worker.dataflow::<Epoch, _, _>(|scope| {
        positions = Some(Positions::build(scope));
        let stream = input.to_stream(scope);
        let (stream, states) =
            build_chain(stream, steps, metrics, &start.restored, start.first_epoch)?;
        if !states.is_empty() {
            state = Some(OperatorState::build(scope, states));
        }
        Ok::<_, DataflowError>(stream.write_to_sink(options, metrics.clone()))
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
            pipeline
                .runtime
                .checkpoint
                .as_ref()
                .map_or(Duration::ZERO, |c| Duration::from_millis(c.interval_ms)),
        )),
        _ => None,
    };
    let source_metrics = metrics.stage("source")?;
    let mut source = start.source.partition(index, peers)?;
    let epoch_records = pipeline.runtime.epoch_records;
    let in_flight = pipeline.runtime.max_epochs_in_flight;
    let mut epoch: Epoch = start.first_epoch;
    input.advance_to(epoch);
    positions.input.advance_to(epoch);
    let mut records_in_epoch = 0;
    loop {
        let read_started = Instant::now();
        let Some(batch) = source.next_batch()? else {
            break;
        };
        let rows = batch.records.num_rows();
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
        let read = rows + batch.rejected.len();
        records_in_epoch += read;
        // An epoch closes when full, or when the source goes idle (an empty read from a
        // stream), so results of a quiet stream still complete and get flushed.
        if records_in_epoch >= epoch_records || (read == 0 && records_in_epoch > 0) {
            records_in_epoch = 0;
            epoch += 1;
            input.advance_to(epoch);
            positions.input.advance_to(epoch);
            // Flow control: wait while the sink is more than `in_flight` epochs behind.
            // Park rather than spin: on a small machine a spinning worker steals the core
            // another worker's model is running on. Messages and timers unpark it.
            while probe.less_than(&epoch.saturating_sub(in_flight)) && healthy(errors) {
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
    // Only a run that wrote all its results may record that it got this far.
    if healthy(errors) {
        checkpoint(&mut checkpointer, &positions, &probe, state.as_mut())?;
    }
    liveness.close();
    Ok(())
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

/// No worker of this process has failed.
fn healthy(errors: &Arc<Mutex<Vec<DataflowError>>>) -> bool {
    errors.lock().map(|e| e.is_empty()).unwrap_or(false)
}
