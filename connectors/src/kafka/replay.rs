//! Replaying bundled data into a topic (`riffle produce`, demos, load tests, benchmarks).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use riffle_dataflow::{DataflowError, DataflowResult, SourceFactory};

use super::client::{client_config, Role};
use super::topics::kafka_error;
use crate::csv::CsvSourceConfig;
use crate::images::{ImagesConfig, PartitionBy, DEFAULT_MAX_FILE_BYTES};
use crate::jsonl::JsonlSourceConfig;
use crate::registry::SourceConfig;

/// How fast to replay: messages per second in total, or as fast as the broker takes them.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub messages_per_second: Option<f64>,
}

/// Camera `k` (in sorted order of the ids seen) writes to partition `k mod partitions`, as a
/// camera fleet with one partition per camera would; hashing a handful of ids can leave
/// partitions (and the workers reading them) empty.
struct CameraPartitions {
    partitions: i32,
    known: BTreeMap<String, i32>,
}

impl CameraPartitions {
    fn partition(&mut self, camera: &str) -> i32 {
        let next = self.known.len() as i32 % self.partitions.max(1);
        *self.known.entry(camera.to_string()).or_insert(next)
    }
}

/// What a replay did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Replayed {
    pub messages: u64,
    pub bytes: u64,
    pub elapsed: Duration,
}

/// Sends every record of `source` to `topic`: images as their bytes (key `camera_id`, headers
/// `frame` and `path`), any other source as one JSON object per row (key from `key_column`).
/// `options` are librdkafka producer options, applied over Riffle's.
pub fn replay(
    brokers: &str,
    options: &BTreeMap<String, String>,
    topic: &str,
    source: &dyn SourceFactory,
    key_column: Option<&str>,
    pace: Pace,
) -> DataflowResult<Replayed> {
    let producer: BaseProducer = client_config(brokers, options, Role::ReplayProducer)
        .create()
        .map_err(|e| kafka_error(brokers, topic, e))?;
    let mut cameras = CameraPartitions {
        partitions: partition_count(&producer, brokers, topic)?,
        known: Default::default(),
    };
    let mut reader = source.partition(0, 1)?;
    let started = Instant::now();
    let mut done = Replayed::default();
    while let Some(batch) = reader.next_batch()? {
        for message in messages(&batch.records, key_column)? {
            if let Some(rate) = pace.messages_per_second.filter(|r| *r > 0.0) {
                let due = started + Duration::from_secs_f64(done.messages as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let mut headers = OwnedHeaders::new();
            for (name, value) in &message.headers {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                });
            }
            let mut record = BaseRecord::to(topic)
                .payload(&message.value)
                .headers(headers);
            if let Some(key) = &message.key {
                record = record.key(key.as_str());
                if message.is_frame {
                    record = record.partition(cameras.partition(key));
                }
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    // The local queue is full: let deliveries drain, then retry the same record.
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        producer.poll(Duration::from_millis(10));
                        record = back;
                    }
                    Err((e, _)) => return Err(kafka_error(brokers, topic, e)),
                }
            }
            producer.poll(Duration::ZERO);
            done.messages += 1;
            done.bytes += message.value.len() as u64;
        }
    }
    if !super::client::drain(&producer, Duration::from_secs(60)) {
        return Err(DataflowError::Config(format!(
            "writing to topic `{topic}` on {brokers}: {} message(s) undelivered after 60 s",
            producer.in_flight_count()
        )));
    }
    done.elapsed = started.elapsed();
    Ok(done)
}

struct OutMessage {
    /// An image from a camera (keyed by camera id).
    is_frame: bool,
    key: Option<String>,
    value: Vec<u8>,
    headers: Vec<(String, String)>,
}

fn messages(batch: &RecordBatch, key_column: Option<&str>) -> DataflowResult<Vec<OutMessage>> {
    let rows = batch.num_rows();
    // Image sources: raw bytes with their ids in key and headers, as cameras would send them.
    if let (Some(bytes), Some(camera), Some(frame), Some(path)) = (
        batch.column_by_name("bytes"),
        batch.column_by_name("camera_id"),
        batch.column_by_name("frame"),
        batch.column_by_name("path"),
    ) {
        let (bytes, camera) = (bytes.as_binary::<i32>(), camera.as_string::<i32>());
        let (frame, path) = (frame.as_primitive::<Int64Type>(), path.as_string::<i32>());
        return Ok((0..rows)
            .map(|i| OutMessage {
                is_frame: true,
                key: Some(camera.value(i).to_string()),
                value: bytes.value(i).to_vec(),
                headers: vec![
                    ("frame".into(), frame.value(i).to_string()),
                    ("path".into(), path.value(i).to_string()),
                ],
            })
            .collect());
    }
    let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
    writer.write(batch)?;
    writer.finish()?;
    let text = writer.into_inner();
    let keys = match key_column {
        Some(name) => {
            let column = batch
                .column_by_name(name)
                .ok_or_else(|| DataflowError::schema(name, "a key column", "no such column"))?;
            let strings = arrow_cast_to_strings(column.as_ref())?;
            strings.into_iter().map(Some).collect()
        }
        None => vec![None; rows],
    };
    Ok(text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .zip(keys)
        .map(|(line, key)| OutMessage {
            is_frame: false,
            key,
            value: line.to_vec(),
            headers: Vec::new(),
        })
        .collect())
}

fn arrow_cast_to_strings(column: &dyn arrow_array::Array) -> DataflowResult<Vec<String>> {
    let formatter = arrow_cast::display::ArrayFormatter::try_new(column, &Default::default())?;
    Ok((0..column.len())
        .map(|i| formatter.value(i).to_string())
        .collect())
}

/// The topic's partitions, asked through the producer (its options, e.g. SASL, apply).
fn partition_count(producer: &BaseProducer, brokers: &str, topic: &str) -> DataflowResult<i32> {
    let metadata = producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| kafka_error(brokers, topic, e))?;
    Ok(metadata
        .topics()
        .first()
        .map_or(1, |t| t.partitions().len().max(1) as i32))
}

/// Sends every row of `source` (CSV or JSON lines) to `sink`'s topic as one Avro or Protobuf
/// message of the sink's declared schema (`avro.schema` or `protobuf.proto`), matched by column
/// name and registered under its subject when the sink has a `schema_registry`; keys and headers
/// come from columns as the sink's config says. A row that does not fit the schema stops the
/// replay, saying why.
pub fn replay_schemaful(
    sink: &super::KafkaSinkConfig,
    source: &dyn SourceFactory,
    pace: Pace,
) -> DataflowResult<Replayed> {
    use riffle_dataflow::sink::SinkFactory as _;

    let format = sink.format.schemaful().ok_or_else(|| {
        sink.config_error("replaying rows as schema'd messages needs `format: avro` or `protobuf`")
    })?;
    let mut offline = sink.schema_settings();
    offline.registry = None;
    let schema = offline
        .read_schema(format)
        .map_err(|e| sink.config_error(e))?;
    let factory = super::KafkaSinkFactory::new(sink)?;
    let mut writer = factory.open()?;
    let mut reader = source.partition(0, 1)?;
    let started = Instant::now();
    let mut done = Replayed::default();
    while let Some(batch) = reader.next_batch()? {
        // Rows go through JSON so that columns meet the schema's fields by name, with JSON's
        // conversions (an inferred int64 into an Avro int, a number into a double).
        let lines = crate::lines::json_lines(&batch.records)?;
        let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(batch.records.num_rows().max(1))
            .build_decoder()?;
        decoder.decode(&lines).map_err(|e| {
            sink.config_error(format!("a row does not fit the declared schema: {e}"))
        })?;
        let Some(encoded) = decoder.flush().map_err(|e| {
            sink.config_error(format!("a row does not fit the declared schema: {e}"))
        })?
        else {
            continue;
        };
        let rows = encoded.num_rows();
        let mut start = 0;
        while start < rows {
            // Paced: a slice at a time, each when it is due.
            let len = match pace.messages_per_second {
                Some(rate) if rate > 0.0 => ((rate / 20.0) as usize).clamp(1, rows - start),
                _ => rows - start,
            };
            if let Some(rate) = pace.messages_per_second.filter(|r| *r > 0.0) {
                let due = started + Duration::from_secs_f64(done.messages as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            writer.write_batch(&encoded.slice(start, len))?;
            done.messages += len as u64;
            start += len;
        }
        done.bytes += lines.len() as u64;
    }
    writer.finish()?;
    done.elapsed = started.elapsed();
    Ok(done)
}

/// What `riffle produce` replays: a folder of frames as cameras, or the rows of a file.
pub enum ReplayInput<'a> {
    Frames {
        dir: &'a std::path::Path,
        cameras: Option<usize>,
        repeat: usize,
    },
    Csv(&'a std::path::Path),
    Jsonl(&'a std::path::Path),
}

impl ReplayInput<'_> {
    /// The source that reads it.
    pub fn source(&self) -> SourceConfig {
        match *self {
            ReplayInput::Frames {
                dir,
                cameras,
                repeat,
            } => SourceConfig::Images(ImagesConfig {
                path: dir.to_path_buf(),
                cameras,
                batch_size: 64,
                repeat,
                extensions: vec!["jpg".into(), "jpeg".into(), "png".into()],
                // Cameras stream side by side: interleave their frames in time order.
                partition_by: PartitionBy::Camera,
                // Paced by the producer itself.
                max_records_per_second: None,
                fps: None,
                max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            }),
            ReplayInput::Csv(path) => SourceConfig::Csv(CsvSourceConfig {
                path: path.to_path_buf(),
                has_header: true,
                batch_size: 1024,
                delimiter: None,
                max_line_bytes: crate::DEFAULT_MAX_LINE_BYTES,
                schema: None,
            }),
            ReplayInput::Jsonl(path) => SourceConfig::Jsonl(JsonlSourceConfig {
                path: path.to_path_buf(),
                batch_size: 1024,
                max_line_bytes: crate::DEFAULT_MAX_LINE_BYTES,
                schema: None,
            }),
        }
    }
}
