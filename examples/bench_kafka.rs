//! Kafka benchmark (not a test): needs a broker (`scripts/kafka.sh start`) and ONNX Runtime.
//!
//!     cargo run --release --example bench_kafka -- [BROKERS]
//!
//! Prints, from one run:
//! 1. Kafka → Arrow ingest: Riffle's Kafka source vs a plain rdkafka consumer reading the same
//!    topic (the consumer only touches payloads; the source also builds Arrow batches, and for
//!    JSON decodes every message into columns). Target ratio ≥ 0.9. Set-up (metadata, schema
//!    inference, partition assignment) is excluded from both timings.
//! 2. The camera pipeline end to end, frames from Kafka vs the same frames from files.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use riffle_connectors::kafka::replay::{ensure_topic, replay, Pace, TopicSpec};
use riffle_connectors::kafka::{KafkaSourceConfig, KafkaSourceFactory};
use riffle_connectors::{CsvSourceConfig, ImagesConfig, PartitionBy, SourceConfig};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::metrics::Metrics;
use riffle_dataflow::SourceFactory;

fn main() -> anyhow::Result<()> {
    let brokers = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".into());
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
    })
    .build()?;
    for _ in 0..20 {
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
    let frames = images(&repo, 4);
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

    println!("| ingest ({brokers}) | messages | plain rdkafka consumer msg/s | riffle Kafka source rows/s | ratio |");
    println!("|---|---:|---:|---:|---:|");
    for (topic, format, label) in [
        (&clicks, "json", "clicks as JSON → Arrow columns"),
        (&frames_topic, "raw", "frames as raw bytes → Arrow"),
    ] {
        // Interleaved, best of 3, so both see the same broker and page-cache state.
        let (mut plain, mut ours, mut n) = (f64::MAX, f64::MAX, 0);
        for _ in 0..3 {
            let (count, t) = plain_consumer(&brokers, topic)?;
            plain = plain.min(t.as_secs_f64());
            let (rows, t) = riffle_source(&brokers, topic, format)?;
            ours = ours.min(t.as_secs_f64());
            anyhow::ensure!(
                rows == count,
                "source read {rows} rows, consumer {count} messages"
            );
            n = count;
        }
        let (a, b) = (n as f64 / plain, n as f64 / ours);
        println!("| {label} | {n} | {a:.0} | {b:.0} | {:.2} |", b / a);
    }

    // 2. End to end: the camera pipeline from Kafka vs from files, 250 frames, 2 workers.
    let cameras = format!("bench-cameras-{run_id}");
    ensure_topic(&brokers, &Default::default(), &TopicSpec::new(&cameras, 4))?;
    replay(
        &brokers,
        &Default::default(),
        &cameras,
        images(&repo, 1).as_ref(),
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
    let kafka_file = repo
        .join("pipelines")
        .join(format!(".bench-kafka-{run_id}.yaml"));
    std::fs::write(&kafka_file, kafka_yaml)?;
    let out = std::env::temp_dir().join(format!("bench-e2e-{run_id}.jsonl"));
    let mut from_kafka = f64::MAX;
    let mut from_files = f64::MAX;
    for _ in 0..3 {
        from_kafka = from_kafka.min(run_pipeline(&kafka_file, None)?);
        from_files = from_files.min(run_pipeline(
            &repo.join("pipelines/camera-perception.yaml"),
            Some(&out),
        )?);
    }
    let _ = std::fs::remove_file(&kafka_file);
    println!();
    println!("| camera pipeline, 250 frames, 2 workers | frames/s |");
    println!("|---|---:|");
    println!("| from files | {:.1} |", 250.0 / from_files);
    println!(
        "| from Kafka (and results to Kafka) | {:.1} |",
        250.0 / from_kafka
    );
    println!("| ratio Kafka / files | {:.2} |", from_files / from_kafka);
    Ok(())
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
    })
    .build()
    .expect("bundled frames")
}

fn plain_consumer(brokers: &str, topic: &str) -> anyhow::Result<(u64, Duration)> {
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
        list.add_partition_offset(topic, p.id(), Offset::Beginning)?;
    }
    consumer.assign(&list)?;
    // Steady-state ingest: set-up (metadata, watermarks, assignment) is not timed.
    let started = Instant::now();
    let (mut count, mut bytes) = (0u64, 0usize);
    while remaining > 0 {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            bytes += message?.payload().map_or(0, |p| p.len());
            count += 1;
            remaining -= 1;
        }
    }
    std::hint::black_box(bytes);
    Ok((count, started.elapsed()))
}

fn riffle_source(brokers: &str, topic: &str, format: &str) -> anyhow::Result<(u64, Duration)> {
    let config: KafkaSourceConfig = serde_saphyr::from_str(&format!(
        "{{ brokers: \"{brokers}\", topic: {topic}, format: {format}, stop_at_end: true, batch_size: 1024 }}"
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
    riffle_pipelines::run(
        pipeline,
        riffle_pipelines::RunOptions {
            cluster: ClusterConfig::single_process(2),
            metrics: Metrics::new()?,
        },
    )?;
    Ok(started.elapsed().as_secs_f64())
}
