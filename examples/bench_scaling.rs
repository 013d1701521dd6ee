//! Camera pipeline scaling (not a test): frames/s and end-to-end latency at 1 and 2 workers,
//! each against ONNX Runtime alone on the same model and threads, in one run.
//!
//!     cargo run --release --example bench_scaling [-- PIPELINE.yaml]

use std::sync::Arc;
use std::time::Instant;

use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::metrics::{fmt_duration, Metrics};
use riffle_dataflow::Stage;
use riffle_pipelines::plan::build_stage;
use riffle_pipelines::spec::StageSpec;

fn main() -> anyhow::Result<()> {
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let file = std::env::args()
        .nth(1)
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

    println!("| workers | pipeline frames/s | e2e p50 | e2e p99 | ORT alone frames/s (W sessions × 1 thread) | pipeline / ORT | scaling efficiency |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut base = 0.0;
    for workers in [1usize, 2] {
        let (mut best, mut summary) = (f64::MAX, None);
        for _ in 0..3 {
            let metrics = Metrics::new()?;
            let started = Instant::now();
            let report = riffle_pipelines::run(
                pipeline.clone(),
                riffle_pipelines::RunOptions {
                    cluster: ClusterConfig::single_process(workers),
                    metrics,
                },
            )?;
            let t = started.elapsed().as_secs_f64();
            if t < best {
                best = t;
                summary = Some(report.summary);
            }
        }
        let ort = ort_alone(&pipeline, model_at, workers, &ready)?;
        let rate = frames / best;
        if workers == 1 {
            base = rate;
        }
        let s = summary.ok_or_else(|| anyhow::anyhow!("no run"))?;
        println!(
            "| {workers} | {rate:.1} | {} | {} | {:.1} | {:.2} | {:.0} % |",
            fmt_duration(s.end_to_end_p50),
            fmt_duration(s.end_to_end_p99),
            frames / ort,
            rate / (frames / ort),
            100.0 * rate / (base * workers as f64)
        );
    }
    let _ = std::fs::remove_file(out);
    Ok(())
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
    std::thread::scope(|scope| {
        for (w, mut model) in models.into_iter().enumerate() {
            scope.spawn(move || {
                for batch in ready.iter().skip(w).step_by(workers) {
                    let _ = model.process_batch(batch);
                }
            });
        }
    });
    Ok(started.elapsed().as_secs_f64())
}
