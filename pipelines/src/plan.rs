//! From a validated pipeline to the operator chain each worker runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use riffle_dataflow::metrics::Metrics;
use riffle_dataflow::operators::{ApplyStage, BatchStream, ExchangeByKey, Rebalance, StateUpdates};
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

use crate::spec::{RuntimeConfig, StageSpec};
use crate::validate::Pipeline;

/// One step of a worker's chain.
pub enum Step {
    /// A stage run batch by batch where the data is.
    Apply(Box<dyn Stage>),
    /// A stage run on dynamically merged batches (models).
    Batched(Box<dyn Stage>, BatchPolicy),
    /// Re-shard by a key column, or round-robin without one.
    Exchange(Option<String>),
    /// Stateful candidate generation (its own sharding and feature dataflow).
    Candidates(CandidatesConfig),
}

/// The stage a spec describes, or `None` for steps that are not stages (exchange).
pub fn build_stage(
    spec: &StageSpec,
    runtime: &RuntimeConfig,
) -> DataflowResult<Option<Box<dyn Stage>>> {
    Ok(Some(match spec {
        StageSpec::Decode(c) => Box::new(Decode::new(c.clone())),
        StageSpec::Resize(c) => Box::new(Resize::new(c.clone())?),
        StageSpec::Model(c) => Box::new(Model::new(c.clone(), runtime.intra_op_threads)?),
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

/// The steps one worker runs (each worker gets its own stage instances and model sessions).
pub fn worker_steps(pipeline: &Pipeline) -> DataflowResult<Vec<(String, Step)>> {
    let names = stage_names(pipeline);
    let mut steps = Vec::new();
    for (spanned, name) in pipeline.spec.stages.iter().zip(names) {
        let step = match (
            &spanned.value,
            build_stage(&spanned.value, &pipeline.runtime)?,
        ) {
            (StageSpec::Exchange(e), _) => Step::Exchange(e.key.clone()),
            (StageSpec::Candidates(c), _) => Step::Candidates(c.clone()),
            (StageSpec::Model(m), Some(stage)) => Step::Batched(
                stage,
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
    for (name, step) in steps {
        stream = match step {
            Step::Apply(stage) => stream.apply_stage(stage, metrics.stage(&name)?),
            Step::Batched(stage, policy) => {
                stream.dynamic_batch(stage, policy, metrics.stage(&name)?)
            }
            Step::Exchange(Some(key)) => stream.exchange_by_key(&key),
            Step::Exchange(None) => stream.rebalance(),
            Step::Candidates(config) => {
                let state = restored.get(&name).map_or(&[][..], Vec::as_slice);
                let (out, updates) =
                    stream.candidates_from(config, metrics.stage(&name)?, state, first_epoch);
                states.push((name, updates));
                out
            }
        };
    }
    Ok((stream, states))
}

/// Worker threads per process for `--workers auto`: the cores this process may use (an equal
/// share when several processes run on this host), divided by the ONNX Runtime threads each
/// worker's model runs with.
pub fn auto_workers(cores: usize, processes_on_host: usize, intra_op_threads: usize) -> usize {
    (cores / processes_on_host.max(1) / intra_op_threads.max(1)).max(1)
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
                "device {:?}, {}, batch ≤ {} rows / {} ms, {} ORT thread(s)",
                m.device,
                m.path
                    .file_name()
                    .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
                m.batch.max_size,
                m.batch.max_delay_ms,
                m.intra_op_threads.unwrap_or(runtime.intra_op_threads)
            ),
            StageSpec::Exchange(e) => match &e.key {
                Some(key) => format!("re-shard by `{key}`"),
                None => "rebalance round-robin".into(),
            },
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
