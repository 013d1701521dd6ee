//! Limits on what comes from outside: oversized files, images, lines, nesting and Kafka
//! messages become dead letters (or clear errors) instead of panics, stalls or huge messages.

mod common;

use std::path::Path;
use std::time::Duration;

use common::kafka::{brokers, topic};
use common::*;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use riffle_connectors::kafka::replay::{ensure_topic, TopicSpec};
use serde_json::Value;

/// Runs `source` (a YAML flow mapping) with no stages into `out.jsonl` and `dead.jsonl` under
/// `dir`; returns the results and dead letters, or the command's output when it fails.
fn run_source(dir: &Path, source: &str, stages: &str) -> Result<(Vec<Value>, Vec<Value>), String> {
    let out = dir.join("out.jsonl");
    let dead = dir.join("dead.jsonl");
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&dead);
    let p = write(
        dir,
        "p.yaml",
        &format!(
            "source: {source}\nstages: {stages}\nsink: {{ jsonl: {{ path: \"{}\" }} }}\n\
             dead_letter: {{ jsonl: {{ path: \"{}\" }} }}\n",
            out.display(),
            dead.display()
        ),
    );
    let output = riffle(&["run", "-q", p.to_str().unwrap()]);
    if !output.status.success() {
        return Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let read = |p: &Path| {
        if p.exists() {
            read_jsonl(p)
        } else {
            Vec::new()
        }
    };
    Ok((read(&out), read(&dead)))
}

#[test]
fn a_5_mb_kafka_message_between_small_ones_is_neither_stalled_nor_lost() {
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let input = topic("big-message");
    let mut spec = TopicSpec::new(&input, 1);
    spec.config
        .insert("max.message.bytes".into(), (16 << 20).to_string());
    ensure_topic(&brokers, &Default::default(), &spec).unwrap();
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("message.max.bytes", (16 << 20).to_string())
        .create()
        .unwrap();
    let big = vec![b'x'; 5 << 20];
    for value in [&b"small-0"[..], &big, b"small-2"] {
        producer
            .send(BaseRecord::<(), [u8]>::to(&input).payload(value))
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let source = |extra: &str| {
        format!(
            "{{ kafka: {{ brokers: \"{brokers}\", topic: {input}, format: raw, stop_at_end: true{extra} }} }}"
        )
    };
    let offsets = |rows: &[Value]| -> Vec<i64> {
        rows.iter().map(|r| r["offset"].as_i64().unwrap()).collect()
    };

    // By default it is fetched and kept.
    let (rows, dead) = run_source(tmp.path(), &source(""), "[]").unwrap();
    assert_eq!(offsets(&rows), [0, 1, 2], "{dead:?}");

    // Over `max_message_bytes`: a dead letter naming where it is; its neighbours are results.
    let (rows, dead) =
        run_source(tmp.path(), &source(", max_message_bytes: 1048576"), "[]").unwrap();
    assert_eq!(offsets(&rows), [0, 2]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    let reason = dead[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("5242880 bytes exceeds max_message_bytes (1048576)"),
        "{reason}"
    );
    let record: Value = serde_json::from_str(dead[0]["record"].as_str().unwrap()).unwrap();
    assert_eq!(
        (
            record["topic"].as_str(),
            record["partition"].as_i64(),
            record["offset"].as_i64()
        ),
        (Some(input.as_str()), Some(0), Some(1))
    );

    // librdkafka told to receive less than max_message_bytes would stall: refused up front.
    let small_receive = ", options: { \"receive.message.max.bytes\": \"1000000\" }";
    let error = run_source(tmp.path(), &source(small_receive), "[]").unwrap_err();
    assert!(error.contains("receive.message.max.bytes"), "{error}");
    assert!(error.contains("max_message_bytes"), "{error}");

    // A message beyond what librdkafka may receive stops the run saying so, not a silent stall.
    let tiny = ", max_message_bytes: 1024, options: { \"receive.message.max.bytes\": \"2000000\", \"fetch.max.bytes\": \"1000000\" }";
    let error = run_source(tmp.path(), &source(tiny), "[]").unwrap_err();
    assert!(error.contains("too large to fetch"), "{error}");
}
