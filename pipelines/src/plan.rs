//! From a validated pipeline to the operator chain each worker runs.

use std::sync::Arc;
use std::time::Duration;

use riffle_dataflow::metrics::Metrics;
use riffle_dataflow::operators::{ApplyStage, BatchStream, ExchangeByKey, Rebalance};
use riffle_dataflow::{DataflowResult, Stage};
use riffle_operators::batching::{BatchPolicy, DynamicBatch};
use riffle_operators::decode::Decode;
use riffle_operators::detections::Detections;
use riffle_operators::filter::Filter;
use riffle_operators::model::Model;
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
        StageSpec::Exchange(_) => return Ok(None),
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

/// Appends the steps to `stream`.
pub fn build_chain<'scope>(
    mut stream: BatchStream<'scope>,
    steps: Vec<(String, Step)>,
    metrics: &Arc<Metrics>,
) -> DataflowResult<BatchStream<'scope>> {
    for (name, step) in steps {
        stream = match step {
            Step::Apply(stage) => stream.apply_stage(stage, metrics.stage(&name)?),
            Step::Batched(stage, policy) => {
                stream.dynamic_batch(stage, policy, metrics.stage(&name)?)
            }
            Step::Exchange(Some(key)) => stream.exchange_by_key(&key),
            Step::Exchange(None) => stream.rebalance(),
        };
    }
    Ok(stream)
}
