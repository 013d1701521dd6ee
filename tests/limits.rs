//! Limits on what comes from outside: oversized files, images, lines, nesting and Kafka
//! messages become dead letters (or clear errors) instead of panics, stalls or huge messages.

mod common;

use std::path::Path;
use std::time::Duration;

use common::kafka::{brokers, topic};
use common::*;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use riffle_connectors::kafka::topics::{ensure_topic, TopicSpec};
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

/// `jpeg` with its frame header (SOF0..SOF2) claiming `width`×`height`.
fn forge_size(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let mut forged = jpeg.to_vec();
    let sof = forged
        .windows(2)
        .position(|w| w[0] == 0xff && (0xc0..=0xc2).contains(&w[1]))
        .expect("a frame header");
    // Marker, length (2), precision (1), then height and width, big-endian.
    forged[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    forged[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    forged
}

fn frames(rows: &[Value]) -> Vec<i64> {
    let mut frames: Vec<i64> = rows.iter().map(|r| r["frame"].as_i64().unwrap()).collect();
    frames.sort_unstable();
    frames
}

#[test]
fn forged_16384x16384_headers_are_dead_letters_and_their_neighbours_results() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = frames_subset(tmp.path(), "cam", 0..6);
    let good = std::fs::read(dir.join("cam/0001.jpg")).unwrap();
    for frame in [1, 3, 5] {
        let forged = forge_size(&good, 16384, 16384);
        std::fs::write(dir.join(format!("cam/{frame:04}.jpg")), forged).unwrap();
    }
    let source = format!(
        "{{ images: {{ path: \"{}\", batch_size: 6 }} }}",
        dir.display()
    );
    // Two frames' pixels per batch at most: batches are split, never failed.
    let stages = "[ { decode: { max_batch_bytes: 1100000 } } ]";
    let (rows, dead) = run_source(tmp.path(), &source, stages).unwrap();
    assert_eq!(frames(&rows), [0, 2, 4], "{dead:?}");
    assert_eq!(dead.len(), 3, "{dead:?}");
    for letter in &dead {
        assert_eq!(letter["stage"], "decode");
        assert_eq!(
            letter["reason"],
            "image of 16384x16384 (268435456 pixels) exceeds max_pixels (40000000)"
        );
    }
}

#[test]
fn jsonl_records_are_checked_against_their_columns_and_limits() {
    let tmp = tempfile::tempdir().unwrap();
    // The first 1000 lines (the inference sample) all have `user_id`: it is required.
    let mut text: String = (0..1000)
        .map(|i| format!("{{\"user_id\":{i},\"item\":\"a\"}}\n"))
        .collect();
    let deep = format!(
        "{{\"user_id\":9,\"x\":{}{}}}",
        "[".repeat(100),
        "]".repeat(100)
    );
    text.push_str(&format!(
        "42\n{{\"foo\":1}}\n{deep}\n{{\"user_id\":\"{}\"}}\n{{\"user_id\":1000,\"item\":\"b\"}}\n",
        "y".repeat(3000)
    ));
    let input = write(tmp.path(), "in.jsonl", &text);
    let source = format!(
        "{{ jsonl: {{ path: \"{}\", max_line_bytes: 2048 }} }}",
        input.display()
    );
    let (rows, dead) = run_source(tmp.path(), &source, "[]").unwrap();
    let users: Vec<Option<i64>> = rows.iter().map(|r| r["user_id"].as_i64()).collect();
    assert!(
        users == (0..=1000).map(Some).collect::<Vec<_>>(),
        "{dead:?}"
    );
    let mut reasons: Vec<(i64, String)> = dead
        .iter()
        .map(|d| {
            let record: Value = serde_json::from_str(d["record"].as_str().unwrap()).unwrap();
            (
                record["line"].as_i64().unwrap(),
                d["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    reasons.sort();
    let lines: Vec<i64> = reasons.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, [1001, 1002, 1003, 1004], "{reasons:?}");
    assert!(
        reasons[0]
            .1
            .ends_with("expected a JSON object, got a number"),
        "{reasons:?}"
    );
    assert!(
        reasons[1]
            .1
            .ends_with("missing required columns `user_id`, `item`"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].1.ends_with("JSON nested deeper than 64 levels"),
        "{reasons:?}"
    );
    assert_eq!(
        reasons[3].1,
        "line 1004: record longer than max_line_bytes (2048)"
    );
}

#[test]
fn a_csv_source_on_a_fifo_or_dev_zero_fails_validation_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("clicks.csv");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    for (path, what) in [
        (
            fifo.to_str().unwrap(),
            "is a FIFO (named pipe), not a regular file",
        ),
        ("/dev/zero", "is a character device, not a regular file"),
    ] {
        let p = write(
            tmp.path(),
            "p.yaml",
            &format!(
                "source: {{ csv: {{ path: \"{path}\" }} }}\nstages: []\nsink: {{ stdout: {{}} }}\n"
            ),
        );
        let started = std::time::Instant::now();
        let output = riffle(&["validate", p.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains(what), "{stderr}");
        assert!(stderr.len() < 2000, "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}
