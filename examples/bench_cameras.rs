//! Camera capacity benchmark (not a test): how many live cameras at their native rate the
//! detector + tracker pipeline sustains on this machine with no dropped frame and p99
//! capture-to-result latency under 500 ms, against the same job written as a straight loop;
//! and decode throughput of the video source against the `ffmpeg` command. Needs ONNX Runtime,
//! FFmpeg's libraries and the `ffmpeg` command; `scripts/bench-cameras.sh` runs it in release
//! and writes the table to `docs/benchmarks/cameras.md`.
//!
//!     cargo run --release --example bench_cameras -- [--seconds 10] [--rounds 3] \
//!         [--sizes bundled,720p,1080p] [--cameras 1,2,3,4] [--decode-rounds 3] [--peer PYTHON]
//!
//! Cameras are the 4 bundled MP4s (25 fps, 640×272) or their 720p / 1080p encodings
//! (`data/videos/hd/`, scripts/media.sh) played as live cameras: `realtime: true` (each frame
//! released at its presentation time), `loop: true`, `max_frames` = 25 × seconds, camera k
//! reading `bikes-(k mod 4).mp4`. All cameras start together (the worst case for latency: every
//! 40 ms all N frames are due at once). The Python camera peer (`scripts/peers/camera_peer.py`:
//! PyAV decoding threads, the same swscale conversion, ONNX Runtime, one process per core) runs
//! the same job side by side, its outputs compared with ours.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{BooleanArray, RecordBatch};
use clap::Parser;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::operators::KeyedLogic;
use riffle_dataflow::sink::{Sink, SinkFactory};
use riffle_dataflow::{DataflowResult, SourceFactory, Stage};
use riffle_operators::vision::track::{CameraTracks, Tracker};
use riffle_pipelines::plan::build_stage;
use riffle_pipelines::spec::StageSpec;
use riffle_pipelines::Pipeline;

/// The criterion: no frame dropped, p99 capture-to-result latency under this.
const P99_LIMIT_MS: f64 = 500.0;
const FPS: usize = 25;
const WORKERS: usize = 2;

#[derive(Parser)]
struct Args {
    /// Seconds of video per camera and run.
    #[arg(long, default_value_t = 10)]
    seconds: usize,
    /// Rounds of each camera count (pipeline and straight loop side by side in each).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Camera counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    cameras: Vec<usize>,
    /// Camera resolutions: `bundled` (640×272), `720p`, `1080p`.
    #[arg(long, value_delimiter = ',', default_value = "bundled,720p,1080p")]
    sizes: Vec<String>,
    /// The Python that runs the camera peer (scripts/peers/camera-setup.sh makes it); none:
    /// `$RIFFLE_CACHE_DIR/camera-peer-venv/bin/python` when present, else the peer is skipped.
    #[arg(long)]
    peer: Option<PathBuf>,
    /// The pipeline's `runtime.epoch_records`: results are released when their epoch
    /// completes, so with paced cameras an epoch of E records waits for E frames to arrive.
    #[arg(long, default_value_t = 4)]
    epoch_records: usize,
    /// Rounds of the decode comparison (0: skip it).
    #[arg(long, default_value_t = 3)]
    decode_rounds: usize,
}

/// One run's figures.
#[derive(Clone, Debug, Default)]
struct Run {
    frames_in: f64,
    dropped: f64,
    results: usize,
    delivered_fps: f64,
    /// The runtime's end-to-end latency (source read → sink), ms; the loop's read → result.
    e2e_p50: f64,
    e2e_p99: f64,
    /// Capture (the frame's due time) → result, ms: what the criterion uses.
    capture_p50: f64,
    capture_p99: f64,
    /// Process CPU time over wall time, in cores.
    cpu_cores: f64,
    /// A hash of every result's (camera index, frame, detections kept), sorted: the pipeline's
    /// and the loop's must be equal when neither dropped a frame.
    outputs: u64,
    /// Where the pipeline's results' time went, mean ms per part (none for the other sides).
    breakdown: Option<[f64; 6]>,
}

impl Run {
    fn passes(&self) -> bool {
        self.dropped == 0.0 && self.results > 0 && self.capture_p99 < P99_LIMIT_MS
    }
}

/// One camera resolution: its label, files and frame size.
struct Size {
    label: &'static str,
    dir: &'static str,
    dims: &'static str,
}

fn size(name: &str) -> anyhow::Result<Size> {
    Ok(match name {
        "bundled" => Size {
            label: "bundled",
            dir: "data/videos",
            dims: "640×272",
        },
        "720p" => Size {
            label: "720p",
            dir: "data/videos/hd/720p",
            dims: "1280×720",
        },
        "1080p" => Size {
            label: "1080p",
            dir: "data/videos/hd/1080p",
            dims: "1920×1080",
        },
        other => anyhow::bail!("--sizes: `{other}` is not bundled, 720p or 1080p"),
    })
}

/// Each side's runs per camera count.
type Runs = BTreeMap<usize, Vec<Run>>;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tick = clock_ticks()?;
    let peer = peer::python(args.peer.clone());
    let mut serial = 0usize;
    let mut summary = Vec::new();
    for name in &args.sizes {
        let size = size(name)?;
        let mut sides: [(String, Runs); 3] = [
            (
                format!(
                    "Riffle pipeline (YAML, 2 workers × 1 ORT thread, epoch_records {})",
                    args.epoch_records
                ),
                Runs::new(),
            ),
            (
                "Straight loop (2 threads × 1 ORT thread)".to_string(),
                Runs::new(),
            ),
            (
                "Python camera peer (PyAV threads + ONNX Runtime, 2 processes × 1 ORT thread)"
                    .to_string(),
                Runs::new(),
            ),
        ];
        for &n in &args.cameras {
            for round in 0..args.rounds {
                serial += 1;
                let p = run_pipeline(&repo, &size, n, &args, serial, tick)?;
                eprintln!("{} N={n} round {round}: pipeline {p:?}", size.label);
                sides[0].1.entry(n).or_default().push(p);
                serial += 1;
                let l = run_loop(&repo, &size, n, &args, serial, tick)?;
                eprintln!("{} N={n} round {round}: straight loop {l:?}", size.label);
                sides[1].1.entry(n).or_default().push(l);
                if let Some(python) = &peer {
                    let r = peer::run(python, &repo, &videos(&repo, &size, n), args.seconds)?;
                    eprintln!("{} N={n} round {round}: python peer {r:?}", size.label);
                    sides[2].1.entry(n).or_default().push(r);
                }
            }
        }
        let differ = differing(&sides);
        let passes = |n: &usize, rs: &[Run]| {
            rs.iter().all(Run::passes) && !differ.get(n).copied().unwrap_or(true)
        };
        println!(
            "### {} cameras ({FPS} fps, {} H.264, {} s each, {} round(s); median (min–max))\n",
            size.label, size.dims, args.seconds, args.rounds
        );
        for (title, runs) in &sides {
            if runs.is_empty() {
                println!("**{title}**: not run (no peer Python: scripts/peers/camera-setup.sh)\n");
                continue;
            }
            println!("**{title}**\n");
            println!("| cameras | offered fps | frames in | dropped | delivered fps | capture → result p50 ms | capture → result p99 ms | read → result p50 / p99 ms | CPU (cores) | passes |");
            println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|");
            for (n, rs) in runs {
                let col = |f: fn(&Run) -> f64, digits: usize| spread(rs.iter().map(f), digits);
                println!(
                    "| {n} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |",
                    n * FPS,
                    col(|r| r.frames_in, 0),
                    col(|r| r.dropped, 0),
                    col(|r| r.delivered_fps, 1),
                    col(|r| r.capture_p50, 0),
                    col(|r| r.capture_p99, 0),
                    col(|r| r.e2e_p50, 0),
                    col(|r| r.e2e_p99, 0),
                    col(|r| r.cpu_cores, 2),
                    if differ.get(n).copied().unwrap_or(true) {
                        "outputs differ"
                    } else if passes(n, rs) {
                        "yes"
                    } else {
                        "no"
                    },
                );
            }
            println!();
        }
        breakdown_table(&sides[0].1);
        let capacity = |runs: &Runs| {
            runs.iter()
                .filter(|(n, rs)| passes(n, rs))
                .map(|(n, _)| *n)
                .max()
                .unwrap_or(0)
        };
        let ceiling = decode::ceiling(&repo.join(size.dir).join("bikes-0.mp4"))?;
        summary.push((
            size.label,
            size.dims,
            capacity(&sides[0].1),
            capacity(&sides[1].1),
            (!sides[2].1.is_empty()).then(|| capacity(&sides[2].1)),
            ceiling,
        ));
    }
    println!(
        "### Capacity: cameras at {FPS} fps with zero drops and p99 capture → result < {P99_LIMIT_MS:.0} ms\n"
    );
    println!("Largest camera count tried that passes in every round, with the sides' outputs equal \
              wherever none dropped a frame. Ceiling: what decoding alone allows on {WORKERS} cores \
              (`ffmpeg -threads 1` to 300×300 RGB with the same swscale flags, frames per \
              CPU-second × {WORKERS} / {FPS}).\n");
    println!("| cameras | Riffle pipeline | straight loop | Python peer | Riffle / peer | decode-only ceiling |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (label, dims, ours, straight, python, ceiling) in summary {
        let (python, ratio) = match python {
            Some(0) => ("0".to_string(), "—".to_string()),
            Some(p) => (p.to_string(), format!("{:.2}", ours as f64 / p as f64)),
            None => ("not run".to_string(), "—".to_string()),
        };
        println!(
            "| {label} ({dims}) | {ours} | {straight} | {python} | {ratio} | {:.1} |",
            ceiling * WORKERS as f64 / FPS as f64
        );
    }
    println!();

    if args.decode_rounds > 0 {
        decode_table(&repo, args.decode_rounds, tick)?;
    }
    Ok(())
}

/// Per camera count, whether two sides that both dropped nothing in a round gave different
/// outputs. Project rule: no comparison between runs that did not produce the same outputs;
/// a count where they differ passes for no side.
fn differing(sides: &[(String, Runs); 3]) -> BTreeMap<usize, bool> {
    let counts: Vec<usize> = sides[0].1.keys().copied().collect();
    counts
        .into_iter()
        .map(|n| {
            let rounds: Vec<&[Run]> = sides
                .iter()
                .filter_map(|(_, runs)| runs.get(&n).map(Vec::as_slice))
                .collect();
            let differ = (0..rounds.iter().map(|r| r.len()).max().unwrap_or(0)).any(|round| {
                let clean: Vec<u64> = rounds
                    .iter()
                    .filter_map(|r| r.get(round))
                    .filter(|r| r.dropped == 0.0)
                    .map(|r| r.outputs)
                    .collect();
                clean.windows(2).any(|w| w[0] != w[1])
            });
            if differ {
                eprintln!("N={n}: the sides' outputs differ");
            }
            (n, differ)
        })
        .collect()
}

/// Camera k's file: `bikes-(k mod 4).mp4` of the size's folder.
fn videos(repo: &Path, size: &Size, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|k| repo.join(size.dir).join(format!("bikes-{}.mp4", k % 4)))
        .collect()
}

/// The detector + tracker job of `pipelines/camera-tracking.yaml` over `n` paced cameras.
fn yaml(
    repo: &Path,
    size: &Size,
    n: usize,
    seconds: usize,
    epoch_records: usize,
    serial: usize,
) -> String {
    let cameras: String = videos(repo, size, n)
        .iter()
        .enumerate()
        .map(|(k, file)| {
            format!(
                "      - {{ id: \"r{serial}-cam{k}\", uri: \"{}\" }}\n",
                file.display()
            )
        })
        .collect();
    format!(
        r#"name: bench-cameras
source:
  video:
    cameras:
{cameras}    realtime: true
    loop: true
    max_frames: {frames}
    batch_size: 4
    queue_size: 8
stages:
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: {model}
      inputs:
        "image_tensor:0": tensor
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: 4, max_delay_ms: 10 }}
  - detections:
      boxes: boxes
      scores: scores
      classes: classes
      box_format: yxyx_normalized
      score_threshold: 0.1
      keep_classes: [1]
      labels: {{ 1: person }}
      iou_threshold: 0.5
  - track:
      camera: camera_id
      frame: frame
      input: detections
      output: detections
      high_threshold: 0.5
      low_threshold: 0.1
      new_track_threshold: 0.6
      match_iou: 0.2
      track_buffer: 30
  - select:
      columns: [camera_id, frame, ingest_ms, detections_count]
sink:
  jsonl: {{ path: {out} }}
runtime:
  workers: {WORKERS}
  intra_op_threads: 1
  epoch_records: {epoch_records}
  max_epochs_in_flight: 4
  latency_column: latency_ms
"#,
        frames = seconds * FPS,
        model = repo.join("models/ssdlite_person.onnx").display(),
        out = std::env::temp_dir()
            .join(format!("bench-cameras-{}.jsonl", std::process::id()))
            .display(),
    )
}

fn load(
    repo: &Path,
    size: &Size,
    n: usize,
    args: &Args,
    serial: usize,
) -> anyhow::Result<Pipeline> {
    let file = std::env::temp_dir().join(format!(
        "bench-cameras-{}-{serial}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &file,
        yaml(repo, size, n, args.seconds, args.epoch_records, serial),
    )?;
    let pipeline = riffle_pipelines::load(&file, None);
    let _ = std::fs::remove_file(&file);
    Ok(pipeline?)
}

/// Capture → result latencies, noted as results arrive, and the results themselves.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<(i64, i64)>>>, Arc<Mutex<Vec<Output>>>);

/// One result: camera index (the `k` of `r<serial>-cam<k>`), frame, detections kept.
type Output = (u64, i64, i64);

/// A hash of results in a fixed order: equal for equal results whatever their arrival order.
fn digest(mut v: Vec<Output>) -> u64 {
    use std::hash::{Hash, Hasher};
    v.sort_unstable();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut hasher);
    hasher.finish()
}

impl Arrivals {
    /// Notes each row's (capture ms, now ms) and its result.
    fn note(&self, batch: &RecordBatch) {
        let now = now_ms();
        if let Some(ingest) = batch
            .column_by_name("ingest_ms")
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
        {
            let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
            v.extend(ingest.values().iter().map(|i| (*i, now)));
        }
        let column = |name: &str| batch.column_by_name(name);
        // The detections stage writes its count as Int32; any integer type will do.
        let integers = |name: &str| -> Option<Vec<Option<i64>>> {
            let c = column(name)?;
            if let Some(v) = c.as_primitive_opt::<Int64Type>() {
                return Some(v.iter().collect());
            }
            let v = c.as_primitive_opt::<arrow_array::types::Int32Type>()?;
            Some(v.iter().map(|x| x.map(i64::from)).collect())
        };
        let mut outputs = self.1.lock().unwrap_or_else(|p| p.into_inner());
        match (
            column("camera_id").and_then(|c| c.as_string_opt::<i32>()),
            integers("frame"),
            integers("detections_count"),
        ) {
            (Some(cameras), Some(frames), Some(counts)) => {
                for ((camera, frame), count) in cameras.iter().zip(frames).zip(counts) {
                    let k = camera
                        .and_then(|c| c.rsplit("-cam").next())
                        .and_then(|k| k.parse().ok())
                        .unwrap_or(u64::MAX);
                    outputs.push((k, frame.unwrap_or(-1), count.unwrap_or(-1)));
                }
            }
            // A result without these columns cannot be compared: it makes the outputs differ.
            _ => outputs.push((u64::MAX, -1, -1)),
        }
    }

    /// A hash of the results, in a fixed order.
    fn outputs(&self) -> u64 {
        digest(self.1.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// (results, delivered fps, p50, p99 of capture → result ms).
    fn figures(&self) -> (usize, f64, f64, f64) {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut lat: Vec<f64> = v.iter().map(|(c, n)| (n - c) as f64).collect();
        let first = v.iter().map(|(c, _)| *c).min().unwrap_or(0);
        let last = v.iter().map(|(_, n)| *n).max().unwrap_or(0);
        let fps = v.len() as f64 / ((last - first).max(1) as f64 / 1000.0);
        (
            v.len(),
            fps,
            quantile(&mut lat, 0.5),
            quantile(&mut lat, 0.99),
        )
    }
}

impl SinkFactory for Arrivals {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(self.clone()))
    }
}

impl Sink for Arrivals {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        self.note(batch);
        Ok(())
    }
    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}

fn run_pipeline(
    repo: &Path,
    size: &Size,
    n: usize,
    args: &Args,
    serial: usize,
    tick: f64,
) -> anyhow::Result<Run> {
    let mut pipeline = load(repo, size, n, args, serial)?;
    let arrivals = Arrivals::default();
    pipeline.sink = Arc::new(arrivals.clone());
    let source = pipeline.source.clone();
    let metrics = Metrics::new()?;
    let (cpu0, t0) = (cpu_seconds(tick)?, Instant::now());
    let report = riffle_pipelines::run::execute(
        Arc::new(pipeline),
        &ClusterConfig::single_process(WORKERS),
        metrics,
    )?;
    let cpu = (cpu_seconds(tick)? - cpu0) / t0.elapsed().as_secs_f64();
    let (results, delivered_fps, capture_p50, capture_p99) = arrivals.figures();
    let (frames_in, dropped) = video_counters(source.as_ref(), serial)?;
    Ok(Run {
        frames_in,
        dropped,
        results,
        delivered_fps,
        e2e_p50: report.summary.end_to_end_p50.as_secs_f64() * 1000.0,
        e2e_p99: report.summary.end_to_end_p99.as_secs_f64() * 1000.0,
        capture_p50,
        capture_p99,
        cpu_cores: cpu,
        outputs: arrivals.outputs(),
        breakdown: report
            .summary
            .breakdown
            .map(|b| b.parts().map(|(_, d)| d.as_secs_f64() * 1000.0)),
    })
}

/// The pipeline's latency breakdown (the run summary's), per camera count: where a result's
/// capture → written time went, mean ms per result, median (min–max) over the rounds.
fn breakdown_table(runs: &Runs) {
    if runs.values().flatten().all(|r| r.breakdown.is_none()) {
        return;
    }
    println!("**Riffle pipeline: where a result's time goes** (mean ms per result: capture → read in the camera's queue, then the runtime's own parts; they add up to capture → written)\n");
    println!("| cameras | source queue | batching | stages | dataflow | epoch | sink | sum |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, rs) in runs {
        let part = |i: usize| spread(rs.iter().filter_map(|r| r.breakdown.map(|b| b[i])), 1);
        let sum = spread(
            rs.iter()
                .filter_map(|r| r.breakdown.map(|b| b.iter().sum())),
            1,
        );
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {sum} |",
            part(0),
            part(1),
            part(2),
            part(3),
            part(4),
            part(5)
        );
    }
    println!();
}

/// The same job without the dataflow: one thread per core reads its cameras (camera k on
/// thread k mod 2) from the same video source partition (same decoder, pacing and queues),
/// then runs the same stages on each batch it reads, the tracker's logic called per camera.
fn run_loop(
    repo: &Path,
    size: &Size,
    n: usize,
    args: &Args,
    serial: usize,
    tick: f64,
) -> anyhow::Result<Run> {
    let pipeline = load(repo, size, n, args, serial)?;
    let arrivals = Arrivals::default();
    let read_to_result: Arc<Mutex<Vec<f64>>> = Arc::default();
    let (cpu0, t0) = (cpu_seconds(tick)?, Instant::now());
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut threads = Vec::new();
        for t in 0..WORKERS {
            let (pipeline, arrivals, read_to_result) = (&pipeline, &arrivals, &read_to_result);
            threads.push(scope.spawn(move || -> anyhow::Result<()> {
                straight_loop(pipeline, t, arrivals, read_to_result)
            }));
        }
        for t in threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a loop thread panicked"))??;
        }
        Ok(())
    })?;
    let cpu = (cpu_seconds(tick)? - cpu0) / t0.elapsed().as_secs_f64();
    let (results, delivered_fps, capture_p50, capture_p99) = arrivals.figures();
    let mut e2e = read_to_result
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let (frames_in, dropped) = video_counters(pipeline.source.as_ref(), serial)?;
    Ok(Run {
        frames_in,
        dropped,
        results,
        delivered_fps,
        e2e_p50: quantile(&mut e2e, 0.5),
        e2e_p99: quantile(&mut e2e, 0.99),
        capture_p50,
        capture_p99,
        cpu_cores: cpu,
        outputs: arrivals.outputs(),
        breakdown: None,
    })
}

fn straight_loop(
    pipeline: &Pipeline,
    thread: usize,
    arrivals: &Arrivals,
    read_to_result: &Mutex<Vec<f64>>,
) -> anyhow::Result<()> {
    let mut before: Vec<Box<dyn Stage>> = Vec::new();
    let mut after: Vec<Box<dyn Stage>> = Vec::new();
    let mut tracker = None;
    for s in &pipeline.spec.stages {
        if let StageSpec::Track(config) = &s.value {
            tracker = Some(Tracker::new(config.clone())?);
            continue;
        }
        let stage = build_stage(&s.value, &pipeline.runtime, thread)?
            .ok_or_else(|| anyhow::anyhow!("stage {} is not batch-by-batch", s.value.kind()))?;
        if tracker.is_none() {
            before.push(stage);
        } else {
            after.push(stage);
        }
    }
    let mut tracker = tracker.context("no track stage")?;
    let mut tracks: BTreeMap<String, CameraTracks> = BTreeMap::new();
    let mut source = pipeline.source.partition(thread, WORKERS)?;
    while let Some(read) = source.next_batch()? {
        if read.records.num_rows() == 0 {
            continue;
        }
        let read_at = Instant::now();
        let mut batch = read.records;
        for stage in before.iter_mut() {
            batch = stage.process_batch(&batch)?.records;
        }
        // The tracker takes one camera's rows at a time, in frame order.
        let cameras = batch
            .column_by_name("camera_id")
            .and_then(|c| c.as_string_opt::<i32>())
            .context("camera_id")?
            .clone();
        let mut ids: Vec<&str> = cameras.iter().flatten().collect();
        ids.dedup();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            let mask: BooleanArray = cameras.iter().map(|c| Some(c == Some(id))).collect();
            let rows = arrow_select::filter::filter_record_batch(&batch, &mask)?;
            let state = tracks.entry(id.to_string()).or_default();
            let mut out = tracker.process(id, state, &rows)?.records;
            for stage in after.iter_mut() {
                out = stage.process_batch(&out)?.records;
            }
            arrivals.note(&out);
        }
        let ms = read_at.elapsed().as_secs_f64() * 1000.0;
        let mut v = read_to_result.lock().unwrap_or_else(|p| p.into_inner());
        v.extend(std::iter::repeat_n(ms, batch.num_rows()));
    }
    Ok(())
}

/// Frames the run's cameras queued and dropped (the source's Prometheus counters; they are
/// process-wide, so each run's cameras have ids of their own).
fn video_counters(source: &dyn SourceFactory, serial: usize) -> anyhow::Result<(f64, f64)> {
    let metrics = Metrics::new()?;
    source.attach_metrics(&metrics)?;
    let label = format!("camera=r{serial}-cam");
    let sum = |family: &str| -> f64 {
        metrics
            .summary(std::time::Duration::ZERO)
            .connectors
            .iter()
            .filter(|(name, _)| name.starts_with(family) && name.contains(&label))
            .map(|(_, v)| *v)
            .sum()
    };
    Ok((
        sum("riffle_video_frames_total{"),
        sum("riffle_video_frames_dropped_total{"),
    ))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The `q` quantile (nearest rank) of `v`, 0 when empty.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// "median (min–max)", or the value alone when all rounds agree or there is one.
fn spread(values: impl Iterator<Item = f64>, digits: usize) -> String {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return "—".into();
    }
    let (min, max) = (
        v.iter().copied().fold(f64::MAX, f64::min),
        v.iter().copied().fold(f64::MIN, f64::max),
    );
    let median = quantile(&mut v, 0.5);
    let f = |x: f64| format!("{x:.digits$}");
    if f(min) == f(max) {
        f(median)
    } else {
        format!("{} ({}–{})", f(median), f(min), f(max))
    }
}

/// Clock ticks per second of /proc's CPU times.
fn clock_ticks() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("getconf CLK_TCK")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// CPU seconds (user + system) this process has used.
fn cpu_seconds(tick: f64) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').context("/proc/self/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).context("utime")?.parse()?;
    let stime: f64 = fields.get(12).context("stime")?.parse()?;
    Ok((utime + stime) / tick)
}

#[path = "bench_cameras/decode.rs"]
mod decode;
#[path = "bench_cameras/peer.rs"]
mod peer;
use decode::decode_table;
