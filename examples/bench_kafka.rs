//! Kafka benchmark (not a test): needs a broker (`scripts/kafka.sh start`) and ONNX Runtime.
//!
//!     cargo run --release --example bench_kafka -- [BROKERS] [ROUNDS]
//!
//! (`scripts/bench-kafka.sh` runs it and writes docs/benchmarks/kafka.md.) Every figure is the
//! median, with the range, of ROUNDS (default 5) interleaved rounds. Prints, from one run:
//! 1. Kafka → Arrow ingest: Riffle's Kafka source vs a plain rdkafka consumer reading the same
//!    topic and doing the same job the plain way (parsing each JSON message with serde_json;
//!    keeping each raw payload), target ratio ≥ 0.9; and vs a bare poll that reads payload
//!    lengths only (librdkafka's ceiling: no consumer that uses its data gets there). Set-up
//!    (metadata, schema inference, partition assignment) is excluded from every timing.
//! 2. The camera pipeline end to end, frames from Kafka vs the same frames from files, and
//!    Kafka → Kafka with checkpoints (exactly-once through Kafka transactions).

mod common;

use common::spread;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use riffle_connectors::kafka::replay::{replay, Pace};
use riffle_connectors::kafka::topics::{ensure_topic, TopicSpec};
use riffle_connectors::kafka::{KafkaSourceConfig, KafkaSourceFactory};
use riffle_connectors::{CsvSourceConfig, ImagesConfig, PartitionBy, SourceConfig};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::SourceFactory;

/// Replays of the 2,000-click sample and of the 250 frames in the ingest topics: enough that
/// fetching, not the first poll, is timed.
const CLICK_REPLAYS: usize = 100;
const FRAME_REPLAYS: usize = 48;
/// Replays of the bundled 250 frames in the end-to-end runs.
const REPEAT: usize = 4;
const FRAMES: f64 = 250.0 * REPEAT as f64;

fn main() -> anyhow::Result<()> {
    let brokers = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".into());
    let rounds: usize = match std::env::args().nth(2) {
        Some(r) => r.parse()?,
        None => 5,
    };
    anyhow::ensure!(rounds >= 1, "ROUNDS must be at least 1");
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let run_id = std::process::id();

    // 1. Ingest: 2,000 clicks replayed 20 times as JSON, and 1,000 frames as raw bytes.
    let clicks = format!("bench-clicks-{run_id}");
    ensure_topic(&brokers, &Default::default(), &TopicSpec::new(&clicks, 4))?;
    let csv = SourceConfig::Csv(CsvSourceConfig {
        path: repo.join("data/clickstream/obd-random-all-2000.csv"),
        has_header: true,
        batch_size: 2000,
        delimiter: None,
        max_line_bytes: riffle_connectors::DEFAULT_MAX_LINE_BYTES,
        schema: None,
    })
    .build()?;
    for _ in 0..CLICK_REPLAYS {
        replay(
            &brokers,
            &Default::default(),
            &clicks,
            csv.as_ref(),
            Some("user_feature_0"),
            Pace {
                messages_per_second: None,
            },
        )?;
    }
    let frames_topic = format!("bench-frames-{run_id}");
    ensure_topic(
        &brokers,
        &Default::default(),
        &TopicSpec::new(&frames_topic, 4),
    )?;
    let frames = images(&repo, FRAME_REPLAYS);
    replay(
        &brokers,
        &Default::default(),
        &frames_topic,
        frames.as_ref(),
        None,
        Pace {
            messages_per_second: None,
        },
    )?;

    println!("| ingest ({brokers}), median (range) of {rounds} rounds | messages | bare poll msg/s | plain consumer msg/s | riffle Kafka source rows/s | ratio to plain consumer | ratio to bare poll |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (topic, format, label) in [
        (&clicks, "json", "clicks as JSON → Arrow columns"),
        (&frames_topic, "raw", "frames as raw bytes → Arrow"),
    ] {
        // Interleaved, so all three see the same broker and page-cache state.
        let (mut bare, mut plain, mut ours) = (Vec::new(), Vec::new(), Vec::new());
        let (mut to_plain, mut to_bare, mut n) = (Vec::new(), Vec::new(), 0);
        for _ in 0..rounds {
            let (count, t_bare) = plain_consumer(&brokers, topic, Work::Length)?;
            let work = if format == "json" {
                Work::Json
            } else {
                Work::Keep
            };
            let (kept, t_plain) = plain_consumer(&brokers, topic, work)?;
            let (rows, t_ours) = riffle_source(&brokers, topic, format)?;
            anyhow::ensure!(
                rows == count && kept == count,
                "source read {rows} rows, consumers {count} and {kept} messages"
            );
            n = count;
            bare.push(count as f64 / t_bare.as_secs_f64());
            plain.push(count as f64 / t_plain.as_secs_f64());
            ours.push(rows as f64 / t_ours.as_secs_f64());
            to_plain.push(t_plain.as_secs_f64() / t_ours.as_secs_f64());
            to_bare.push(t_bare.as_secs_f64() / t_ours.as_secs_f64());
        }
        println!(
            "| {label} | {n} | {} | {} | {} | {} | {} |",
            spread(&bare, 0),
            spread(&plain, 0),
            spread(&ours, 0),
            spread(&to_plain, 2),
            spread(&to_bare, 2)
        );
    }

    if std::env::var("BENCH_KAFKA_ONLY").as_deref() == Ok("ingest") {
        return Ok(());
    }

    // 2. End to end: the camera pipeline from Kafka vs from files, the bundled 250 frames
    // replayed 4 times (1,000 frames: long enough that start-up is not most of the run).
    let cameras = format!("bench-cameras-{run_id}");
    ensure_topic(&brokers, &Default::default(), &TopicSpec::new(&cameras, 4))?;
    replay(
        &brokers,
        &Default::default(),
        &cameras,
        images(&repo, REPEAT).as_ref(),
        None,
        Pace {
            messages_per_second: None,
        },
    )?;
    let kafka_yaml = std::fs::read_to_string(repo.join("pipelines/camera-perception-kafka.yaml"))?
        .replace("127.0.0.1:9092", &brokers)
        .replace("topic: cameras", &format!("topic: {cameras}"))
        .replace(
            "topic: detections",
            &format!("topic: bench-detections-{run_id}"),
        );
    let kafka_file = beside_pipelines(&repo, &format!(".bench-kafka-{run_id}.yaml"), &kafka_yaml)?;
    let files_yaml = std::fs::read_to_string(repo.join("pipelines/camera-perception.yaml"))?
        .replace(
            "    batch_size: 4\n",
            &format!("    batch_size: 4\n    repeat: {REPEAT}\n"),
        );
    anyhow::ensure!(
        files_yaml.contains("repeat:"),
        "no images batch_size to extend"
    );
    let files_file = beside_pipelines(&repo, &format!(".bench-files-{run_id}.yaml"), &files_yaml)?;
    let out = std::env::temp_dir().join(format!("bench-e2e-{run_id}.jsonl"));
    let (mut files, mut kafka, mut exactly_once) = (Vec::new(), Vec::new(), Vec::new());
    let (mut kafka_ratio, mut eo_ratio) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let f = run_pipeline(&files_file, Some(&out))?;
        let k = run_pipeline(&kafka_file, None)?;
        // Exactly-once: a fresh results topic and checkpoint directory each round.
        let checkpoints = tempfile::tempdir()?;
        let eo_yaml = std::fs::read_to_string(&kafka_file)?
            .replace(
                &format!("topic: bench-detections-{run_id}"),
                &format!("topic: bench-detections-eo-{run_id}-{round}"),
            )
            .replace(
                "epoch_records: 16",
                &format!(
                    "epoch_records: 16\n  checkpoint: {{ dir: \"{}\", interval_ms: 1000 }}",
                    checkpoints.path().display()
                ),
            );
        anyhow::ensure!(
            eo_yaml.contains("checkpoint:"),
            "no runtime.epoch_records to extend"
        );
        let eo_file = beside_pipelines(&repo, &format!(".bench-kafka-eo-{run_id}.yaml"), &eo_yaml)?;
        let e = run_pipeline(&eo_file, None);
        let _ = std::fs::remove_file(&eo_file);
        let e = e?;
        files.push(FRAMES / f);
        kafka.push(FRAMES / k);
        exactly_once.push(FRAMES / e);
        kafka_ratio.push(f / k);
        eo_ratio.push(f / e);
    }
    let _ = std::fs::remove_file(&kafka_file);
    let _ = std::fs::remove_file(&files_file);
    println!();
    println!("| camera pipeline, {FRAMES} frames, 2 workers, median (range) of {rounds} rounds | frames/s | ratio to files |");
    println!("|---|---:|---:|");
    println!("| from files | {} | 1 |", spread(&files, 1));
    println!(
        "| Kafka → Kafka | {} | {} |",
        spread(&kafka, 1),
        spread(&kafka_ratio, 2)
    );
    println!(
        "| Kafka → Kafka, exactly-once (checkpoints every 1 s, transactions) | {} | {} |",
        spread(&exactly_once, 1),
        spread(&eo_ratio, 2)
    );
    Ok(())
}

/// Writes a pipeline file into `pipelines/`, beside the shipped ones, so that their relative
/// paths (models, data) hold.
fn beside_pipelines(
    repo: &std::path::Path,
    name: &str,
    yaml: &str,
) -> anyhow::Result<std::path::PathBuf> {
    let file = repo.join("pipelines").join(name);
    std::fs::write(&file, yaml)?;
    Ok(file)
}

fn images(repo: &std::path::Path, repeat: usize) -> Box<dyn SourceFactory> {
    SourceConfig::Images(ImagesConfig {
        path: repo.join("data/frames"),
        cameras: Some(4),
        batch_size: 64,
        repeat,
        extensions: vec!["jpg".into()],
        partition_by: PartitionBy::Camera,
        max_records_per_second: None,
        fps: None,
        max_file_bytes: riffle_connectors::images::DEFAULT_MAX_FILE_BYTES,
    })
    .build()
    .expect("bundled frames")
}

/// What the plain consumer does with each message.
#[derive(Clone, Copy)]
enum Work {
    /// Reads the payload's length: librdkafka's own ceiling, a consumer that uses nothing.
    Length,
    /// Keeps the payload (`to_vec`), as a consumer that hands frames on must.
    Keep,
    /// Parses the payload with serde_json and keeps the value: the plain way to consume JSON.
    Json,
}

fn plain_consumer(brokers: &str, topic: &str, work: Work) -> anyhow::Result<(u64, Duration)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "bench-plain")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut list = TopicPartitionList::new();
    let mut remaining = 0i64;
    for p in metadata.topics()[0].partitions() {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        remaining += high - low;
        // An explicit offset, as Riffle's source resolves its start before assigning.
        list.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
    }
    consumer.assign(&list)?;
    // Steady-state ingest: set-up (metadata, watermarks, assignment) is not timed.
    let started = Instant::now();
    let (mut count, mut bytes) = (0u64, 0usize);
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut values: Vec<serde_json::Value> = Vec::new();
    while remaining > 0 {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message?;
            let payload = message.payload().unwrap_or_default();
            match work {
                Work::Length => bytes += payload.len(),
                Work::Keep => kept.push(payload.to_vec()),
                Work::Json => values.push(serde_json::from_slice(payload)?),
            }
            count += 1;
            remaining -= 1;
        }
    }
    std::hint::black_box((bytes, &kept, &values));
    Ok((count, started.elapsed()))
}

fn riffle_source(brokers: &str, topic: &str, format: &str) -> anyhow::Result<(u64, Duration)> {
    // Batches of about 2 MB: 1,024 clicks, 64 frames.
    let batch = if format == "raw" { 64 } else { 1024 };
    let config: KafkaSourceConfig = serde_saphyr::from_str(&format!(
        "{{ brokers: \"{brokers}\", topic: {topic}, format: {format}, stop_at_end: true, batch_size: {batch} }}"
    ))?;
    let factory = KafkaSourceFactory::new(&config)?;
    let mut source = factory.partition(0, 1)?;
    // As for the plain consumer, set-up (metadata, schema inference, assignment) is not timed.
    let started = Instant::now();
    let mut rows = 0u64;
    while let Some(batch) = source.next_batch()? {
        rows += batch.records.num_rows() as u64;
    }
    Ok((rows, started.elapsed()))
}

fn run_pipeline(file: &std::path::Path, output: Option<&std::path::Path>) -> anyhow::Result<f64> {
    let pipeline = Arc::new(riffle_pipelines::load(file, output)?);
    let started = Instant::now();
    riffle_pipelines::run::execute(pipeline, &ClusterConfig::single_process(2), Metrics::new()?)?;
    Ok(started.elapsed().as_secs_f64())
}
