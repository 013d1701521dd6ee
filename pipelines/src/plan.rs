//! From a validated pipeline to the runtime's [`Job`], and the plan `riffle plan` prints.

use std::sync::Arc;
use std::time::Duration;

use riffle_dataflow::runtime::{
    BuildStep, CheckpointPolicy, EpochPolicy, Job, JobStep, Route, SlowWorker, Step, StepKind,
};
use riffle_dataflow::{DataflowError, DataflowResult, Stage};
use riffle_operators::StageContext;

use crate::spec::{ExchangeConfig, RuntimeConfig, StageSpec};
use crate::validate::Pipeline;

/// The job the runtime runs for `pipeline`.
pub fn job(pipeline: &Pipeline) -> DataflowResult<Job> {
    let runtime = &pipeline.runtime;
    let mut steps = Vec::new();
    for (i, (spanned, name)) in pipeline
        .spec
        .stages
        .iter()
        .zip(stage_names(pipeline))
        .enumerate()
    {
        let at = format!(
            "{}: stages[{i}].{}",
            pipeline.file.display(),
            spanned.value.kind()
        );
        let kind = match &spanned.value {
            StageSpec::Exchange(e) => StepKind::Exchange(route(e, runtime)?, e.compression),
            other => StepKind::Stage(Arc::new(WorkerBuild {
                spec: other.clone(),
                intra_op_threads: runtime.intra_op_threads,
                gpus: runtime.gpus.clone(),
            })),
        };
        steps.push(JobStep { name, at, kind });
    }
    Ok(Job {
        name: pipeline.name(),
        source: pipeline.source.clone(),
        steps,
        sink: pipeline.sink.clone(),
        dead_letter: pipeline.dead_letter.clone(),
        live_sink: pipeline.live_sink.clone(),
        events: pipeline.events.clone(),
        epochs: EpochPolicy {
            records: runtime.epoch_records,
            max_duration: runtime.epoch_ms.map(Duration::from_millis),
            max_in_flight: runtime.max_epochs_in_flight,
        },
        checkpoint: runtime.checkpoint.as_ref().map(|c| CheckpointPolicy {
            keep: c.keep,
            interval: Duration::from_millis(c.interval_ms),
            give_up: Duration::from_secs(c.give_up_s),
            lease_timeout: Duration::from_secs(c.lease_s),
            ..match (&c.dir, &c.url) {
                (None, Some(url)) => CheckpointPolicy::store(url, c.store_options()),
                (dir, _) => CheckpointPolicy::dir(dir.clone().unwrap_or_default()),
            }
        }),
        latency_column: runtime.latency_column.clone(),
        peer_timeout: Duration::from_millis(runtime.peer_timeout_ms),
        slow_worker: runtime.slow_worker.as_ref().map(|s| SlowWorker {
            worker: s.worker,
            delay: Duration::from_millis(s.delay_ms),
        }),
    })
}

/// A stage's per-worker build: its configuration and the process-wide settings it reads.
struct WorkerBuild {
    spec: StageSpec,
    intra_op_threads: usize,
    gpus: Vec<usize>,
}

impl BuildStep for WorkerBuild {
    fn build(&self, worker: usize, peers: usize) -> DataflowResult<Step> {
        let stage = self
            .spec
            .stage()
            .ok_or_else(|| DataflowError::Config("an exchange is not built per worker".into()))?;
        stage.build(&StageContext {
            worker,
            peers,
            intra_op_threads: self.intra_op_threads,
            gpus: &self.gpus,
        })
    }
}

/// Where an exchange sends rows ([`ExchangeConfig::route`]).
pub fn route(exchange: &ExchangeConfig, runtime: &RuntimeConfig) -> DataflowResult<Route> {
    exchange
        .route(&runtime.placement)
        .map_err(|(key, message)| DataflowError::Config(message).at(key))
}

/// The stage a spec describes as `worker` builds it, or `None` for steps that are not
/// batch-by-batch stages (exchanges, stateful operators). For benchmarks that run stages
/// outside the dataflow.
pub fn build_stage(
    spec: &StageSpec,
    runtime: &RuntimeConfig,
    worker: usize,
) -> DataflowResult<Option<Box<dyn Stage>>> {
    let ctx = StageContext {
        worker,
        peers: 1,
        intra_op_threads: runtime.intra_op_threads,
        gpus: &runtime.gpus,
    };
    let step = match spec.stage() {
        Some(stage) => stage.build_alone(&ctx)?,
        None => return Ok(None),
    };
    Ok(match step {
        Step::Apply(stage) | Step::Batched(stage, _) => Some(stage),
        Step::Stateful(_) => None,
    })
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

/// Whether any stage may run on a GPU (`device: auto` or `cuda:N`).
pub fn uses_gpus(pipeline: &Pipeline) -> bool {
    pipeline
        .spec
        .stages
        .iter()
        .filter_map(|s| s.value.stage())
        .any(|s| s.may_use_gpu())
}

/// A human-readable plan: where each stage runs, with what threads and batches (secret
/// `${VAR}` values shown as `${VAR}`).
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
    if let Some(note) = pipeline.spec.source.value.kind().plan_note() {
        out.push_str(&format!("  {note}\n"));
    }
    out.push_str(&format!(
        "epochs: {} records per source worker, at most {} in flight\n",
        runtime.epoch_records, runtime.max_epochs_in_flight
    ));
    out.push_str("stages:\n");
    let context = StageContext {
        worker: 0,
        peers: threads * processes,
        intra_op_threads: runtime.intra_op_threads,
        gpus: &runtime.gpus,
    };
    for (i, (stage, name)) in pipeline
        .spec
        .stages
        .iter()
        .zip(stage_names(pipeline))
        .enumerate()
    {
        let detail = match (&stage.value, stage.value.stage()) {
            (StageSpec::Exchange(e), _) => e.describe(&runtime.placement),
            (_, Some(kind)) => {
                let mut detail = kind.describe(&context);
                if let Some(b) = kind.batching() {
                    detail.push_str(&format!(
                        ", batch ≤ {} rows / {} ms",
                        b.max_size,
                        b.max_delay.as_millis()
                    ));
                }
                detail
            }
            (_, None) => String::new(),
        };
        out.push_str(&format!("  {i} {name:<12} {detail}\n"));
    }
    out.push_str("sink: worker 0 (results and dead letters)\n");
    if let Some(c) = &runtime.checkpoint {
        out.push_str(&format!(
            "checkpoints: {} (keep {})\n",
            c.describe(),
            c.keep
        ));
    }
    pipeline.redactions.redact(&out)
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
