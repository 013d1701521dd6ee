//! The broker the Kafka tests run against, and reading a topic back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// `RIFFLE_KAFKA_BROKERS`, set by `scripts/test.sh` after `scripts/kafka.sh start`. Fails (never
/// skips) when unset or unreachable, saying how to start one.
pub fn brokers() -> String {
    let how = "start a Kafka-protocol broker with `scripts/kafka.sh start` and set \
               RIFFLE_KAFKA_BROKERS=127.0.0.1:9092 (scripts/test.sh does both)";
    let brokers = std::env::var("RIFFLE_KAFKA_BROKERS")
        .unwrap_or_else(|_| panic!("RIFFLE_KAFKA_BROKERS is not set: {how}"));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    if let Err(e) = consumer.fetch_metadata(None, Duration::from_secs(10)) {
        panic!("no broker at {brokers} ({e}): {how}");
    }
    brokers
}

/// A topic name no other test run uses.
pub fn topic(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

pub struct Received {
    pub key: Option<String>,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

/// Every message of `topic`, reading each partition up to its high watermark.
pub fn consume_all(brokers: &str, topic: &str) -> Vec<Received> {
    consume_all_with_partitions(brokers, topic)
        .into_iter()
        .map(|(_, m)| m)
        .collect()
}

/// Every message of `topic` with its partition, each partition in offset order.
pub fn consume_all_with_partitions(brokers: &str, topic: &str) -> Vec<(i32, Received)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "riffle-tests")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        // A transaction's commit marker takes the last offset: the end shows as EOF.
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    let mut ends = BTreeMap::new();
    let mut list = TopicPartitionList::new();
    for p in &partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, *p, Duration::from_secs(10))
            .unwrap();
        ends.insert(*p, high);
        list.add_partition_offset(topic, *p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&list).unwrap();
    let mut out = Vec::new();
    let mut next: BTreeMap<i32, i64> = partitions.iter().map(|p| (*p, 0)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while next.iter().any(|(p, n)| *n < ends[p]) {
        assert!(
            Instant::now() < deadline,
            "timed out reading {topic}: at {next:?} of {ends:?}"
        );
        let message = match consumer.poll(Duration::from_millis(200)) {
            None => continue,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                next.insert(p, ends[&p]);
                continue;
            }
            Some(m) => m.unwrap(),
        };
        next.insert(message.partition(), message.offset() + 1);
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_string(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push((
            message.partition(),
            Received {
                key: message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                value: message.payload().unwrap_or_default().to_vec(),
                headers,
            },
        ));
    }
    out
}

/// What a committed reader of `topic` sees: every result of an exactly-once run once (see
/// `riffle_connectors::kafka::committed`), and how many results were left uncommitted.
pub fn consume_committed(brokers: &str, topic: &str) -> (Vec<Received>, usize) {
    use riffle_connectors::kafka::committed::{Committed, Message};
    let mut view = Committed::default();
    let mut out = Vec::new();
    for (partition, m) in consume_all_with_partitions(brokers, topic) {
        let kind = Message::from_headers(m.headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())));
        out.extend(view.push(partition, kind, m));
    }
    let left = view.uncommitted();
    (out, left)
}

/// The person-detection pipeline over frames in `topic` (`batch` frames per read and per model
/// run, at most `pace` frames/s per worker), keeping `camera_id` and `frame`; `rest` is the YAML
/// after the stages (sink, runtime, ...).
pub fn detection_from_kafka(
    brokers: &str,
    topic: &str,
    batch: usize,
    pace: Option<u32>,
    rest: &str,
) -> String {
    let pace = pace.map_or(String::new(), |p| format!(", max_records_per_second: {p}"));
    format!(
        r#"
source: {{ kafka: {{ brokers: "{brokers}", topic: {topic}, format: jpeg, key: camera_id, header_columns: {{ frame: int64 }}, stop_at_end: true, batch_size: {batch}{pace} }} }}
stages:
  - decode: {{}}
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: "{model}"
      inputs: {{ "image_tensor:0": tensor }}
      outputs:
        "detection_scores:0": {{ column: scores, shape: [100] }}
      batch: {{ max_size: {batch}, max_delay_ms: 5 }}
  - select: {{ columns: [camera_id, frame] }}
{rest}
"#,
        model = super::model("ssdlite_person.onnx").display()
    )
}
