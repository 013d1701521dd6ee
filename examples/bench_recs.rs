//! Recommendation pipeline benchmark (not a test): the first 20,000 MovieLens-100k ratings in
//! time order; per click, ≤ 100 most popular items so far that the user has not rated → NCF
//! click model → top 10. Riffle (2 workers × 1 ORT thread) against a straight loop (exact
//! per-click features, one model call per click, ORT with 2 threads) and ONNX Runtime alone on
//! the loop's prepared tensors (2 sessions × 1 thread, per click and in large batches), all in
//! one run, in interleaved rounds (median and range). Riffle's recommendations must equal the
//! loop's for every click (the same job: features with every earlier click, top 10 by score,
//! ties in candidate order); a variant whose outputs differ shows "outputs differ" instead of
//! its ratios. Needs `scripts/setup.sh` (ratings, ORT).
//! Against the Python peers, side by side: `scripts/bench-peers.sh`.
//!
//!     cargo run --release --example bench_recs -- [rounds]

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use arrow_array::{Array, Float32Array, Int64Array, RecordBatch};
use common::spread;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::observe::summary::fmt_duration;
use riffle_dataflow::Stage;
use riffle_pipelines::plan::build_stage;
use riffle_pipelines::spec::{RuntimeConfig, StageSpec};

const CANDIDATES: usize = 100;
const K: usize = 10;

fn main() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let ratings = repo.join("data/ml-100k/ratings-20k.csv");
    if !ratings.is_file() {
        bail!("{} not found: run scripts/setup.sh", ratings.display());
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(3);
    let model = repo.join("models/ml100k_ncf_ctr.onnx");
    let clicks = read_clicks(&ratings)?;
    let events = clicks.len() as f64;
    let tmp = std::env::temp_dir().join(format!("bench-recs-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    // (clicks per epoch and worker, candidates spread over the workers before scoring); the
    // second runs as the shipped pipeline did before `spread`, so the change is measured alone.
    // (clicks per worker and epoch, candidates spread over the workers, epochs in flight)
    const VARIANTS: [(usize, bool, usize); 5] = [
        (64, true, 1),
        (64, false, 1),
        (64, true, 2),
        (96, true, 1),
        (128, true, 1),
    ];
    let pipelines = VARIANTS
        .iter()
        .map(|&(e, spread, in_flight)| {
            let file = write_pipeline(&tmp, &ratings, &model, e, spread, in_flight)?;
            Ok(Arc::new(riffle_pipelines::load(&file, None)?))
        })
        .collect::<Result<Vec<_>>>()?;

    // Every variant once per round, rounds interleaved, so machine noise hits all alike. Each
    // clock starts once its sessions exist and have run (model stages warm up when built):
    // the pipeline's from its first record read to its last result written.
    let mut loop_rate = Vec::new();
    let mut loop_latency = Vec::new();
    let mut per_click = Vec::new();
    let mut batched = Vec::new();
    let mut riffle: Vec<Vec<(f64, Duration, Duration)>> = vec![Vec::new(); VARIANTS.len()];
    // Per variant: the first click whose recommendations differed from the loop's, if any.
    let mut differs: Vec<Option<String>> = vec![None; VARIANTS.len()];
    let out = tmp.join("out.jsonl");
    for _ in 0..rounds {
        let (took, latency, ready, expected) = straight_loop(&clicks, &model)?;
        loop_rate.push(events / took.as_secs_f64());
        loop_latency.extend(latency);
        per_click.push(events / ort_alone(&model, &ready, 2)?.as_secs_f64());
        let merged = merge(&ready, 8192)?;
        batched.push(events / ort_alone(&model, &merged, 2)?.as_secs_f64());
        for (i, pipeline) in pipelines.iter().enumerate() {
            let report = riffle_pipelines::run::execute(
                pipeline.clone(),
                &ClusterConfig::single_process(2),
                Metrics::new()?,
            )?;
            let s = report.summary;
            // The first click has no candidates yet, hence no result.
            if s.results + 1 < clicks.len() as u64 {
                bail!("{} results for {} clicks", s.results, clicks.len());
            }
            riffle[i].push((
                events / s.busy.as_secs_f64(),
                s.end_to_end_p50,
                s.end_to_end_p99,
            ));
            if differs[i].is_none() {
                differs[i] = first_difference(&out, &clicks, &expected)?;
            }
        }
    }
    loop_latency.sort();

    println!(
        "{rounds} interleaved round(s), median (min–max); ratios per round. The Python peers are \
         compared side by side by scripts/bench-peers.sh.\n"
    );
    println!("| run | events/s | p50 latency | p99 latency | vs straight loop | vs ORT alone per click |");
    println!("|---|---:|---:|---:|---:|---:|");
    let ratio = |rates: &[f64], of: &[f64], differ: bool| -> String {
        if differ {
            return "outputs differ".into();
        }
        let r: Vec<f64> = rates.iter().zip(of).map(|(a, b)| a / b).collect();
        spread(&r, 2)
    };
    let row = |name: &str, rates: &[f64], p50: String, p99: String, differ: bool| {
        println!(
            "| {name} | {} | {p50} | {p99} | {} | {} |",
            spread(rates, 0),
            ratio(rates, &loop_rate, differ),
            ratio(rates, &per_click, differ)
        )
    };
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    for ((runs, (epoch_records, spread_out, in_flight)), differ) in
        riffle.iter().zip(VARIANTS).zip(&differs)
    {
        let rates: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let p50: Vec<f64> = runs.iter().map(|r| ms(&r.1)).collect();
        let p99: Vec<f64> = runs.iter().map(|r| ms(&r.2)).collect();
        row(
            &format!(
                "riffle, 2 workers, epochs of {epoch_records} clicks/worker{}{}",
                if spread_out {
                    ""
                } else {
                    ", candidates not spread"
                },
                if in_flight > 1 {
                    format!(", {in_flight} epochs in flight")
                } else {
                    String::new()
                }
            ),
            &rates,
            format!("{} ms", spread(&p50, 2)),
            format!("{} ms", spread(&p99, 2)),
            differ.is_some(),
        );
    }
    let pct = |q: f64| loop_latency[((loop_latency.len() - 1) as f64 * q) as usize];
    row(
        "straight loop (1 thread + ORT 2 threads)",
        &loop_rate,
        fmt_duration(pct(0.5)),
        fmt_duration(pct(0.99)),
        false,
    );
    row(
        "ORT alone, one call per click (2 × 1 thread)",
        &per_click,
        "-".into(),
        "-".into(),
        false,
    );
    row(
        "ORT alone, batches of 8192 rows (2 × 1 thread)",
        &batched,
        "-".into(),
        "-".into(),
        false,
    );
    for ((epoch_records, spread_out, in_flight), differ) in VARIANTS.iter().zip(&differs) {
        if let Some(d) = differ {
            println!(
                "\nepochs of {epoch_records}, spread {spread_out}, {in_flight} in flight: outputs differ: {d}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(tmp);
    Ok(())
}

fn read_clicks(path: &Path) -> Result<Vec<(i64, i64)>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Ok((f[0].parse()?, f[1].parse()?))
        })
        .collect()
}

fn write_pipeline(
    dir: &Path,
    ratings: &Path,
    model: &Path,
    epoch_records: usize,
    spread: bool,
    in_flight: usize,
) -> Result<PathBuf> {
    let file = dir.join(format!("recs-{epoch_records}-{spread}-{in_flight}.yaml"));
    let exchange = if spread {
        "\n  - exchange: { spread: true, together: event }"
    } else {
        ""
    };
    std::fs::write(
        &file,
        format!(
            r#"
source: {{ csv: {{ path: "{}", batch_size: {epoch_records} }} }}
stages:
  - candidates: {{ max_candidates: {CANDIDATES} }}{exchange}
  - model:
      path: "{}"
      inputs: {{ user_id: user_id, item_id: candidate }}
      outputs: {{ p_click: p_click }}
      keep_inputs: true
      batch: {{ max_size: 8192, max_delay_ms: 5 }}
  - rank: {{ k: {K} }}
  - select: {{ columns: [user_id, item_id, recs, recs_score] }}
sink: {{ jsonl: {{ path: "{}" }} }}
runtime: {{ workers: 2, epoch_records: {epoch_records}, max_epochs_in_flight: {in_flight}, latency_column: latency_ms }}
"#,
            ratings.display(),
            model.display(),
            dir.join("out.jsonl").display()
        ),
    )?;
    Ok(file)
}

fn model_stage(model: &Path, threads: usize) -> Result<Box<dyn Stage>> {
    let spec: StageSpec = serde_json::from_value(serde_json::json!({
        "model": {
            "path": model,
            "inputs": { "user_id": "user_id", "item_id": "candidate" },
            "outputs": { "p_click": "p_click" },
            "intra_op_threads": threads,
        }
    }))?;
    build_stage(&spec, &RuntimeConfig::default(), 0)?.context("a model stage")
}

/// The straight loop's time, per-click latencies, model inputs and recommendations per click.
type StraightLoop = (Duration, Vec<Duration>, Vec<RecordBatch>, Vec<Vec<i64>>);

/// The first click of `clicks` whose recommendations in Riffle's output `out` are not
/// `expected`'s (a click without a row has none), described; `None` when all agree.
fn first_difference(
    out: &Path,
    clicks: &[(i64, i64)],
    expected: &[Vec<i64>],
) -> Result<Option<String>> {
    let mut got: HashMap<(i64, i64), Vec<i64>> = HashMap::new();
    for line in std::fs::read_to_string(out)?.lines() {
        let row: serde_json::Value = serde_json::from_str(line)?;
        let key = (
            row["user_id"].as_i64().context("user_id")?,
            row["item_id"].as_i64().context("item_id")?,
        );
        let recs = row["recs"]
            .as_array()
            .context("recs")?
            .iter()
            .map(|v| v.as_i64().context("an item id"))
            .collect::<Result<Vec<i64>>>()?;
        got.insert(key, recs);
    }
    for (click, want) in clicks.iter().zip(expected) {
        let have = got.get(click).cloned().unwrap_or_default();
        if &have != want {
            return Ok(Some(format!(
                "click {click:?}: riffle {have:?}, loop {want:?}"
            )));
        }
    }
    Ok(None)
}

/// Per click: exact features of the clicks before it (the click itself is counted after its
/// answer; the clicked item is never a candidate, so this equals the peers' counting it first),
/// one model call for its candidates, top-k by score (a stable sort: ties in candidate order).
/// Also returns each click's recommendations.
fn straight_loop(clicks: &[(i64, i64)], model: &Path) -> Result<StraightLoop> {
    let mut stage = model_stage(model, 2)?;
    let mut counts: HashMap<i64, i64> = HashMap::new();
    let mut ranking: BTreeSet<(i64, i64)> = BTreeSet::new();
    let mut seen: HashMap<i64, HashSet<i64>> = HashMap::new();
    let mut latency = Vec::with_capacity(clicks.len());
    let mut ready = Vec::new();
    let mut recs = Vec::with_capacity(clicks.len());
    let started = Instant::now();
    for &(user, item) in clicks {
        let t = Instant::now();
        let none = HashSet::new();
        let user_seen = seen.get(&user).unwrap_or(&none);
        let candidates: Vec<i64> = ranking
            .iter()
            .map(|(_, i)| *i)
            .filter(|i| *i != item && !user_seen.contains(i))
            .take(CANDIDATES)
            .collect();
        let mut top = Vec::new();
        if !candidates.is_empty() {
            let batch = RecordBatch::try_from_iter(vec![
                (
                    "user_id",
                    Arc::new(Int64Array::from(vec![user; candidates.len()])) as _,
                ),
                (
                    "candidate",
                    Arc::new(Int64Array::from(candidates.clone())) as _,
                ),
            ])?;
            let out = stage.process_batch(&batch)?.records;
            let scores = out
                .column_by_name("p_click")
                .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
                .context("p_click")?;
            let mut order: Vec<usize> = (0..scores.len()).collect();
            order.sort_by(|a, b| scores.value(*b).total_cmp(&scores.value(*a)));
            order.truncate(K);
            top = order.iter().map(|&o| candidates[o]).collect();
            ready.push(batch);
        }
        recs.push(top);
        let count = counts.entry(item).or_default();
        ranking.remove(&(-*count, item));
        *count += 1;
        ranking.insert((-*count, item));
        seen.entry(user).or_default().insert(item);
        latency.push(t.elapsed());
    }
    Ok((started.elapsed(), latency, ready, recs))
}

/// `sessions` sessions of 1 thread, each running its share of `batches`.
fn ort_alone(model: &Path, batches: &[RecordBatch], sessions: usize) -> Result<Duration> {
    let mut stages = Vec::new();
    for _ in 0..sessions {
        stages.push(model_stage(model, 1)?);
    }
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = stages
            .into_iter()
            .enumerate()
            .map(|(w, mut stage)| {
                scope.spawn(move || -> Result<usize> {
                    let mut rows = 0;
                    for b in batches.iter().skip(w).step_by(sessions) {
                        rows += stage.process_batch(b)?.records.num_rows();
                    }
                    Ok(rows)
                })
            })
            .collect();
        let mut rows = 0;
        for h in handles {
            rows += h
                .join()
                .map_err(|_| anyhow::anyhow!("an ORT-alone thread panicked"))??;
        }
        let expected: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if rows != expected {
            bail!("ORT alone scored {rows} rows of {expected}");
        }
        Ok(())
    })?;
    Ok(started.elapsed())
}

fn merge(batches: &[RecordBatch], rows: usize) -> Result<Vec<RecordBatch>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let all = arrow_select::concat::concat_batches(&first.schema(), batches)?;
    Ok((0..all.num_rows())
        .step_by(rows)
        .map(|s| all.slice(s, rows.min(all.num_rows() - s)))
        .collect())
}
