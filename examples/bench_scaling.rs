//! Camera pipeline scaling (not a test): frames/s and end-to-end latency at 1 and 2 workers,
//! each against ONNX Runtime alone on the same model and threads (one 1-thread session per
//! worker), in interleaved rounds; the pipeline's speed-up from 1 to 2 workers against ORT
//! alone's. `scripts/bench-scaling.sh` publishes it.
//!
//!     cargo run --release --example bench_scaling [-- ROUNDS [PIPELINE.yaml]]

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::spread;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::Stage;
use riffle_pipelines::plan::build_stage;
use riffle_pipelines::spec::StageSpec;

fn main() -> anyhow::Result<()> {
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(3);
    let file = std::env::args()
        .nth(2)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo.join("pipelines/camera-perception.yaml"));
    let out = std::env::temp_dir().join(format!("bench-scaling-{}.jsonl", std::process::id()));
    let pipeline = Arc::new(riffle_pipelines::load(&file, Some(&out))?);
    let frames = pipeline.source.total_records().unwrap_or(0) as f64;

    // Model inputs prepared once, for ONNX Runtime alone.
    let model_at = pipeline
        .spec
        .stages
        .iter()
        .position(|s| matches!(s.value, StageSpec::Model(_)))
        .ok_or_else(|| anyhow::anyhow!("no model stage"))?;
    let mut pre: Vec<Box<dyn Stage>> = Vec::new();
    for s in &pipeline.spec.stages[..model_at] {
        pre.extend(build_stage(&s.value, &pipeline.runtime, 0)?);
    }
    let max_size = match &pipeline.spec.stages[model_at].value {
        StageSpec::Model(m) => m.batch.max_size,
        _ => 1,
    };
    let mut ready = Vec::new();
    let mut source = pipeline.source.partition(0, 1)?;
    while let Some(b) = source.next_batch()? {
        let mut batch = b.records;
        for stage in pre.iter_mut() {
            batch = stage.process_batch(&batch)?.records;
        }
        let mut offset = 0;
        while offset < batch.num_rows() {
            let n = max_size.min(batch.num_rows() - offset);
            ready.push(batch.slice(offset, n));
            offset += n;
        }
    }

    // Every variant once per round, rounds interleaved, so machine noise hits all alike.
    // Both clocks exclude start-up alike: the pipeline's runs from its first read to its last
    // result (model stages warm up when built), ORT alone's starts once its sessions exist.
    const WORKERS: [usize; 2] = [1, 2];
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); WORKERS.len()];
    for round in 0..rounds {
        for (i, &workers) in WORKERS.iter().enumerate() {
            let report = riffle_pipelines::run::execute(
                pipeline.clone(),
                &ClusterConfig::single_process(workers),
                Metrics::new()?,
            )?;
            let s = report.summary;
            if (s.results as f64) < frames {
                anyhow::bail!(
                    "{workers} worker(s): {} results for {frames} frames",
                    s.results
                );
            }
            let run = Run {
                pipeline: frames / s.busy.as_secs_f64(),
                ort: frames / ort_alone(&pipeline, model_at, workers, &ready)?,
                p50: s.end_to_end_p50.as_secs_f64() * 1000.0,
                p99: s.end_to_end_p99.as_secs_f64() * 1000.0,
            };
            eprintln!("round {round}, {workers} worker(s): {run:?}");
            runs[i].push(run);
        }
    }

    println!(
        "{rounds} interleaved round(s), median (min–max); ratios per round. {frames} frames, `{}`.",
        file.display()
    );
    println!();
    println!("| workers | pipeline frames/s | e2e p50 ms | e2e p99 ms | ONNX Runtime alone frames/s (W sessions × 1 thread) | pipeline ÷ ORT alone |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (workers, runs) in WORKERS.iter().zip(&runs) {
        let pick = |f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
        println!(
            "| {workers} | {} | {} | {} | {} | {} |",
            spread(&pick(|r| r.pipeline), 1),
            spread(&pick(|r| r.p50), 1),
            spread(&pick(|r| r.p99), 1),
            spread(&pick(|r| r.ort), 1),
            spread(&pick(|r| r.pipeline / r.ort), 2),
        );
    }
    // Scaling from 1 to 2 workers, per round, for each, and the pipeline's against ORT alone's.
    let (one, two) = (&runs[0], &runs[1]);
    let ratio = |f: fn(&Run) -> f64| -> Vec<f64> {
        one.iter().zip(two).map(|(a, b)| f(b) / f(a)).collect()
    };
    let pipeline_scaling = ratio(|r| r.pipeline);
    let ort_scaling = ratio(|r| r.ort);
    let relative: Vec<f64> = pipeline_scaling
        .iter()
        .zip(&ort_scaling)
        .map(|(p, o)| p / o)
        .collect();
    println!();
    println!("| 1 → 2 workers | speed-up | efficiency (speed-up ÷ 2) |");
    println!("|---|---:|---:|");
    for (name, values) in [
        ("pipeline", &pipeline_scaling),
        ("ONNX Runtime alone", &ort_scaling),
    ] {
        let half: Vec<f64> = values.iter().map(|v| v / 2.0).collect();
        println!("| {name} | {} | {} |", spread(values, 2), spread(&half, 2));
    }
    println!(
        "| pipeline's speed-up ÷ ORT alone's (target ≥ 0.95) | {} | |",
        spread(&relative, 2)
    );
    let _ = std::fs::remove_file(out);
    Ok(())
}

/// One round's figures at one worker count.
#[derive(Clone, Debug)]
struct Run {
    pipeline: f64,
    ort: f64,
    p50: f64,
    p99: f64,
}

/// Seconds for `workers` parallel sessions of 1 thread to run every prepared batch.
fn ort_alone(
    pipeline: &riffle_pipelines::Pipeline,
    model_at: usize,
    workers: usize,
    ready: &[arrow_array::RecordBatch],
) -> anyhow::Result<f64> {
    let spec = &pipeline.spec.stages[model_at].value;
    let mut models = Vec::new();
    for _ in 0..workers {
        models.extend(build_stage(spec, &pipeline.runtime, 0)?);
    }
    let started = Instant::now();
    // Each session's rows out, or its first error: a reference that fails is no reference.
    let rows = std::thread::scope(|scope| {
        let handles: Vec<_> = models
            .into_iter()
            .enumerate()
            .map(|(w, mut model)| {
                scope.spawn(move || -> anyhow::Result<usize> {
                    let mut rows = 0;
                    for batch in ready.iter().skip(w).step_by(workers) {
                        rows += model.process_batch(batch)?.records.num_rows();
                    }
                    Ok(rows)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("an ORT-alone thread panicked"))?
            })
            .sum::<anyhow::Result<usize>>()
    })?;
    let took = started.elapsed().as_secs_f64();
    let expected: usize = ready.iter().map(|b| b.num_rows()).sum();
    if rows != expected {
        anyhow::bail!("ONNX Runtime alone scored {rows} rows of {expected}");
    }
    Ok(took)
}
