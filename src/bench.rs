//! `riffle bench`: the pipeline against a straight-line loop and ONNX Runtime alone, in one run.
//!
//! (a) the pipeline as `riffle run` runs it (W workers × `intra_op_threads`);
//! (b) one thread looping over the same stage code: read, pre-process, model with the same batch
//!     size and W × `intra_op_threads` ONNX Runtime threads, post-process;
//! (c) only the model calls of (b), on tensors prepared beforehand: the compute limit.
//! (d) ONNX Runtime alone as the pipeline deploys it: one session per worker, in parallel;
//! (e) the sum of the parts: each stage but the model at its cost alone on one core (from (b)),
//!     plus the model at (d)'s rate, spread over the pipeline's cores: what a perfect pipeline of
//!     these stages would reach.
//! a/b is the framework's overhead (or gain, when workers overlap decode and inference); a/e how
//! close it comes to its own stages' limit. (a) and (b) must write the same results in every
//! round, else the a/b ratio reads "outputs differ".

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use arrow_array::RecordBatch;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::Stage;
use riffle_pipelines::plan::build_stage;
use riffle_pipelines::spec::RuntimeConfig;
use riffle_pipelines::Pipeline;

use crate::cli::BenchArgs;

pub fn bench_command(args: BenchArgs) -> Result<()> {
    let out_dir = tempfile_dir()?;
    let output = out_dir.join("bench-results.jsonl");
    let pipeline = Arc::new(riffle_pipelines::load(&args.file, Some(&output))?);
    let workers = args.workers.unwrap_or(pipeline.runtime.workers);
    let threads = workers * pipeline.runtime.intra_op_threads;
    // The model is the stage that merges batches.
    let (model_at, max_size) = pipeline
        .spec
        .stages
        .iter()
        .enumerate()
        .find_map(|(i, s)| Some((i, s.value.stage()?.batching()?.max_size)))
        .context("bench needs a pipeline with a `model` stage")?;
    // Every stage must run outside the dataflow too: found before any round, not after one.
    stages(&pipeline, 0..pipeline.spec.stages.len(), threads)?;
    let records = count_records(&pipeline)?;
    println!(
        "bench {}: {records} records, pipeline {workers} worker(s) × {} ORT thread(s); loop and ORT-alone 1 session × {threads} thread(s); model batch {max_size}; {} interleaved round(s), median (min–max)",
        args.file.display(),
        pipeline.runtime.intra_op_threads,
        args.repeats.max(1)
    );

    let mut rounds: Vec<Round> = Vec::new();
    for _ in 0..args.repeats.max(1) {
        // Interleaved so that machine noise hits every variant alike. Every variant's clock
        // starts after its sessions exist and have run once: the pipeline's from its first
        // record read (model stages warm up when built) to its last result written.
        let report = riffle_pipelines::run::execute(
            pipeline.clone(),
            &ClusterConfig::single_process(workers),
            Metrics::new()?,
        )?;
        if report.summary.results == 0 {
            bail!("the pipeline wrote no results for {records} records");
        }
        let line = straight_line(&pipeline, model_at, max_size, threads)?;
        let latency = pipeline.runtime.latency_column.as_deref();
        let written = std::fs::read(&output)
            .with_context(|| format!("reading the pipeline's results {}", output.display()))?;
        let same_outputs = canonical_lines(&written, latency)? == line.results;
        if !same_outputs {
            eprintln!("bench: the pipeline's results and the straight loop's differ");
        }
        let sessions = parallel_sessions(&pipeline, model_at, workers, &line.ready)?;
        rounds.push(Round {
            same_outputs,
            pipeline: report.summary.busy,
            straight: line.total,
            model_only: line.model_only,
            other: line.other,
            sessions,
            latency: (report.summary.end_to_end_p50, report.summary.end_to_end_p99),
            breakdown: report.summary.breakdown,
        });
    }
    let per_s = |d: Duration| records as f64 / d.as_secs_f64().max(f64::MIN_POSITIVE);
    // The sum of the parts: every stage but the model at its cost on one core, plus the model
    // at its rate as deployed (parallel sessions), spread over the pipeline's cores.
    let cores = threads.max(workers) as f64;
    let limit = |r: &Round| {
        let other = r.other.as_secs_f64() / records as f64;
        1.0 / (other / cores + 1.0 / per_s(r.sessions))
    };
    let column = |f: &dyn Fn(&Round) -> f64| rounds.iter().map(f).collect::<Vec<f64>>();
    let a = column(&|r| per_s(r.pipeline));
    println!();
    println!("| variant | records/s | pipeline ÷ this |");
    println!("|---|---:|---:|");
    let row = |name: String, v: Vec<f64>| {
        let ratio: Vec<f64> = a.iter().zip(&v).map(|(a, v)| a / v).collect();
        println!("| {name} | {} | {} |", spread(&v, 1), spread(&ratio, 2));
    };
    // No ratio between two runs that did not write the same results.
    let differ = rounds.iter().any(|r| !r.same_outputs);
    let per_worker = pipeline.runtime.intra_op_threads;
    row(
        format!("(a) riffle pipeline, {workers} worker(s) × {per_worker} thread(s)"),
        a.clone(),
    );
    let straight = column(&|r| per_s(r.straight));
    if differ {
        println!(
            "| (b) straight-line loop over the same stages | {} | outputs differ |",
            spread(&straight, 1)
        );
    } else {
        row(
            "(b) straight-line loop over the same stages".into(),
            straight,
        );
    }
    row(
        format!("(c) ONNX Runtime alone, ready tensors, 1 session × {threads} thread(s)"),
        column(&|r| per_s(r.model_only)),
    );
    row(
        format!("(d) ONNX Runtime alone, ready tensors, {workers} parallel session(s) × {per_worker} thread(s)"),
        column(&|r| per_s(r.sessions)),
    );
    row(
        format!("(e) sum of the parts: stages other than the model on one core each, (d) for the model, over {cores} cores"),
        column(&limit),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!();
    println!(
        "pipeline latency, read → written: p50 {} ms, p99 {} ms",
        spread(&column(&|r| ms(r.latency.0)), 1),
        spread(&column(&|r| ms(r.latency.1)), 1)
    );
    if let Some(b) = rounds.last().and_then(|r| r.breakdown) {
        println!("{b} (last round)");
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    Ok(())
}

/// One round's times for the whole input.
struct Round {
    /// Whether the pipeline's results equal the straight loop's.
    same_outputs: bool,
    pipeline: Duration,
    straight: Duration,
    model_only: Duration,
    /// The straight loop's time outside its model calls (source, pre- and post-processing).
    other: Duration,
    sessions: Duration,
    /// The pipeline's read → written p50 and p99.
    latency: (Duration, Duration),
    breakdown: Option<riffle_dataflow::observe::summary::Breakdown>,
}

/// `median (min–max)` with `digits` decimals.
fn spread(values: &[f64], digits: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(min), Some(max)) => {
            let median = v[v.len() / 2];
            format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
        }
        _ => "-".into(),
    }
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("riffle-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn count_records(pipeline: &Pipeline) -> Result<u64> {
    if let Some(n) = pipeline.source.total_records() {
        return Ok(n);
    }
    let mut source = pipeline.source.partition(0, 1)?;
    let mut n = 0;
    while let Some(b) = source.next_batch()? {
        n += b.records.num_rows() as u64;
    }
    Ok(n)
}

fn stages(
    pipeline: &Pipeline,
    range: std::ops::Range<usize>,
    threads: usize,
) -> Result<Vec<Box<dyn Stage>>> {
    let runtime = RuntimeConfig {
        intra_op_threads: threads,
        ..pipeline.runtime.clone()
    };
    let mut out = Vec::new();
    for (at, spec) in pipeline
        .spec
        .stages
        .iter()
        .enumerate()
        .skip(range.start)
        .take(range.len())
    {
        let mut spec = spec.value.clone();
        // One engine with all the threads, whatever the file says per worker.
        if let Some(stage) = spec.stage_mut() {
            stage.set_intra_op_threads(threads);
        }
        match build_stage(&spec, &runtime, 0)? {
            Some(stage) => out.push(stage),
            // A stage that only runs as a dataflow operator (state of its own): the loop
            // would skip it and compare different work.
            None if spec.stage().is_some() => bail!(
                "{}: stages[{at}] (`{}`) keeps state inside the dataflow, so bench's straight \
                 loop cannot run it on its own; bench compares pipelines whose stages run batch \
                 by batch (docs/benchmarks.md). Time this one with `riffle run` (its summary \
                 says where the time goes) or a side-by-side script (scripts/bench-cameras.sh \
                 for trackers, scripts/bench-recs.sh for recommendations)",
                pipeline.file.display(),
                spec.kind()
            ),
            // Exchanges: one thread needs none.
            None => {}
        }
    }
    Ok(out)
}

fn apply(stages: &mut [Box<dyn Stage>], mut batch: RecordBatch) -> Result<RecordBatch> {
    for stage in stages.iter_mut() {
        batch = stage.process_batch(&batch)?.records;
    }
    Ok(batch)
}

/// The straight loop's times.
struct Line {
    total: Duration,
    /// Its time outside the model calls.
    other: Duration,
    /// The model calls again, alone on the prepared tensors (`ready`).
    model_only: Duration,
    ready: Vec<RecordBatch>,
    /// Its results as [`canonical_lines`] of the JSON lines the pipeline's sink would write.
    results: Vec<String>,
}

/// JSON lines as sorted canonical lines, the runtime's latency column (which the straight loop
/// does not add) left out: workers write in any order.
fn canonical_lines(text: &[u8], latency: Option<&str>) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let mut value: serde_json::Value =
            serde_json::from_slice(line).context("a result line that is not JSON")?;
        if let (Some(object), Some(column)) = (value.as_object_mut(), latency) {
            object.remove(column);
        }
        lines.push(value.to_string());
    }
    lines.sort_unstable();
    Ok(lines)
}

fn straight_line(
    pipeline: &Pipeline,
    model_at: usize,
    max_size: usize,
    threads: usize,
) -> Result<Line> {
    let n = pipeline.spec.stages.len();
    let mut pre = stages(pipeline, 0..model_at, threads)?;
    let mut model = stages(pipeline, model_at..model_at + 1, threads)?;
    let mut post = stages(pipeline, model_at + 1..n, threads)?;
    if model.len() != 1 {
        bail!("expected one model stage");
    }

    let started = Instant::now();
    let mut source = pipeline.source.partition(0, 1)?;
    let mut pending: Vec<RecordBatch> = Vec::new();
    let mut pending_rows = 0;
    let mut ready = Vec::new();
    let mut in_model = Duration::ZERO;
    let mut results = Vec::new();
    let mut flush = |pending: &mut Vec<RecordBatch>, ready: &mut Vec<RecordBatch>| -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let merged = arrow_select_concat(pending)?;
        pending.clear();
        ready.push(merged.clone());
        let call = Instant::now();
        let out = apply(&mut model, merged)?;
        in_model += call.elapsed();
        results.push(apply(&mut post, out)?);
        Ok(())
    };
    while let Some(batch) = source.next_batch()? {
        let batch = apply(&mut pre, batch.records)?;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let take = (max_size - pending_rows).min(batch.num_rows() - offset);
            pending.push(batch.slice(offset, take));
            pending_rows += take;
            offset += take;
            if pending_rows == max_size {
                flush(&mut pending, &mut ready)?;
                pending_rows = 0;
            }
        }
    }
    flush(&mut pending, &mut ready)?;
    let total = started.elapsed();
    let other = total.saturating_sub(in_model);

    let started = Instant::now();
    for batch in &ready {
        apply(&mut model, batch.clone())?;
    }
    let model_only = started.elapsed();
    // Encoded as the pipeline's JSON-lines sink encodes, after the clock.
    let mut sink = riffle_connectors::JsonLinesSink::new(Vec::new(), "the straight loop's results");
    for batch in &results {
        riffle_dataflow::sink::Sink::write_batch(&mut sink, batch)?;
    }
    let results = canonical_lines(&sink.into_inner(), None)?;
    Ok(Line {
        total,
        other,
        model_only,
        ready,
        results,
    })
}

/// ONNX Runtime alone as the pipeline deploys it: one session per worker with the pipeline's
/// threads each, the prepared batches dealt round-robin, all sessions running in parallel.
fn parallel_sessions(
    pipeline: &Pipeline,
    model_at: usize,
    workers: usize,
    ready: &[RecordBatch],
) -> Result<Duration> {
    let per_worker = pipeline.runtime.intra_op_threads;
    let mut sessions = Vec::new();
    for _ in 0..workers {
        sessions.push(stages(pipeline, model_at..model_at + 1, per_worker)?);
    }
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(w, mut model)| {
                scope.spawn(move || -> Result<()> {
                    for batch in ready.iter().skip(w).step_by(workers) {
                        apply(&mut model, batch.clone())?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(started.elapsed())
}

fn arrow_select_concat(batches: &[RecordBatch]) -> Result<RecordBatch> {
    if batches.len() == 1 {
        return Ok(batches[0].clone());
    }
    let schema = batches[0].schema();
    Ok(arrow_select::concat::concat_batches(&schema, batches)?)
}
