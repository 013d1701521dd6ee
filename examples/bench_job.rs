//! One of the peers' jobs (scripts/peers) as a Riffle pipeline, reported as the peers report
//! theirs: one `PEER riffle <job> items=… seconds=… items_per_s=… p50_ms=… p99_ms=…` line.
//! `scripts/bench-peers.sh` runs it beside the Python peers, interleaved.
//!
//!     cargo run --release --example bench_job -- detect|detect-py|classify|ctr|ctr-dense
//!
//! The clock, as the peers': after the models are loaded and have run once (model stages warm
//! up when built), from the first record read to the last result written. Each job is the
//! shipped pipeline's: detect is `pipelines/camera-perception.yaml` (250 frames, 4 cameras),
//! classify `pipelines/camera-classify.yaml` over 1000 images (the 250 frames 4 times), ctr the
//! recommendation pipeline of `examples/bench_recs.rs` (20,000 ratings, epochs of 64; each
//! click's features include every earlier click and itself, `features: per_click`, as the
//! peers'). 2 workers × 1 ONNX Runtime thread, as the peers' 2 ORT threads in total.
//! `ctr-dense` is ctr with `executor: dense` (Riffle's own executor for dense graphs, on the
//! same 2 workers), reported as `riffle-dense`.
//!
//! `detect-py` is detect with its post-processing (person boxes scoring over 0.5, counted per
//! frame) a Python stage instead of Riffle's `detections` and `select`: the peers' own NumPy
//! code on each batch, the rest of the job Riffle's. It needs pyarrow and NumPy in `VIRTUAL_ENV`
//! (scripts/bench-python.sh makes one). `post_p50_ms` is the post-processing's p50 per batch.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;

const WORKERS: usize = 2;

fn main() -> anyhow::Result<()> {
    let arg = std::env::args()
        .nth(1)
        .context("usage: bench_job detect|detect-py|classify|ctr|ctr-dense")?;
    // `ctr-dense`: the ctr job with its model on Riffle's dense executor, not ONNX Runtime.
    let (job, name, executor) = match arg.as_str() {
        "ctr-dense" => ("ctr".to_string(), "riffle-dense", "dense"),
        _ => (arg.clone(), "riffle", "ort"),
    };
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("bench-job-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("out.jsonl");
    let (yaml, items) = match job.as_str() {
        "detect" => (detect(&repo, &out), 250),
        "detect-py" => (detect_py(&repo, &dir, &out)?, 250),
        "classify" => (classify(&repo, &out), 1000),
        "ctr" => (ctr(&repo, &out, executor)?, 20_000),
        other => bail!("unknown job {other}: detect, detect-py, classify, ctr or ctr-dense"),
    };
    let file = dir.join("job.yaml");
    std::fs::write(&file, yaml)?;
    let pipeline = riffle_pipelines::load(&file, None)?;
    let report = riffle_pipelines::run::execute(
        Arc::new(pipeline),
        &ClusterConfig::single_process(WORKERS),
        Metrics::new()?,
    )?;
    let s = &report.summary;
    let rows = read_rows(&out)?;
    // ctr: an event with no candidates yet (the first) has no result row.
    let least = if job == "ctr" { items - 1 } else { items };
    if rows.len() < least || rows.len() > items || s.results as usize != rows.len() {
        bail!(
            "{job}: {} results written ({} counted), {items} expected",
            rows.len(),
            s.results
        );
    }
    let check = match job.as_str() {
        // As the peers' `check`: frames with a person, and person boxes.
        "detect" | "detect-py" => {
            let counts: Vec<i64> = rows
                .iter()
                .map(|r| r["detections_count"].as_i64().unwrap_or(0))
                .collect();
            format!(
                "person_frames={},person_boxes={}",
                counts.iter().filter(|c| **c > 0).count(),
                counts.iter().sum::<i64>()
            )
        }
        // sha1 of `i:top1` in input order: repetition r's frames are numbered past every
        // frame of r-1, so frame order is input order.
        "classify" => {
            let mut top: Vec<(i64, String)> = rows
                .iter()
                .map(|r| {
                    (
                        r["frame"].as_i64().unwrap_or(-1),
                        r["top_label"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            top.sort();
            let text: Vec<String> = top
                .iter()
                .enumerate()
                .map(|(i, (_, class))| format!("{i}:{class}"))
                .collect();
            sha1(&text.join(","))
        }
        // sha1 of `i:item,…` per event in input order (a user rates an item once, so
        // (user, item) finds the event).
        _ => {
            let events = read_events(&repo.join("data/ml-100k/ratings-20k.csv"))?;
            let mut recs = vec![String::new(); events.len()];
            for r in &rows {
                let key = (
                    r["user_id"].as_i64().unwrap_or(-1),
                    r["item_id"].as_i64().unwrap_or(-1),
                );
                let i = *events.get(&key).context("a result for no event")?;
                let items: Vec<String> = r["recs"]
                    .as_array()
                    .map(|a| a.iter().map(|v| v.to_string()).collect())
                    .unwrap_or_default();
                recs[i] = items.join(",");
            }
            let text: Vec<String> = recs
                .iter()
                .enumerate()
                .map(|(i, r)| format!("{i}:{r}"))
                .collect();
            sha1(&text.join(";"))
        }
    };
    let seconds = s.busy.as_secs_f64();
    let post: &[&str] = match job.as_str() {
        "detect" => &["detections", "select"],
        "detect-py" => &["python"],
        _ => &[],
    };
    let post_p50: f64 = s
        .stages
        .iter()
        .filter(|st| post.contains(&st.name.as_str()))
        .map(|st| st.p50.as_secs_f64() * 1000.0)
        .sum();
    println!(
        "PEER {name}-w{WORKERS} {job} items={items} seconds={seconds:.3} items_per_s={:.1} p50_ms={:.2} p99_ms={:.2} ort_threads={WORKERS}x1 results={} post_p50_ms={post_p50:.3} check={check}",
        items as f64 / seconds,
        s.end_to_end_p50.as_secs_f64() * 1000.0,
        s.end_to_end_p99.as_secs_f64() * 1000.0,
        rows.len(),
    );
    // Where the busy time went, on stderr: batches × p50 per stage approximates each stage's
    // share (bench-peers.sh keeps only the PEER line).
    for st in &s.stages {
        eprintln!(
            "stage {:<12} batches={:<6} mean_rows={:<8.1} p50_ms={:.3} ~total_ms={:.1}",
            st.name,
            st.batches,
            st.mean_batch_rows,
            st.p50.as_secs_f64() * 1000.0,
            st.batches as f64 * st.p50.as_secs_f64() * 1000.0
        );
    }
    if let Some(b) = s.breakdown {
        eprintln!("{b}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn sha1(text: &str) -> String {
    let hex = sha1_smol::Sha1::from(text).digest().to_string();
    format!("sha1={}", &hex[..12])
}

/// (user, item) → event index, in file order.
fn read_events(path: &Path) -> anyhow::Result<std::collections::HashMap<(i64, i64), usize>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .skip(1)
        .enumerate()
        .map(|(i, l)| {
            let mut f = l.split(',');
            let user = f.next().context("user_id")?.parse()?;
            let item = f.next().context("item_id")?.parse()?;
            Ok(((user, item), i))
        })
        .collect()
}

fn read_rows(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    std::fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

fn detect(repo: &Path, out: &Path) -> String {
    format!(
        r#"name: bench-detect
source:
  images: {{ path: {frames}, cameras: 4, partition_by: camera, batch_size: 1 }}
stages:
{stages}sink: {{ jsonl: {{ path: {out} }} }}
runtime: {{ workers: {WORKERS}, intra_op_threads: 1, epoch_records: 16, max_epochs_in_flight: 4 }}
"#,
        frames = repo.join("data/frames").display(),
        stages = common::detect_stages(repo),
        out = out.display(),
    )
}

/// detect, its post-processing the peers' NumPy code in a Python stage.
fn detect_py(repo: &Path, dir: &Path, out: &Path) -> anyhow::Result<String> {
    std::fs::write(dir.join("persons.py"), PERSONS_PY)?;
    let stages = common::detect_stages(repo);
    let upto_model = stages
        .split("  - detections:")
        .next()
        .context("detect's stages have a detections stage")?;
    Ok(detect(repo, out).replace(
        &stages,
        &format!("{upto_model}  - python: {{ path: persons.py, function: persons }}\n"),
    ))
}

/// As the peers' `detect_batch`: per frame, the boxes of class 1 scoring over 0.5.
const PERSONS_PY: &str = r#"
import numpy as np
import pyarrow as pa


def persons(batch):
    n, size = batch.num_rows, batch.schema.field("scores").type.list_size
    scores = batch["scores"].flatten().to_numpy(zero_copy_only=False).reshape(n, size)
    classes = batch["classes"].flatten().to_numpy(zero_copy_only=False).reshape(n, size)
    count = ((scores > 0.5) & (classes == 1.0)).sum(axis=1).astype(np.int32)
    return pa.RecordBatch.from_arrays(
        [batch["camera_id"], batch["frame"], pa.array(count, pa.int32())],
        names=["camera_id", "frame", "detections_count"],
    )
"#;

fn classify(repo: &Path, out: &Path) -> String {
    format!(
        r#"name: bench-classify
source:
  images: {{ path: {frames}, cameras: 2, batch_size: 8, repeat: 4 }}
stages:
  - decode: {{ jpeg: libjpeg-turbo }}
  - resize:
      width: 224
      height: 224
      layout: nchw
      dtype: f32
      mean: [0.485, 0.456, 0.406]
      std: [0.229, 0.224, 0.225]
      antialias: false
  - model:
      path: {model}
      inputs: {{ input: tensor }}
      outputs: {{ logits: logits }}
      batch: {{ max_size: 1 }}
  - topk: {{ input: logits, k: 1, output: top }}
  - select: {{ columns: [camera_id, frame, top_label] }}
sink: {{ jsonl: {{ path: {out} }} }}
runtime: {{ workers: {WORKERS}, intra_op_threads: 1 }}
"#,
        frames = repo.join("data/frames").display(),
        model = repo.join("models/mobilenet_v2_imagenet.onnx").display(),
        out = out.display(),
    )
}

fn ctr(repo: &Path, out: &Path, executor: &str) -> anyhow::Result<String> {
    let ratings = repo.join("data/ml-100k/ratings-20k.csv");
    if !ratings.is_file() {
        bail!("{} not found: run scripts/setup.sh", ratings.display());
    }
    Ok(format!(
        r#"name: bench-ctr
source: {{ csv: {{ path: "{ratings}", batch_size: 64 }} }}
stages:
  - candidates: {{ max_candidates: 100 }}
  - exchange: {{ spread: true, together: event }}
  - model:
      path: "{model}"
      executor: {executor}
      inputs: {{ user_id: user_id, item_id: candidate }}
      outputs: {{ p_click: p_click }}
      keep_inputs: true
      batch: {{ max_size: 8192, max_delay_ms: 5 }}
  - rank: {{ k: 10 }}
  - select: {{ columns: [user_id, item_id, recs, recs_score] }}
sink: {{ jsonl: {{ path: "{out}" }} }}
runtime: {{ workers: {WORKERS}, epoch_records: 64, max_epochs_in_flight: 1 }}
"#,
        ratings = ratings.display(),
        model = repo.join("models/ml100k_ncf_ctr.onnx").display(),
        out = out.display(),
    ))
}
