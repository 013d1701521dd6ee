//! From a validated pipeline to the operator chain each worker runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use riffle_dataflow::metrics::Metrics;
use riffle_dataflow::operators::{
    ApplyStage, Balance, BatchStream, ExchangeByKey, Place, Rebalance, ServiceCell, StateUpdates,
};
use riffle_dataflow::{Compression, DataflowError};
use riffle_dataflow::{DataflowResult, Epoch, Stage};
use riffle_operators::batching::{BatchPolicy, DynamicBatch};
use riffle_operators::decode::Decode;
use riffle_operators::detections::Detections;
use riffle_operators::filter::Filter;
use riffle_operators::model::Model;
use riffle_operators::rank::Rank;
use riffle_operators::recs::{Candidates, CandidatesConfig};
use riffle_operators::resize::Resize;
use riffle_operators::select::Select;
use riffle_operators::topk::TopK;
use timely::dataflow::channels::pact::Pipeline as Local;
use timely::dataflow::operators::feedback::Handle;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::Operator;
use timely::dataflow::operators::{ConnectLoop, Feedback};

use crate::spec::{ExchangeConfig, RuntimeConfig, StageSpec, Workers};
use crate::validate::Pipeline;

/// One step of a worker's chain.
pub enum Step {
    /// A stage run batch by batch where the data is.
    Apply(Box<dyn Stage>),
    /// A stage run on dynamically merged batches (models).
    Batched(Box<dyn Stage>, BatchPolicy),
    /// Re-shard by a key column, deal round-robin to all workers, or place on some.
    Exchange(Route, Compression),
    /// A stage placed on other workers: batches never reach it here, so nothing is built.
    Elsewhere,
    /// Stateful candidate generation (its own sharding and feature dataflow).
    Candidates(CandidatesConfig),
}

/// Where an exchange sends rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Key(String),
    All,
    Workers(Vec<usize>),
    /// To the least delayed of these workers (empty: all), keeping a key's rows together.
    Balance(Vec<usize>, Option<String>),
}

/// The workers an exchange places the following stages on, if it does.
pub fn placed_on(
    exchange: &ExchangeConfig,
    runtime: &RuntimeConfig,
) -> DataflowResult<Option<Vec<usize>>> {
    Ok(match &exchange.workers {
        None => None,
        Some(Workers::List(list)) => Some(list.clone()),
        Some(Workers::Named(name)) => {
            Some(runtime.placement.get(name).cloned().ok_or_else(|| {
                DataflowError::Config(format!(
                    "no placement `{name}` in runtime.placement (it has: {})",
                    runtime
                        .placement
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?)
        }
    })
}

/// The stage a spec describes as `worker` builds it (GPU stages pick the worker's GPU), or
/// `None` for steps that are not stages (exchange).
pub fn build_stage(
    spec: &StageSpec,
    runtime: &RuntimeConfig,
    worker: usize,
) -> DataflowResult<Option<Box<dyn Stage>>> {
    Ok(Some(match spec {
        StageSpec::Decode(c) => Box::new(Decode::new(c.clone())),
        StageSpec::Resize(c) => {
            match riffle_gpu::resolve(&c.device, worker, &runtime.gpus)
                .map_err(DataflowError::Config)?
            {
                Some(gpu) => Box::new(Resize::on_gpu(c.clone(), gpu)?),
                None => Box::new(Resize::new(c.clone())?),
            }
        }
        StageSpec::Model(c) => Box::new(Model::for_worker(
            c.clone(),
            runtime.intra_op_threads,
            worker,
            &runtime.gpus,
        )?),
        StageSpec::Topk(c) => Box::new(TopK::new(c.clone())?),
        StageSpec::Detections(c) => Box::new(Detections::new(c.clone())?),
        StageSpec::Filter(c) => Box::new(Filter::new(c.clone())?),
        StageSpec::Select(c) => Box::new(Select::new(c.clone())?),
        StageSpec::Rank(c) => Box::new(Rank::new(c.clone())?),
        StageSpec::Exchange(_) | StageSpec::Candidates(_) => return Ok(None),
    }))
}

/// Metric names of the stages, unique within the pipeline (`filter`, `filter#3`, ...).
pub fn stage_names(pipeline: &Pipeline) -> Vec<String> {
    let kinds: Vec<&str> = pipeline
        .spec
        .stages
        .iter()
        .map(|s| s.value.kind())
        .collect();
    kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            if kinds.iter().filter(|o| *o == k).count() > 1 {
                format!("{k}#{i}")
            } else {
                k.to_string()
            }
        })
        .collect()
}

/// The steps worker `worker` (of `peers`) runs: its own stage instances and model sessions,
/// except for stages placed on other workers.
pub fn worker_steps(
    pipeline: &Pipeline,
    worker: usize,
    peers: usize,
) -> DataflowResult<Vec<(String, Step)>> {
    let names = stage_names(pipeline);
    let mut steps = Vec::new();
    let mut here = true;
    for (i, (spanned, name)) in pipeline.spec.stages.iter().zip(names).enumerate() {
        if let StageSpec::Exchange(e) = &spanned.value {
            let placed = placed_on(e, &pipeline.runtime)?;
            if let Some(missing) = placed.iter().flatten().find(|w| **w >= peers) {
                return Err(DataflowError::Config(format!(
                    "{}: stages[{i}].exchange.workers: worker {missing} does not exist (the cluster has {peers} worker(s), 0..{})",
                    pipeline.file.display(),
                    peers.saturating_sub(1)
                )));
            }
            here = placed.as_ref().is_none_or(|p| p.contains(&worker));
            let route = match (&e.key, placed) {
                (Some(key), _) => Route::Key(key.clone()),
                (None, placed) if e.balance => {
                    Route::Balance(placed.unwrap_or_default(), e.ordered_by.clone())
                }
                (None, Some(list)) => Route::Workers(list),
                (None, None) => Route::All,
            };
            steps.push((name, Step::Exchange(route, e.compression)));
            continue;
        }
        if !here {
            if matches!(spanned.value, StageSpec::Candidates(_)) {
                return Err(DataflowError::Config(format!(
                    "{}: stages[{i}].candidates shards clicks by user itself and cannot follow \
                     `exchange: {{ workers }}`",
                    pipeline.file.display()
                )));
            }
            steps.push((name, Step::Elsewhere));
            continue;
        }
        let step = match (
            &spanned.value,
            build_stage(&spanned.value, &pipeline.runtime, worker)?,
        ) {
            (StageSpec::Exchange(_), _) => continue,
            (StageSpec::Candidates(c), _) => Step::Candidates(c.clone()),
            (StageSpec::Model(m), Some(stage)) => Step::Batched(
                match &pipeline.runtime.slow_worker {
                    Some(slow) if slow.worker == worker => Box::new(Instrumented {
                        inner: stage,
                        delay: Duration::from_millis(slow.delay_ms),
                        service: None,
                    }),
                    _ => stage,
                },
                BatchPolicy {
                    max_size: m.batch.max_size,
                    max_delay: Duration::from_millis(m.batch.max_delay_ms),
                    late_after: m.batch.late_after_ms.map(Duration::from_millis),
                    drop_late: m.batch.drop_late,
                },
            ),
            (_, Some(stage)) => Step::Apply(stage),
            (_, None) => continue,
        };
        steps.push((name, step));
    }
    Ok(steps)
}

/// The open end of a balanced exchange's feedback loop of load reports.
type LoadLoop<'scope> = Handle<'scope, Epoch, Vec<(usize, f64, u64)>>;

/// Checkpointed operator state by stage name: the records and their counts.
pub type Restored = BTreeMap<String, Vec<(String, isize)>>;

/// Appends the steps to `stream`. Stateful stages start from `restored` (before
/// `first_epoch`) and report the updates of their state, by stage name, to checkpoint.
pub fn build_chain<'scope>(
    mut stream: BatchStream<'scope>,
    steps: Vec<(String, Step)>,
    metrics: &Arc<Metrics>,
    restored: &Restored,
    first_epoch: Epoch,
) -> DataflowResult<(BatchStream<'scope>, Vec<(String, StateUpdates<'scope>)>)> {
    let mut states = Vec::new();
    // A balanced exchange learns each worker's delay from the end of the stages after it.
    let mut feedback: Option<(LoadLoop<'scope>, ServiceCell)> = None;
    for (name, mut step) in steps {
        if matches!(step, Step::Exchange(..)) {
            if let Some((handle, service)) = feedback.take() {
                stream.clone().report_delays(service).connect_loop(handle);
            }
        }
        // Stages after a balanced exchange time their work for its load reports.
        if let Some((_, service)) = &feedback {
            step = match step {
                Step::Apply(stage) => Step::Apply(Instrumented::timed(stage, service)),
                Step::Batched(stage, policy) => {
                    Step::Batched(Instrumented::timed(stage, service), policy)
                }
                other => other,
            };
        }
        stream = match step {
            Step::Apply(stage) => stream.apply_stage(stage, metrics.stage(&name)?),
            Step::Batched(stage, policy) => {
                stream.dynamic_batch(stage, policy, metrics.stage(&name)?)
            }
            Step::Exchange(route, compression) => {
                // Encoded only if a batch crosses to another process; decoded on arrival.
                let stream = if compression == Compression::None {
                    stream
                } else {
                    stream.map_in_place(move |b| b.compression = compression)
                };
                let moved = match route {
                    Route::Key(key) => stream.exchange_by_key(&key),
                    Route::All => stream.rebalance(),
                    Route::Workers(list) => stream.place(&list),
                    Route::Balance(list, ordered_by) => {
                        let (handle, reports) = stream.scope().feedback(1);
                        let service = ServiceCell::default();
                        feedback = Some((handle, service.clone()));
                        stream.balance(&list, ordered_by, reports, service)
                    }
                };
                if compression == Compression::None {
                    moved
                } else {
                    moved.map_in_place(|b| b.compression = Compression::None)
                }
            }
            // Every worker must build the same operators (timely numbers channels in build
            // order), so a stage placed elsewhere is an idle pass-through here.
            Step::Elsewhere => stream.unary(Local, "Elsewhere", |_, _| {
                |input, output| {
                    input.for_each(|cap, data| output.session(&cap).give_container(data));
                }
            }),
            Step::Candidates(config) => {
                let state = restored.get(&name).map_or(&[][..], Vec::as_slice);
                let (out, updates) =
                    stream.candidates_from(config, metrics.stage(&name)?, state, first_epoch);
                states.push((name, updates));
                out
            }
        };
    }
    if let Some((handle, service)) = feedback {
        stream.clone().report_delays(service).connect_loop(handle);
    }
    Ok((stream, states))
}

/// A stage with instrumentation around it: a fixed delay per batch (`runtime.slow_worker`, a
/// stand-in for a worker on a loaded or slower machine) and/or its busy time added to its
/// worker's load (for balanced exchanges).
struct Instrumented {
    inner: Box<dyn Stage>,
    delay: Duration,
    service: Option<ServiceCell>,
}

impl Instrumented {
    fn timed(inner: Box<dyn Stage>, service: &ServiceCell) -> Box<dyn Stage> {
        Box::new(Instrumented {
            inner,
            delay: Duration::ZERO,
            service: Some(service.clone()),
        })
    }
}

impl Stage for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn output_schema(
        &self,
        input: &arrow_schema::SchemaRef,
    ) -> DataflowResult<arrow_schema::SchemaRef> {
        self.inner.output_schema(input)
    }

    fn preserves_rows(&self) -> bool {
        self.inner.preserves_rows()
    }

    fn process_batch(
        &mut self,
        batch: &arrow_array::RecordBatch,
    ) -> DataflowResult<riffle_dataflow::StageOutput> {
        let started = std::time::Instant::now();
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let out = self.inner.process_batch(batch);
        if let Some(service) = &self.service {
            let mut s = riffle_dataflow::operators::service(service);
            s.busy_ns += started.elapsed().as_nanos() as u64;
            s.busy_rows += batch.num_rows() as u64;
        }
        out
    }
}

/// Worker threads per process for `--workers auto`: the cores this process may use (an equal
/// share when several processes run on this host), divided by the ONNX Runtime threads each
/// worker's model runs with; and at least one worker per GPU of this process's share when the
/// pipeline's models may run on GPUs (`gpus`: the GPUs found, 0 otherwise), so that worker i
/// drives GPU i mod n.
pub fn auto_workers(
    cores: usize,
    processes_on_host: usize,
    intra_op_threads: usize,
    gpus: usize,
) -> usize {
    let processes = processes_on_host.max(1);
    let cpu = cores / processes / intra_op_threads.max(1);
    let gpu = gpus.div_ceil(processes);
    cpu.max(gpu).max(1)
}

/// Whether any model or resize stage may run on a GPU (`device: auto` or `cuda:N`).
pub fn uses_gpus(pipeline: &Pipeline) -> bool {
    use riffle_operators::model::DeviceSpec as Device;
    pipeline.spec.stages.iter().any(|s| match &s.value {
        StageSpec::Model(m) => m.device != Device::Cpu,
        StageSpec::Resize(r) => r.device != Device::Cpu,
        _ => false,
    })
}

/// A human-readable plan: where each stage runs, with what threads and batches.
pub fn describe(pipeline: &Pipeline, threads: usize, processes: usize) -> String {
    let mut out = String::new();
    let runtime = &pipeline.runtime;
    out.push_str(&format!(
        "pipeline: {} ({})\n",
        pipeline.name(),
        pipeline.file.display()
    ));
    out.push_str(&format!(
        "workers: {threads} per process × {processes} process(es) = {} worker(s), {} ONNX Runtime thread(s) each\n",
        threads * processes,
        runtime.intra_op_threads
    ));
    let total = pipeline
        .source
        .total_records()
        .map_or("unknown".into(), |n| n.to_string());
    out.push_str(&format!(
        "source: {total} records, partitioned across all workers\n"
    ));
    out.push_str(&format!(
        "epochs: {} records per source worker, at most {} in flight\n",
        runtime.epoch_records, runtime.max_epochs_in_flight
    ));
    out.push_str("stages:\n");
    for (i, (stage, name)) in pipeline
        .spec
        .stages
        .iter()
        .zip(stage_names(pipeline))
        .enumerate()
    {
        let detail = match &stage.value {
            StageSpec::Model(m) => format!(
                "{}, {}, batch ≤ {} rows / {} ms, {} ORT thread(s)",
                match riffle_operators::model::planned_engine(m, 0, &runtime.gpus) {
                    Ok(engine) => format!("runs on {engine} (worker 0)"),
                    Err(e) => format!("cannot run here: {e}"),
                },
                m.path
                    .file_name()
                    .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
                m.batch.max_size,
                m.batch.max_delay_ms,
                m.intra_op_threads.unwrap_or(runtime.intra_op_threads)
            ),
            StageSpec::Exchange(e) => {
                let route = match (&e.key, placed_on(e, runtime).ok().flatten()) {
                    (Some(key), _) => format!("re-shard by `{key}`"),
                    (None, placed) if e.balance => format!(
                        "balance by measured delay over worker(s) {}{}",
                        placed.map_or("all".into(), |l| format!("{l:?}")),
                        e.ordered_by
                            .as_ref()
                            .map_or(String::new(), |k| format!(", `{k}` kept in order"))
                    ),
                    (None, Some(list)) => format!("place the next stages on worker(s) {list:?}"),
                    (None, None) => "rebalance round-robin".into(),
                };
                match e.compression {
                    Compression::None => route,
                    c => format!("{route}, {c:?} between processes"),
                }
            }
            StageSpec::Candidates(c) => format!(
                "clicks sharded by `{}`; popularity window {}, seen window {}; ≤ {} candidates per click",
                c.user,
                c.window.map_or("unbounded".into(), |w| w.to_string()),
                c.seen_window.map_or("unbounded".into(), |w| w.to_string()),
                c.max_candidates
            ),
            _ => "on the worker holding the batch".into(),
        };
        out.push_str(&format!("  {i} {name:<12} {detail}\n"));
    }
    out.push_str("sink: worker 0 (results and dead letters)\n");
    if let Some(c) = &runtime.checkpoint {
        out.push_str(&format!(
            "checkpoints: {} (keep {})\n",
            c.dir.display(),
            c.keep
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::auto_workers;

    #[test]
    fn auto_workers_share_cores_and_cover_gpus() {
        assert_eq!(auto_workers(16, 1, 1, 0), 16);
        assert_eq!(auto_workers(16, 2, 2, 0), 4);
        assert_eq!(auto_workers(2, 4, 1, 0), 1);
        // 8 GPUs on a 4-core host: one worker per GPU.
        assert_eq!(auto_workers(4, 1, 1, 8), 8);
        // Split over 3 processes: each drives its share, rounded up.
        assert_eq!(auto_workers(3, 3, 1, 8), 3);
    }
}
