//! Fault-tolerance figures (not a test): needs a broker (`scripts/kafka.sh start`), ONNX Runtime
//! and a release build of `riffle` (`cargo build --release`).
//!
//!     cargo run --release --example bench_recovery -- [BROKERS]
//!
//! 1. Throughput of the camera pipeline from Kafka with checkpoints off and on (same run).
//! 2. Time to write one checkpoint (write, fsync, rename, fsync the directory).
//! 3. Time from `kill -9` of a worker process to results flowing again (supervisor restart,
//!    resume from the checkpoint).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use riffle_connectors::kafka::replay::{replay, Pace};
use riffle_connectors::kafka::topics::{ensure_topic, TopicSpec};
use riffle_connectors::{ImagesConfig, PartitionBy, SourceConfig};
use riffle_dataflow::checkpoint::{Checkpoint, CheckpointStore};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;

fn main() -> anyhow::Result<()> {
    let brokers = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".into());
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tmp = std::env::temp_dir().join(format!("bench-recovery-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let topic = format!("bench-recovery-{}", std::process::id());
    ensure_topic(&brokers, &Default::default(), &TopicSpec::new(&topic, 4))?;
    let frames = SourceConfig::Images(ImagesConfig {
        path: repo.join("data/frames"),
        cameras: Some(4),
        batch_size: 64,
        repeat: 2,
        extensions: vec!["jpg".into()],
        partition_by: PartitionBy::Camera,
        max_records_per_second: None,
        fps: None,
        max_file_bytes: riffle_connectors::images::DEFAULT_MAX_FILE_BYTES,
    })
    .build()?;
    let produced = replay(
        &brokers,
        &Default::default(),
        &topic,
        frames.as_ref(),
        None,
        Pace {
            messages_per_second: None,
        },
    )?;
    let yaml = std::fs::read_to_string(repo.join("pipelines/camera-perception-kafka.yaml"))?
        .replace("../", &format!("{}/", repo.display()))
        .replace("127.0.0.1:9092", &brokers)
        .replace("topic: cameras", &format!("topic: {topic}"));
    let yaml = match (yaml.find("sink:"), yaml.find("runtime:")) {
        (Some(a), Some(b)) => format!(
            "{}sink: {{ jsonl: {{ path: out.jsonl }} }}\n\n{}",
            &yaml[..a],
            &yaml[b..]
        ),
        _ => anyhow::bail!("unexpected pipeline layout"),
    };
    let file = tmp.join("pipeline.yaml");
    std::fs::write(&file, &yaml)?;

    // 1. Checkpoints off vs on, interleaved, best of 3.
    let (mut off, mut on) = (f64::MAX, f64::MAX);
    for round in 0..3 {
        off = off.min(run(&file, &tmp.join(format!("off{round}.jsonl")), None)?);
        on = on.min(run(
            &file,
            &tmp.join(format!("on{round}.jsonl")),
            Some(&tmp.join(format!("ckpt{round}"))),
        )?);
    }
    let n = produced.messages as f64;
    println!(
        "| camera pipeline from Kafka, {} frames, 2 workers | frames/s |",
        produced.messages
    );
    println!("|---|---:|");
    println!("| checkpoints off | {:.1} |", n / off);
    println!(
        "| checkpoints on (every epoch of 16 frames) | {:.1} |",
        n / on
    );
    println!("| ratio on / off | {:.2} |", off / on);

    // 2. One checkpoint write.
    let store = CheckpointStore::open(&tmp.join("writes"), 3)?;
    let mut times = Vec::new();
    for epoch in 0..200 {
        let checkpoint = Checkpoint {
            epoch,
            workers: 2,
            sources: BTreeMap::from([(
                format!("kafka:{topic}"),
                (0..4).map(|p| (p, epoch as i64 * 100)).collect(),
            )]),
            state: BTreeMap::from([("sink.position".to_string(), (epoch * 1000).to_string())]),
        };
        let started = Instant::now();
        store.write(&checkpoint)?;
        times.push(started.elapsed());
    }
    times.sort();
    println!();
    println!("| checkpoint write (200 writes) | p50 | p99 |");
    println!("|---|---:|---:|");
    println!(
        "| write + fsync + rename + fsync dir | {:.2} ms | {:.2} ms |",
        ms(times[100]),
        ms(times[197])
    );

    // 3. Kill to resume, 3 trials.
    let riffle = repo.join("target/release/riffle");
    anyhow::ensure!(
        riffle.is_file(),
        "build the binary first: cargo build --release"
    );
    println!();
    println!("| kill -9 of a worker process, 2 processes | first new result | caught up with the output at the kill |");
    println!("|---|---:|---:|");
    for trial in 0..3 {
        let out = tmp.join(format!("kill{trial}.jsonl"));
        let (resumed, caught_up) = kill_and_resume(
            &riffle,
            &file,
            &out,
            &tmp.join(format!("kckpt{trial}")),
            21000 + trial * 2,
        )?;
        println!(
            "| trial {} | {:.2} s | {:.2} s |",
            trial + 1,
            resumed.as_secs_f64(),
            caught_up.as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run(file: &Path, out: &Path, checkpoint: Option<&Path>) -> anyhow::Result<f64> {
    let mut pipeline = riffle_pipelines::load(file, Some(out))?;
    pipeline.runtime.checkpoint = checkpoint.map(|dir| riffle_pipelines::spec::CheckpointConfig {
        dir: Some(dir.to_path_buf()),
        ..Default::default()
    });
    let started = Instant::now();
    riffle_pipelines::run::execute(
        Arc::new(pipeline),
        &ClusterConfig::single_process(2),
        Metrics::new()?,
    )?;
    Ok(started.elapsed().as_secs_f64())
}

/// Time from the kill until the results file grows again, and until it passes its length at
/// the kill (the work since the last checkpoint redone).
fn kill_and_resume(
    riffle: &Path,
    file: &Path,
    out: &Path,
    ckpt: &Path,
    port: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let mut supervisor = std::process::Command::new(riffle)
        .args(["run", "-q"])
        .arg(file)
        .args([
            "--processes",
            "2",
            "--workers",
            "1",
            "--base-port",
            &port.to_string(),
            "--output",
        ])
        .arg(out)
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .env("RUST_LOG", "error")
        .stderr(std::process::Stdio::null())
        .spawn()?;
    // Let it produce results first.
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while len(out) < 2000 {
        anyhow::ensure!(Instant::now() < deadline, "no output");
        std::thread::sleep(Duration::from_millis(20));
    }
    let needle = file.to_string_lossy().into_owned();
    let victim = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(&needle) && cmdline.contains("--process 1")
        })
        .ok_or_else(|| anyhow::anyhow!("no worker process found"))?;
    let before = len(out);
    std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()?;
    let killed = Instant::now();
    // The restart cuts the file back to the checkpoint; output has resumed once it grows
    // again, and has caught up once it passes its length at the kill.
    let mut lowest = before;
    let mut resumed = None;
    loop {
        let now = len(out);
        lowest = lowest.min(now);
        if resumed.is_none() && now > lowest {
            resumed = Some(killed.elapsed());
        }
        if now > before {
            break;
        }
        anyhow::ensure!(
            killed.elapsed() < Duration::from_secs(60),
            "output did not resume"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let caught_up = killed.elapsed();
    supervisor.wait()?;
    Ok((resumed.unwrap_or(caught_up), caught_up))
}
