//! Kafka benchmark (not a test): needs a broker (`scripts/kafka.sh start`) and ONNX Runtime.
//!
//!     cargo run --release --example bench_kafka -- [BROKERS] [ROUNDS]
//!
//! (`scripts/bench-kafka.sh` runs it and writes docs/benchmarks/kafka.md.) Every figure is the
//! median, with the range, of ROUNDS (default 5) interleaved rounds. Prints, from one run:
//! 1. Kafka → Arrow ingest: Riffle's Kafka source vs a plain rdkafka consumer reading the same
//!    topic and doing the same job the plain way (parsing each JSON message with serde_json;
//!    decoding each Avro message with arrow-avro's `Decoder` into batches of 1,024 rows;
//!    decoding each Protobuf message with prost-reflect's `DynamicMessage`; keeping each raw
//!    payload), target ratio ≥ 0.9; and vs a bare poll that reads payload lengths only
//!    (librdkafka's ceiling: no consumer that uses its data gets there). Set-up (metadata,
//!    schema inference and fetching, partition assignment) is excluded from every timing. The
//!    Avro and Protobuf topics are in the schema registry's framing: they need a registry at
//!    `RIFFLE_REGISTRY_URL` (`scripts/registry.sh start`). In every row the plain consumer's
//!    output must equal Riffle's in every round (rows and a digest of every column; for raw
//!    frames, of the payloads) or the row's ratios read "outputs differ".
//! 2. The camera pipeline end to end, frames from Kafka vs the same frames from files, and
//!    Kafka → Kafka with checkpoints (exactly-once through Kafka transactions); each Kafka run's
//!    results topic must hold the files run's results or its ratio reads "outputs differ".

mod common;

use common::spread;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use arrow_avro::reader::{Decoder as AvroReader, ReaderBuilder as AvroReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{DataType, Schema, TimeUnit};
use prost_reflect::{DynamicMessage, MessageDescriptor, ReflectMessage, Value};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use riffle_connectors::formats::avro::AvroEncoder;
use riffle_connectors::kafka::replay::{replay, replay_schemaful, Pace};
use riffle_connectors::kafka::topics::{ensure_topic, TopicSpec};
use riffle_connectors::kafka::{KafkaSinkConfig, KafkaSourceConfig, KafkaSourceFactory};
use riffle_connectors::{CsvSourceConfig, ImagesConfig, PartitionBy, SourceConfig};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::SourceFactory;

/// Replays of the 2,000-click sample and of the 250 frames in the ingest topics: enough that
/// fetching, not the first poll, is timed.
const CLICK_REPLAYS: usize = 100;
const FRAME_REPLAYS: usize = 48;
/// librdkafka stops fetching a partition whose local queue is over `queued.min.messages` or
/// `queued.max.messages.kbytes` for `fetch.queue.backoff.ms` (1 s by default), however soon the
/// queue drains. The clicks' keys put 198,600 of them in one partition, so any reader slower
/// than the broker sat out most of a second at the end of the topic whatever it did with the
/// messages. Riffle's source sets a short backoff by default; the plain readers here ask for
/// the same, so that decoding, not the timer, is measured.
const FETCH_QUEUE_BACKOFF_MS: &str = "10";
/// Replays of the bundled 250 frames in the end-to-end runs.
const REPEAT: usize = 4;
const FRAMES: f64 = 250.0 * REPEAT as f64;

fn main() -> anyhow::Result<()> {
    // RUST_LOG=riffle_connectors::kafka=debug shows where a run's start-up and commits wait.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
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
    let registry = std::env::var("RIFFLE_REGISTRY_URL").map_err(|_| {
        anyhow::anyhow!(
            "RIFFLE_REGISTRY_URL is not set: the Avro and Protobuf ingest rows need a schema \
             registry (scripts/registry.sh start, then eval \"$(scripts/registry.sh env)\"; \
             scripts/bench-kafka.sh does both)"
        )
    })?;

    // BENCH_KAFKA_ONLY=e2e skips the ingest rows, =ingest the end-to-end ones.
    if std::env::var("BENCH_KAFKA_ONLY").as_deref() != Ok("e2e") {
        // 1. Ingest: 2,000 clicks replayed 100 times as JSON, as Avro and as Protobuf, and the
        // frames ×48 as raw bytes.
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
        // The same clicks as Avro and as Protobuf in the registry's framing, their schemas derived
        // from the CSV's columns and registered by the sink that writes them.
        let schemas = tempfile::tempdir()?;
        let click_columns = csv.schema()?;
        let avsc = schemas.path().join("click.avsc");
        let avro_text = AvroEncoder::new(&click_columns, None, "bench.Click")?
            .schema_text()
            .to_string();
        std::fs::write(&avsc, &avro_text)?;
        let proto = schemas.path().join("click.proto");
        std::fs::write(&proto, proto_text(&click_columns)?)?;
        let avro_topic = format!("bench-clicks-avro-{run_id}");
        let proto_topic = format!("bench-clicks-protobuf-{run_id}");
        let avro_block = format!("avro: {{ schema: \"{}\" }}", avsc.display());
        let proto_block = format!(
            "protobuf: {{ proto: \"{}\", message: bench.Click }}",
            proto.display()
        );
        let registry_block = format!("schema_registry: {{ url: \"{registry}\" }}");
        for (topic, format, block) in [
            (&avro_topic, "avro", &avro_block),
            (&proto_topic, "protobuf", &proto_block),
        ] {
            ensure_topic(&brokers, &Default::default(), &TopicSpec::new(topic, 4))?;
            // Keyed as the JSON clicks are.
            let sink: KafkaSinkConfig = serde_saphyr::from_str(&format!(
            "{{ brokers: \"{brokers}\", topic: {topic}, format: {format}, key: user_feature_0, {block}, {registry_block} }}"
        ))?;
            for _ in 0..CLICK_REPLAYS {
                replay_schemaful(
                    &sink,
                    csv.as_ref(),
                    Pace {
                        messages_per_second: None,
                    },
                )?;
            }
        }
        // The plain consumers' schemas, had before timing as a user would: the writer schema from
        // the registry by subject, the .proto compiled with protox.
        let avro_work = {
            let (id, writer) = latest_schema(&registry, &format!("{avro_topic}-value"))?;
            Work::Avro {
                id,
                writer,
                reader: avro_text.clone(),
            }
        };
        let proto_work = {
            let mut compiler = protox::Compiler::new([schemas.path()])?;
            compiler.open_file("click.proto")?;
            let message = compiler
                .descriptor_pool()
                .get_message_by_name("bench.Click")
                .context("bench.Click not in the compiled click.proto")?;
            Work::Protobuf(message)
        };

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
        let avro_source = format!("{avro_block}, {registry_block}");
        let proto_source = format!("{proto_block}, {registry_block}");
        let rows: [(&str, &str, &str, Work, &str); 4] = [
            (
                &clicks,
                "json",
                "",
                Work::Json,
                "clicks as JSON → Arrow columns",
            ),
            (
                &avro_topic,
                "avro",
                &avro_source,
                avro_work,
                "clicks as Avro (registry framing) → Arrow columns",
            ),
            (
                &proto_topic,
                "protobuf",
                &proto_source,
                proto_work,
                "clicks as Protobuf (registry framing) → Arrow columns",
            ),
            (
                &frames_topic,
                "raw",
                "",
                Work::Keep,
                "frames as raw bytes → Arrow",
            ),
        ];
        for (topic, format, settings, work, label) in &rows {
            // Interleaved, so all three see the same broker and page-cache state.
            let (mut bare, mut plain, mut ours) = (Vec::new(), Vec::new(), Vec::new());
            let (mut to_plain, mut to_bare, mut n) = (Vec::new(), Vec::new(), 0);
            let mut differ = false;
            for _ in 0..rounds {
                let (count, t_bare, _) = plain_consumer(&brokers, topic, &Work::Length)?;
                let (kept, t_plain, plain_output) = plain_consumer(&brokers, topic, work)?;
                let (rows, t_ours, our_output) = riffle_source(&brokers, topic, format, settings)?;
                anyhow::ensure!(
                    rows == count && kept == count,
                    "source read {rows} rows, consumers {count} and {kept} messages"
                );
                // Every round is compared; a reader that kept nothing to compare counts as differing.
                if plain_output.is_none() || plain_output != our_output {
                    eprintln!("{label}: outputs differ\n  plain consumer: {plain_output:?}\n  riffle: {our_output:?}");
                    differ = true;
                }
                n = count;
                bare.push(count as f64 / t_bare.as_secs_f64());
                plain.push(count as f64 / t_plain.as_secs_f64());
                ours.push(rows as f64 / t_ours.as_secs_f64());
                to_plain.push(t_plain.as_secs_f64() / t_ours.as_secs_f64());
                to_bare.push(t_bare.as_secs_f64() / t_ours.as_secs_f64());
            }
            // Project rule: no ratio between outputs that are not the same.
            let (ratio_plain, ratio_bare) = if differ {
                ("outputs differ".to_string(), "outputs differ".to_string())
            } else {
                (spread(&to_plain, 2), spread(&to_bare, 2))
            };
            println!(
                "| {label} | {n} | {} | {} | {} | {ratio_plain} | {ratio_bare} |",
                spread(&bare, 0),
                spread(&plain, 0),
                spread(&ours, 0),
            );
        }
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
    // Equal work: the Kafka runs are the files pipeline (its stages, model batching, epochs
    // and flow control) with the shipped Kafka pipeline's source and sink swapped in.
    let files_yaml = std::fs::read_to_string(repo.join("pipelines/camera-perception.yaml"))?;
    let shipped_kafka =
        std::fs::read_to_string(repo.join("pipelines/camera-perception-kafka.yaml"))?
            .replace("127.0.0.1:9092", &brokers)
            .replace("topic: cameras", &format!("topic: {cameras}"))
            .replace(
                "topic: detections",
                &format!("topic: bench-detections-{run_id}"),
            );
    let kafka_yaml = swap_block(
        &swap_block(&files_yaml, &shipped_kafka, "source")?,
        &shipped_kafka,
        "sink",
    )?;
    let files_yaml =
        files_yaml.replace("  images:\n", &format!("  images:\n    repeat: {REPEAT}\n"));
    anyhow::ensure!(files_yaml.contains("repeat:"), "no images source to extend");
    let files_file = beside_pipelines(&repo, &format!(".bench-files-{run_id}.yaml"), &files_yaml)?;
    let out = std::env::temp_dir().join(format!("bench-e2e-{run_id}.jsonl"));
    let (mut files, mut kafka, mut exactly_once) = (Vec::new(), Vec::new(), Vec::new());
    let (mut kafka_ratio, mut eo_ratio) = (Vec::new(), Vec::new());
    // Project rule: no ratio between runs whose results differ. Each round's Kafka results
    // (a topic of their own) are compared with the files run's of the same round.
    let (mut kafka_differ, mut eo_differ) = (false, false);
    for round in 0..rounds {
        let f = run_pipeline(&files_file, Some(&out))?;
        let from_files = file_results(&out)?;
        let results_topic = format!("bench-detections-{run_id}-{round}");
        let round_file = beside_pipelines(
            &repo,
            &format!(".bench-kafka-{run_id}-{round}.yaml"),
            &kafka_yaml.replace(
                &format!("topic: bench-detections-{run_id}"),
                &format!("topic: {results_topic}"),
            ),
        )?;
        let k = run_pipeline(&round_file, None);
        let _ = std::fs::remove_file(&round_file);
        let k = k?;
        kafka_differ |= differ(
            "Kafka → Kafka",
            &from_files,
            &topic_results(&brokers, &results_topic)?,
        );
        // Exactly-once: a fresh results topic and checkpoint directory each round.
        let checkpoints = tempfile::tempdir()?;
        let eo_topic = format!("bench-detections-eo-{run_id}-{round}");
        let eo_yaml = kafka_yaml
            .replace(
                &format!("topic: bench-detections-{run_id}"),
                &format!("topic: {eo_topic}"),
            )
            .replace(
                "\nruntime:\n",
                &format!(
                    "\nruntime:\n  checkpoint: {{ dir: \"{}\", interval_ms: 1000 }}\n",
                    checkpoints.path().display()
                ),
            );
        anyhow::ensure!(
            eo_yaml.contains("checkpoint:"),
            "no runtime block to extend"
        );
        let eo_file = beside_pipelines(&repo, &format!(".bench-kafka-eo-{run_id}.yaml"), &eo_yaml)?;
        let e = run_pipeline(&eo_file, None);
        let _ = std::fs::remove_file(&eo_file);
        let e = e?;
        eo_differ |= differ(
            "Kafka → Kafka, exactly-once",
            &from_files,
            &topic_results(&brokers, &eo_topic)?,
        );
        files.push(FRAMES / f);
        kafka.push(FRAMES / k);
        exactly_once.push(FRAMES / e);
        kafka_ratio.push(f / k);
        eo_ratio.push(f / e);
    }
    let _ = std::fs::remove_file(&files_file);
    println!();
    println!("| camera pipeline, {FRAMES} frames, 2 workers, median (range) of {rounds} rounds | frames/s | ratio to files |");
    println!("|---|---:|---:|");
    println!("| from files | {} | 1 |", spread(&files, 1));
    let ratio = |differ: bool, ratios: &[f64]| {
        if differ {
            "outputs differ".to_string()
        } else {
            spread(ratios, 2)
        }
    };
    println!(
        "| Kafka → Kafka | {} | {} |",
        spread(&kafka, 1),
        ratio(kafka_differ, &kafka_ratio)
    );
    println!(
        "| Kafka → Kafka, exactly-once (checkpoints every 1 s, transactions) | {} | {} |",
        spread(&exactly_once, 1),
        ratio(eo_differ, &eo_ratio)
    );
    Ok(())
}

/// `yaml` with its top-level `key:` block (that line and the indented and comment lines
/// under it) replaced by the block of the same key in `from`.
fn swap_block(yaml: &str, from: &str, key: &str) -> anyhow::Result<String> {
    fn span(text: &str, key: &str) -> Option<(usize, usize)> {
        let head = format!("{key}:");
        let mut offset = 0;
        let mut start = None;
        for line in text.split_inclusive('\n') {
            let top = !line.starts_with([' ', '#', '\n']);
            match start {
                None if top && line.starts_with(&head) => start = Some(offset),
                Some(s) if top => return Some((s, offset)),
                _ => {}
            }
            offset += line.len();
        }
        start.map(|s| (s, text.len()))
    }
    let (a, b) = span(yaml, key).with_context(|| format!("no top-level `{key}:` to swap"))?;
    let (c, d) = span(from, key).with_context(|| format!("no top-level `{key}:` to take"))?;
    Ok(format!("{}{}{}", &yaml[..a], &from[c..d], &yaml[b..]))
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
enum Work {
    /// Reads the payload's length: librdkafka's own ceiling, a consumer that uses nothing.
    Length,
    /// Keeps the payload (`to_vec`), as a consumer that hands frames on must.
    Keep,
    /// Parses the payload with serde_json and keeps the value: the plain way to consume JSON.
    Json,
    /// Feeds the payload (registry framing included) to an arrow-avro `Decoder` whose schema
    /// store holds writer schema `id`, read into `reader`; batches of 1,024 rows are flushed
    /// and kept: Arrow columns out, as Riffle's.
    Avro {
        id: u32,
        writer: String,
        reader: String,
    },
    /// Decodes the message after the registry's prefix and message index with prost-reflect
    /// and keeps it (prost-reflect's own output: no Arrow columns).
    Protobuf(MessageDescriptor),
}

/// Rows and a digest of each column's values, to hold two readers' outputs side by side.
type Output = Option<BTreeMap<String, u64>>;

fn plain_consumer(
    brokers: &str,
    topic: &str,
    work: &Work,
) -> anyhow::Result<(u64, Duration, Output)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "bench-plain")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
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
    let mut avro: Option<AvroReader> = match work {
        Work::Avro { id, writer, reader } => {
            let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
            store.set(Fingerprint::Id(*id), AvroSchema::new(writer.clone()))?;
            Some(
                AvroReaderBuilder::new()
                    .with_batch_size(1024)
                    .with_writer_schema_store(store)
                    .with_reader_schema(AvroSchema::new(reader.clone()))
                    .build_decoder()?,
            )
        }
        _ => None,
    };
    // Steady-state ingest: set-up (metadata, watermarks, assignment, schemas) is not timed.
    let started = Instant::now();
    let (mut count, mut bytes) = (0u64, 0usize);
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut values: Vec<serde_json::Value> = Vec::new();
    let mut batches: Vec<RecordBatch> = Vec::new();
    let mut messages: Vec<DynamicMessage> = Vec::new();
    while remaining > 0 {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message?;
            let payload = message.payload().unwrap_or_default();
            match work {
                Work::Length => bytes += payload.len(),
                Work::Keep => kept.push(payload.to_vec()),
                Work::Json => values.push(serde_json::from_slice(payload)?),
                Work::Avro { .. } => {
                    let decoder = avro.as_mut().context("no Avro decoder")?;
                    let read = decoder.decode(payload)?;
                    anyhow::ensure!(
                        read == payload.len(),
                        "Avro: {read} of {} bytes decoded",
                        payload.len()
                    );
                    if decoder.batch_is_full() {
                        batches.extend(decoder.flush()?);
                    }
                }
                Work::Protobuf(descriptor) => {
                    // A zero byte, the 4-byte schema id, then the message index (0: the first).
                    let body = match payload {
                        [0, _, _, _, _, 0, body @ ..] => body,
                        _ => anyhow::bail!("Protobuf: not the registry framing of message [0]"),
                    };
                    messages.push(DynamicMessage::decode(descriptor.clone(), body)?);
                }
            }
            count += 1;
            remaining -= 1;
        }
    }
    if let Some(decoder) = avro.as_mut() {
        batches.extend(decoder.flush()?);
    }
    let elapsed = started.elapsed();
    std::hint::black_box((bytes, &kept, &values));
    let output = match work {
        Work::Length => None,
        Work::Keep => Some(digest_payloads(&kept)),
        Work::Json => Some(digest_json(&values)?),
        Work::Avro { .. } => Some(digest_batches(&batches)?),
        Work::Protobuf(_) => Some(digest_messages(&messages)?),
    };
    Ok((count, elapsed, output))
}

/// Reads `topic` to its end with Riffle's Kafka source in `format`, with `settings` (more
/// fields of its configuration); its batches are kept and digested after timing (for `raw`, the
/// payload column only: the plain consumer keeps no partitions, offsets or headers).
fn riffle_source(
    brokers: &str,
    topic: &str,
    format: &str,
    settings: &str,
) -> anyhow::Result<(u64, Duration, Output)> {
    // Batches of about 2 MB: 1,024 clicks, 64 frames.
    let batch = if format == "raw" { 64 } else { 1024 };
    let settings = if settings.is_empty() {
        String::new()
    } else {
        format!(", {settings}")
    };
    let config: KafkaSourceConfig = serde_saphyr::from_str(&format!(
        "{{ brokers: \"{brokers}\", topic: {topic}, format: {format}, stop_at_end: true, batch_size: {batch}{settings} }}"
    ))?;
    let factory = KafkaSourceFactory::new(&config)?;
    let mut source = factory.partition(0, 1)?;
    // As for the plain consumer, set-up (metadata, schema inference, assignment) is not timed.
    let started = Instant::now();
    let mut rows = 0u64;
    let mut batches = Vec::new();
    while let Some(batch) = source.next_batch()? {
        rows += batch.records.num_rows() as u64;
        batches.push(batch.records);
    }
    let elapsed = started.elapsed();
    let mut output = digest_batches(&batches)?;
    if format == "raw" {
        output.retain(|column, _| {
            column == "(rows)" || column == riffle_connectors::formats::raw::BYTES
        });
    }
    Ok((rows, elapsed, Some(output)))
}

/// The latest schema of `subject` in the registry at `url`: its id and text.
fn latest_schema(url: &str, subject: &str) -> anyhow::Result<(u32, String)> {
    let address = format!("{url}/subjects/{subject}/versions/latest");
    let answer: serde_json::Value = ureq::get(&address)
        .call()
        .with_context(|| format!("GET {address}"))?
        .body_mut()
        .read_json()?;
    let id = answer["id"]
        .as_u64()
        .and_then(|id| u32::try_from(id).ok())
        .with_context(|| format!("{address}: no schema id in {answer}"))?;
    let schema = answer["schema"]
        .as_str()
        .with_context(|| format!("{address}: no schema text in {answer}"))?;
    Ok((id, schema.to_string()))
}

/// A proto3 message `bench.Click` with a field per column of `schema`, in order (timestamps as
/// `google.protobuf.Timestamp`, which Riffle reads into timestamp columns).
fn proto_text(schema: &Schema) -> anyhow::Result<String> {
    let mut fields = String::new();
    let mut timestamps = false;
    for (number, field) in (1..).zip(schema.fields()) {
        let kind = match field.data_type() {
            DataType::Int64 => "int64",
            DataType::Float64 => "double",
            DataType::Utf8 => "string",
            DataType::Boolean => "bool",
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                timestamps = true;
                "google.protobuf.Timestamp"
            }
            other => anyhow::bail!(
                "column `{}` is {other}: expected int64, float64, utf8, bool or a timestamp for a \
                 Protobuf field",
                field.name()
            ),
        };
        let name = field.name();
        anyhow::ensure!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && name.starts_with(|c: char| c.is_ascii_alphabetic()),
            "column `{name}` is not a Protobuf field name"
        );
        writeln!(fields, "  {kind} {name} = {number};")?;
    }
    let import = if timestamps {
        "import \"google/protobuf/timestamp.proto\";\n"
    } else {
        ""
    };
    Ok(format!(
        "syntax = \"proto3\";\npackage bench;\n{import}\nmessage Click {{\n{fields}}}\n"
    ))
}

/// One value, to hash the same whichever reader gave it.
enum Cell<'a> {
    Null,
    Int(i64),
    Float(f64),
    Str(&'a str),
    Bool(bool),
    Bytes(&'a [u8]),
}

/// FNV-1a of the value's kind and bytes.
fn cell_hash(cell: Cell<'_>) -> u64 {
    let (kind, bytes): (u8, Vec<u8>) = match cell {
        Cell::Null => (0, Vec::new()),
        Cell::Int(v) => (1, v.to_le_bytes().to_vec()),
        Cell::Float(v) => (2, v.to_bits().to_le_bytes().to_vec()),
        Cell::Str(v) => (3, v.as_bytes().to_vec()),
        Cell::Bool(v) => (4, vec![u8::from(v)]),
        Cell::Bytes(v) => (5, v.to_vec()),
    };
    std::iter::once(kind)
        .chain(bytes)
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The rows, and per column the sum of its values' hashes (order does not matter).
fn digest_batches(batches: &[RecordBatch]) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut digest = BTreeMap::new();
    for batch in batches {
        *digest.entry("(rows)".to_string()).or_default() += batch.num_rows() as u64;
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            let sum: &mut u64 = digest.entry(field.name().clone()).or_default();
            for i in 0..column.len() {
                let cell = if column.is_null(i) {
                    Cell::Null
                } else {
                    match column.data_type() {
                        DataType::Int64 => Cell::Int(column.as_primitive::<Int64Type>().value(i)),
                        DataType::Int32 => {
                            Cell::Int(column.as_primitive::<Int32Type>().value(i).into())
                        }
                        DataType::Float64 => {
                            Cell::Float(column.as_primitive::<Float64Type>().value(i))
                        }
                        DataType::Utf8 => Cell::Str(column.as_string::<i32>().value(i)),
                        DataType::Boolean => Cell::Bool(column.as_boolean().value(i)),
                        DataType::Binary => Cell::Bytes(column.as_binary::<i32>().value(i)),
                        DataType::Timestamp(TimeUnit::Microsecond, _) => {
                            Cell::Int(column.as_primitive::<TimestampMicrosecondType>().value(i))
                        }
                        other => anyhow::bail!("column `{}`: no digest of {other}", field.name()),
                    }
                };
                *sum = sum.wrapping_add(cell_hash(cell));
            }
        }
    }
    Ok(digest)
}

/// As [`digest_batches`], of raw payloads kept by the plain consumer: a `bytes` column.
fn digest_payloads(payloads: &[Vec<u8>]) -> BTreeMap<String, u64> {
    let sum = payloads
        .iter()
        .fold(0u64, |sum, p| sum.wrapping_add(cell_hash(Cell::Bytes(p))));
    BTreeMap::from([
        ("(rows)".to_string(), payloads.len() as u64),
        (riffle_connectors::formats::raw::BYTES.to_string(), sum),
    ])
}

/// As [`digest_batches`], of serde_json objects: a column per key seen in any of them (a
/// missing key is a null, as in the Arrow column), integers as `Int`, other numbers as `Float`.
fn digest_json(values: &[serde_json::Value]) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut objects = Vec::with_capacity(values.len());
    for value in values {
        objects.push(
            value
                .as_object()
                .context("a JSON click that is not an object")?,
        );
    }
    let mut digest: BTreeMap<String, u64> = objects
        .iter()
        .flat_map(|o| o.keys())
        .map(|k| (k.clone(), 0))
        .collect();
    digest.insert("(rows)".to_string(), objects.len() as u64);
    for object in objects {
        for (key, sum) in digest.iter_mut().filter(|(k, _)| *k != "(rows)") {
            let cell = match object.get(key) {
                None | Some(serde_json::Value::Null) => Cell::Null,
                Some(serde_json::Value::Bool(v)) => Cell::Bool(*v),
                Some(serde_json::Value::String(v)) => Cell::Str(v),
                Some(serde_json::Value::Number(n)) => match n.as_i64() {
                    Some(v) => Cell::Int(v),
                    None => Cell::Float(n.as_f64().context("a JSON number out of range")?),
                },
                Some(other) => anyhow::bail!("key `{key}`: no digest of {other}"),
            };
            *sum = sum.wrapping_add(cell_hash(cell));
        }
    }
    Ok(digest)
}

/// As [`digest_batches`], of prost-reflect messages (proto3: an absent field is its default).
fn digest_messages(messages: &[DynamicMessage]) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut digest = BTreeMap::new();
    for message in messages {
        *digest.entry("(rows)".to_string()).or_default() += 1;
        for field in message.descriptor().fields() {
            let value = message.get_field(&field);
            let cell = match value.as_ref() {
                Value::I64(v) => Cell::Int(*v),
                Value::I32(v) => Cell::Int((*v).into()),
                Value::F64(v) => Cell::Float(*v),
                Value::String(v) => Cell::Str(v),
                Value::Bool(v) => Cell::Bool(*v),
                // google.protobuf.Timestamp, as microseconds (a timestamp column's value).
                Value::Message(m) if m.descriptor().full_name() == "google.protobuf.Timestamp" => {
                    let part = |name: &str| {
                        m.get_field_by_name(name)
                            .and_then(|v| v.as_i64().or_else(|| v.as_i32().map(i64::from)))
                            .unwrap_or(0)
                    };
                    Cell::Int(part("seconds") * 1_000_000 + part("nanos") / 1_000)
                }
                other => anyhow::bail!("field `{}`: no digest of {other:?}", field.name()),
            };
            let sum: &mut u64 = digest.entry(field.name().to_string()).or_default();
            *sum = sum.wrapping_add(cell_hash(cell));
        }
    }
    Ok(digest)
}

/// The fields of a camera result that every run must agree on (the files run's `path` is a
/// file name and it adds `latency_ms`; the Kafka runs' `path` comes from a header).
const RESULT_KEYS: [&str; 4] = ["camera_id", "frame", "detections_count", "detections"];

/// One result as a canonical line of its [`RESULT_KEYS`].
fn canonical(line: &[u8]) -> anyhow::Result<String> {
    let value: serde_json::Value =
        serde_json::from_slice(line).context("a result that is not JSON")?;
    let mut kept = serde_json::Map::new();
    for key in RESULT_KEYS {
        let field = value
            .get(key)
            .with_context(|| format!("a result without `{key}`: {value}"))?;
        kept.insert(key.to_string(), field.clone());
    }
    Ok(serde_json::Value::Object(kept).to_string())
}

/// The files run's results, canonical and sorted.
fn file_results(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(canonical)
        .collect::<anyhow::Result<Vec<_>>>()?;
    lines.sort_unstable();
    Ok(lines)
}

/// The committed results in `topic`, read to the end of every partition, canonical and sorted.
fn topic_results(brokers: &str, topic: &str) -> anyhow::Result<Vec<String>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("bench-results-{topic}"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .filter(|n| *n > 0)
        .with_context(|| format!("results topic {topic} has no partitions"))?;
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition_offset(topic, i32::try_from(p)?, Offset::Beginning)?;
    }
    consumer.assign(&list)?;
    let (mut ended, mut lines) = (std::collections::BTreeSet::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < partitions {
        anyhow::ensure!(
            Instant::now() < deadline,
            "results topic {topic}: {} of {partitions} partitions read to their end after 60 s",
            ended.len()
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => lines.push(canonical(message.payload().unwrap_or_default())?),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    lines.sort_unstable();
    Ok(lines)
}

/// Whether `theirs` differs from the files run's results; says how on stderr.
fn differ(label: &str, files: &[String], theirs: &[String]) -> bool {
    if files == theirs {
        return false;
    }
    let first = files
        .iter()
        .zip(theirs)
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("\n  files: {a}\n  {label}: {b}"))
        .unwrap_or_default();
    eprintln!(
        "{label}: outputs differ from the files run's ({} results vs {}){first}",
        theirs.len(),
        files.len()
    );
    true
}

fn run_pipeline(file: &std::path::Path, output: Option<&std::path::Path>) -> anyhow::Result<f64> {
    let pipeline = Arc::new(riffle_pipelines::load(file, output)?);
    let started = Instant::now();
    riffle_pipelines::run::execute(pipeline, &ClusterConfig::single_process(2), Metrics::new()?)?;
    Ok(started.elapsed().as_secs_f64())
}
