//! Latency-aware balancing (not a test): 4 live cameras (paced) classified on 2 workers, one of
//! which is made slower (`runtime.slow_worker`), routed by camera hash or by measured delay
//! (`exchange: { balance: true, ordered_by: camera_id }`), against the all-fast case, in one run.
//!
//!     cargo run --release --example bench_balance [-- DELAY_MS RATE_PER_WORKER]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::observe::summary::fmt_duration;

fn main() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut args = std::env::args().skip(1);
    let delay_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(250);
    let rate: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(45.0);
    let tmp = std::env::temp_dir().join(format!("bench-balance-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    println!(
        "4 cameras, 500 frames, {rate} frames/s offered per worker, worker 1 slowed by {delay_ms} ms per batch of 4\n"
    );
    println!("| routing | worker 1 | frames/s | vs all-fast hash | e2e p50 | e2e p99 |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut base = None;
    for (routing, slow) in [
        ("hash", false),
        ("balance", false),
        ("hash", true),
        ("balance", true),
    ] {
        let file = write_pipeline(&repo, &tmp, routing, slow.then_some(delay_ms), rate)?;
        let pipeline = Arc::new(riffle_pipelines::load(&file, None)?);
        let started = Instant::now();
        let report = riffle_pipelines::run::execute(
            pipeline,
            &ClusterConfig::single_process(2),
            Metrics::new()?,
        )?;
        let t = started.elapsed().as_secs_f64();
        let s = report.summary;
        let fps = s.results as f64 / t;
        let b = *base.get_or_insert(fps);
        println!(
            "| {routing} | {} | {fps:.1} | {:.2} | {} | {} |",
            if slow { "slowed" } else { "fast" },
            fps / b,
            fmt_duration(s.end_to_end_p50),
            fmt_duration(s.end_to_end_p99)
        );
    }
    let _ = std::fs::remove_dir_all(tmp);
    Ok(())
}

fn write_pipeline(
    repo: &Path,
    dir: &Path,
    routing: &str,
    slow: Option<u64>,
    rate: f64,
) -> Result<PathBuf> {
    let exchange = match routing {
        "hash" => "{ key: camera_id }",
        _ => "{ balance: true, ordered_by: camera_id }",
    };
    let slow = slow.map_or(String::new(), |ms| {
        format!(", slow_worker: {{ worker: 1, delay_ms: {ms} }}")
    });
    let file = dir.join(format!("{routing}.yaml"));
    std::fs::write(
        &file,
        format!(
            r#"
source: {{ images: {{ path: "{frames}", cameras: 4, partition_by: camera, batch_size: 4, repeat: 2, max_records_per_second: {rate} }} }}
stages:
  - exchange: {exchange}
  - decode: {{}}
  - resize: {{ width: 224, height: 224, layout: nchw, dtype: f32, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }}
  - model:
      path: "{model}"
      inputs: {{ input: tensor }}
      outputs: {{ logits: logits }}
      batch: {{ max_size: 4, max_delay_ms: 5 }}
  - topk: {{ input: logits, k: 1 }}
  - select: {{ columns: [camera_id, frame, top_label] }}
sink: {{ jsonl: {{ path: "{out}" }} }}
runtime: {{ workers: 2, epoch_records: 8, max_epochs_in_flight: 4, latency_column: latency_ms{slow} }}
"#,
            frames = repo.join("data/frames").display(),
            model = repo.join("models/mobilenet_v2_imagenet.onnx").display(),
            out = dir.join(format!("{routing}.jsonl")).display(),
        ),
    )?;
    Ok(file)
}
