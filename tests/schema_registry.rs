//! Avro and Protobuf topics with a schema registry, end to end: confluent-kafka's own Python
//! serializers on the other side of every test (`tests/registry_clients/`), the registry of
//! `scripts/registry.sh`, the broker of `scripts/kafka.sh`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::kafka::{brokers, topic};
use common::registry::{rows, run_client};
use common::{read_jsonl, repo, riffle, riffle_ok, write};
use serde_json::{json, Value};

const RATING_V1: &str = r#"{"type": "record", "name": "Rating", "namespace": "riffle.test",
  "fields": [
    {"name": "user_id", "type": "long"},
    {"name": "item_id", "type": "long"},
    {"name": "rating", "type": "long"},
    {"name": "timestamp", "type": "long"}]}"#;

/// v1 plus a field with a default: a BACKWARD-compatible new version.
const RATING_V2: &str = r#"{"type": "record", "name": "Rating", "namespace": "riffle.test",
  "fields": [
    {"name": "user_id", "type": "long"},
    {"name": "item_id", "type": "long"},
    {"name": "rating", "type": "long"},
    {"name": "timestamp", "type": "long"},
    {"name": "device", "type": "string", "default": "web"}]}"#;

/// `item_id` as a string: no reader of v2 can read it.
const RATING_BAD: &str = r#"{"type": "record", "name": "Rating", "namespace": "riffle.test",
  "fields": [
    {"name": "user_id", "type": "long"},
    {"name": "item_id", "type": "string"},
    {"name": "rating", "type": "long"},
    {"name": "timestamp", "type": "long"}]}"#;

fn registry() -> String {
    common::registry::url()
}

/// `n` ratings as JSON lines, user ids from `first`; with `device` when given.
fn ratings(dir: &Path, name: &str, first: i64, n: i64, device: Option<&str>) -> std::path::PathBuf {
    let mut text = String::new();
    for i in first..first + n {
        let mut row = json!({"user_id": i, "item_id": 1000 + i, "rating": i % 5 + 1, "timestamp": 880_000_000 + i});
        if let Some(d) = device {
            row["device"] = json!(d);
        }
        text.push_str(&row.to_string());
        text.push('\n');
    }
    write(dir, name, &text)
}

fn produce_avro(brokers: &str, topic: &str, schema: &Path, input: &Path, extra: &[&str]) {
    let mut args = vec![
        "--brokers",
        brokers,
        "--topic",
        topic,
        "--schema",
        schema.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--key-field",
        "user_id",
    ];
    let registry = registry();
    args.extend(["--registry", &registry]);
    args.extend_from_slice(extra);
    // Apicurio's in-memory store can lose a race between concurrent first registrations
    // (a unique-key violation, or "already exists" on the retry). The serializer registers
    // before the first message is sent, so a registration error means nothing was produced
    // and the call can be made again.
    for attempt in 1.. {
        let out = common::registry::python()
            .arg(common::registry::clients_dir().join("produce_avro.py"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return;
        }
        assert!(
            attempt < 3
                && (stderr.contains("SchemaRegistryError")
                    || stderr.contains("ValueSerializationError")),
            "produce_avro.py {args:?} failed ({}):\n{stderr}",
            out.status
        );
    }
}

/// Lines of the JSON-lines file at `path` once it has at least `n` (waiting up to `timeout`).
fn wait_for_rows(path: &Path, n: usize, timeout: Duration) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let rows = if path.exists() {
            read_jsonl(path)
        } else {
            Vec::new()
        };
        if rows.len() >= n || Instant::now() > deadline {
            return rows;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn stop(child: std::process::Child) -> String {
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_producer_moving_to_a_new_schema_version_mid_run_is_read_without_a_restart_and_nothing_lost() {
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let input = topic("ratings-avro");
    let v1 = write(tmp.path(), "v1.avsc", RATING_V1);
    let v2 = write(tmp.path(), "v2.avsc", RATING_V2);
    let bad = write(tmp.path(), "bad.avsc", RATING_BAD);
    // The topic exists (and holds v1 messages) before the source opens.
    produce_avro(
        &brokers,
        &input,
        &v1,
        &ratings(tmp.path(), "a.jsonl", 0, 100, None),
        &[],
    );
    let out = tmp.path().join("out.jsonl");
    let dead = tmp.path().join("dead.jsonl");
    let pipeline = write(
        tmp.path(),
        "p.yaml",
        &format!(
            r#"
source:
  kafka:
    brokers: "{brokers}"
    topic: {input}
    format: avro
    avro: {{ schema: v2.avsc }}
    schema_registry: {{ url: "{url}" }}
    batch_size: 16
stages:
  - select: {{ columns: [user_id, item_id, device] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
dead_letter: {{ jsonl: {{ path: dead.jsonl }} }}
runtime: {{ workers: 2, epoch_records: 16, epoch_ms: 200 }}
"#
        ),
    );
    let child = common::spawn_run(&pipeline);
    let first = wait_for_rows(&out, 100, Duration::from_secs(60));
    assert_eq!(
        first.len(),
        100,
        "the v1 messages are read before v2 exists"
    );
    // Mid-run: v2 (registered now, a new id) and then a schema no reader of v2 can read,
    // under a subject of its own (the registry would refuse it under the topic's).
    produce_avro(
        &brokers,
        &input,
        &v2,
        &ratings(tmp.path(), "b.jsonl", 100, 100, Some("tv")),
        &[],
    );
    let bad_rows: String = (200..203)
        .map(|i| {
            format!(
                "{{\"user_id\": {i}, \"item_id\": \"x{i}\", \"rating\": 1, \"timestamp\": 1}}\n"
            )
        })
        .collect();
    let bad_input = write(tmp.path(), "c.jsonl", &bad_rows);
    produce_avro(
        &brokers,
        &input,
        &bad,
        &bad_input,
        &["--subject-strategy", "topic_record"],
    );
    produce_avro(
        &brokers,
        &input,
        &v2,
        &ratings(tmp.path(), "d.jsonl", 300, 50, Some("phone")),
        &[],
    );
    let all = wait_for_rows(&out, 250, Duration::from_secs(60));
    let dead_letters = wait_for_rows(&dead, 3, Duration::from_secs(20));
    let stderr = stop(child);
    let mut by_user: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for row in &all {
        by_user
            .entry(row["user_id"].as_i64().unwrap())
            .or_default()
            .push(row["device"].as_str().unwrap().to_string());
    }
    let expected: BTreeMap<i64, Vec<String>> = (0..100)
        .map(|u| (u, vec!["web".to_string()]))
        .chain((100..200).map(|u| (u, vec!["tv".to_string()])))
        .chain((300..350).map(|u| (u, vec!["phone".to_string()])))
        .collect();
    assert_eq!(
        by_user, expected,
        "every message once: v1's with the reader's default, v2's with their own (stderr: {stderr})"
    );
    assert_eq!(dead_letters.len(), 3, "{dead_letters:?}");
    for letter in &dead_letters {
        let reason = letter["reason"].as_str().unwrap();
        assert!(reason.contains("writer schema id"), "{reason}");
        assert!(
            letter["record"].as_str().unwrap().contains(&input),
            "{letter}"
        );
    }
}

#[test]
fn avro_written_by_riffle_is_read_by_confluent_kafkas_deserializer() {
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let output = topic("recs-avro");
    let input = write(
        tmp.path(),
        "in.jsonl",
        &(0..40)
            .map(|i| {
                json!({"user_id": i, "score": i as f64 / 4.0, "label": format!("u{i}"), "tags": [i, i + 1]})
                    .to_string()
                    + "\n"
            })
            .collect::<String>(),
    );
    let pipeline = write(
        tmp.path(),
        "p.yaml",
        &format!(
            r#"
source: {{ jsonl: {{ path: "{}" }} }}
stages: []
sink:
  kafka:
    brokers: "{brokers}"
    topic: {output}
    key: user_id
    format: avro
    schema_registry: {{ url: "{url}" }}
runtime: {{ workers: 1 }}
"#,
            input.display()
        ),
    );
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    let read = rows(&run_client(
        "consume_avro.py",
        &[
            "--brokers",
            &brokers,
            "--topic",
            &output,
            "--registry",
            &url,
        ],
    ));
    let mut got: Vec<(i64, f64, String, Vec<i64>)> = read
        .iter()
        .map(|r| {
            let v = &r["value"];
            (
                v["user_id"].as_i64().unwrap(),
                v["score"].as_f64().unwrap(),
                v["label"].as_str().unwrap().to_string(),
                v["tags"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_i64().unwrap())
                    .collect(),
            )
        })
        .collect();
    got.sort_by_key(|r| r.0);
    let expected: Vec<(i64, f64, String, Vec<i64>)> = (0..40)
        .map(|i| (i, i as f64 / 4.0, format!("u{i}"), vec![i, i + 1]))
        .collect();
    assert_eq!(got, expected);
    for r in &read {
        assert_eq!(r["key"], json!(r["value"]["user_id"].to_string()), "{r}");
    }
    // The schema Riffle registered is the subject's, under the topic name strategy.
    let subjects = common::registry::run_python(
        "import sys; from confluent_kafka.schema_registry import SchemaRegistryClient; c = SchemaRegistryClient({'url': sys.argv[1]}); print(c.get_latest_version(sys.argv[2]).schema_id)",
        &[&url, &format!("{output}-value")],
    );
    assert!(subjects.trim().parse::<u32>().is_ok(), "{subjects}");
}

const CLICK_PROTO: &str = r#"syntax = "proto3";
package riffle.test;
import "google/protobuf/timestamp.proto";

message Click {
  int64 user_id = 1;
  string page = 2;
  repeated int32 items = 3;
  Device device = 4;
  google.protobuf.Timestamp at = 5;
  enum Kind { VIEW = 0; BUY = 1; }
  Kind kind = 6;
}

message Device {
  string os = 1;
  optional int32 version = 2;
}
"#;

#[test]
fn protobuf_from_confluent_kafkas_serializer_is_read_into_columns() {
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let input = topic("clicks-proto");
    let proto = write(tmp.path(), "click.proto", CLICK_PROTO);
    let values: String = (0..30)
        .map(|i| {
            json!({
                "user_id": i, "page": format!("/p/{i}"), "items": [i, 2 * i],
                "device": {"os": if i % 2 == 0 { "linux" } else { "ios" }, "version": i},
                "at": "2026-12-02T10:00:00Z", "kind": if i % 3 == 0 { "BUY" } else { "VIEW" }
            })
            .to_string()
                + "\n"
        })
        .collect();
    let values = write(tmp.path(), "clicks.jsonl", &values);
    run_client(
        "produce_protobuf.py",
        &[
            "--brokers",
            &brokers,
            "--topic",
            &input,
            "--registry",
            &url,
            "--proto",
            proto.to_str().unwrap(),
            "--message",
            "riffle.test.Click",
            "--input",
            values.to_str().unwrap(),
        ],
    );
    // The reader schema is the subject's latest: no .proto in the pipeline.
    let pipeline = write(
        tmp.path(),
        "p.yaml",
        &format!(
            r#"
source:
  kafka:
    brokers: "{brokers}"
    topic: {input}
    format: protobuf
    protobuf: {{ message: riffle.test.Click }}
    schema_registry: {{ url: "{url}" }}
    stop_at_end: true
stages: []
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 1 }}
"#
        ),
    );
    let validated = riffle_ok(&["validate", pipeline.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&validated.stdout);
    assert!(text.contains("user_id: Int64"), "{text}");
    assert!(
        text.contains("items: List(") && text.contains("device: Struct("),
        "{text}"
    );
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    let mut got = read_jsonl(&tmp.path().join("out.jsonl"));
    got.sort_by_key(|r| r["user_id"].as_i64().unwrap());
    assert_eq!(got.len(), 30);
    for (i, row) in got.iter().enumerate() {
        let i = i as i64;
        assert_eq!(row["user_id"], json!(i), "{row}");
        assert_eq!(row["page"], json!(format!("/p/{i}")), "{row}");
        assert_eq!(row["items"], json!([i, 2 * i]), "{row}");
        assert_eq!(
            row["device"]["os"],
            json!(if i % 2 == 0 { "linux" } else { "ios" }),
            "{row}"
        );
        assert_eq!(
            row["kind"],
            json!(if i % 3 == 0 { "BUY" } else { "VIEW" }),
            "{row}"
        );
    }
}

#[test]
fn riffle_produce_writes_avro_from_json_lines_that_confluent_kafka_reads() {
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let output = topic("produced-avro");
    let schema = write(tmp.path(), "v1.avsc", RATING_V1);
    let input = ratings(tmp.path(), "in.jsonl", 0, 25, None);
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &output,
        "--jsonl",
        input.to_str().unwrap(),
        "--key",
        "user_id",
        "--format",
        "avro",
        "--avro-schema",
        schema.to_str().unwrap(),
        "--schema-registry",
        &url,
    ]);
    let read = rows(&run_client(
        "consume_avro.py",
        &[
            "--brokers",
            &brokers,
            "--topic",
            &output,
            "--registry",
            &url,
        ],
    ));
    let mut users: Vec<i64> = read
        .iter()
        .map(|r| r["value"]["user_id"].as_i64().unwrap())
        .collect();
    users.sort_unstable();
    assert_eq!(users, (0..25).collect::<Vec<_>>());
    assert!(read.iter().all(|r| r["value"]["item_id"].as_i64().unwrap()
        == 1000 + r["value"]["user_id"].as_i64().unwrap()));
}

#[test]
fn a_stage_needing_a_field_the_avro_schema_lacks_fails_validation_naming_it() {
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let input = topic("ratings-validate");
    let v1 = write(tmp.path(), "v1.avsc", RATING_V1);
    produce_avro(
        &brokers,
        &input,
        &v1,
        &ratings(tmp.path(), "a.jsonl", 0, 5, None),
        &[],
    );
    for (reader, shown) in [("avro: { schema: v1.avsc },", "declared"), ("", "latest")] {
        let pipeline = write(
            tmp.path(),
            "p.yaml",
            &format!(
                r#"
source:
  kafka: {{ brokers: "{brokers}", topic: {input}, format: avro, {reader} schema_registry: {{ url: "{url}" }}, stop_at_end: true }}
stages:
  - select: {{ columns: [user_id, session_id] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
"#
            ),
        );
        let out = riffle(&["validate", pipeline.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{shown}: {err}");
        assert!(
            err.contains("session_id") && err.contains("p.yaml"),
            "{shown}: {err}"
        );
        // Without the stage, validation shows the reader schema's columns.
        let ok = write(
            tmp.path(),
            "ok.yaml",
            &std::fs::read_to_string(&pipeline)
                .unwrap()
                .replace(", session_id", ""),
        );
        let shown_schema = riffle_ok(&["validate", ok.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&shown_schema.stdout);
        assert!(
            text.contains("user_id: Int64, item_id: Int64, rating: Int64, timestamp: Int64"),
            "{text}"
        );
    }
}

#[test]
fn the_shipped_avro_clickstream_pipeline_answers_every_click_once_in_avro() {
    common::require_onnx_runtime();
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let ratings_csv = repo().join("data/ml-100k/ratings.csv");
    let text = std::fs::read_to_string(&ratings_csv).unwrap();
    let prefix: Vec<&str> = text.lines().take(401).collect();
    let csv = write(tmp.path(), "ratings.csv", &(prefix.join("\n") + "\n"));
    let (input, output) = (topic("ratings-avro"), topic("recs-avro"));
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--csv",
        csv.to_str().unwrap(),
        "--key",
        "user_id",
        "--format",
        "avro",
        "--avro-schema",
        repo()
            .join("pipelines/schemas/rating.avsc")
            .to_str()
            .unwrap(),
        "--schema-registry",
        &url,
    ]);
    let yaml = std::fs::read_to_string(repo().join("pipelines/clickstream-recs-avro.yaml"))
        .unwrap()
        .replace("topic: ratings-avro", &format!("topic: {input}"))
        .replace("topic: recs-avro", &format!("topic: {output}"))
        .replace(
            "schemas/rating.avsc",
            repo()
                .join("pipelines/schemas/rating.avsc")
                .to_str()
                .unwrap(),
        )
        .replace("../models", &repo().join("models").display().to_string())
        .replace("../out/", "");
    let file = write(tmp.path(), "recs-avro.yaml", &yaml);
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", file.to_str().unwrap()])
        .env("RIFFLE_KAFKA_BROKERS", &brokers)
        .env("RIFFLE_REGISTRY_URL", &url)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let read = rows(&run_client(
        "consume_avro.py",
        &[
            "--brokers",
            &brokers,
            "--topic",
            &output,
            "--registry",
            &url,
        ],
    ));
    let mut clicks: Vec<(i64, i64, i64)> = read
        .iter()
        .map(|r| {
            let v = &r["value"];
            assert!(v["recs"].as_array().unwrap().len() <= 10, "{v}");
            (
                v["timestamp"].as_i64().unwrap(),
                v["user_id"].as_i64().unwrap(),
                v["item_id"].as_i64().unwrap(),
            )
        })
        .collect();
    clicks.sort_unstable();
    let mut expected: Vec<(i64, i64, i64)> = prefix[1..]
        .iter()
        .map(|l| {
            let f: Vec<i64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            (f[3], f[0], f[1])
        })
        .collect();
    expected.sort_unstable();
    assert_eq!(clicks, expected, "every click answered exactly once");
}

#[test]
fn protobuf_written_by_riffle_is_read_by_confluent_kafkas_deserializer() {
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let output = topic("clicks-proto-out");
    let proto = write(tmp.path(), "click.proto", CLICK_PROTO);
    let input = write(
        tmp.path(),
        "in.jsonl",
        &(0..20)
            .map(|i| {
                json!({"user_id": i, "page": format!("/p/{i}"), "items": [i, i + 1]}).to_string()
                    + "\n"
            })
            .collect::<String>(),
    );
    let pipeline = write(
        tmp.path(),
        "p.yaml",
        &format!(
            r#"
source: {{ jsonl: {{ path: "{}" }} }}
stages: []
sink:
  kafka:
    brokers: "{brokers}"
    topic: {output}
    key: user_id
    format: protobuf
    protobuf: {{ proto: click.proto, message: riffle.test.Click }}
    schema_registry: {{ url: "{url}" }}
"#,
            input.display()
        ),
    );
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    let read = rows(&run_client(
        "consume_protobuf.py",
        &[
            "--brokers",
            &brokers,
            "--topic",
            &output,
            "--registry",
            &url,
            "--proto",
            proto.to_str().unwrap(),
            "--message",
            "riffle.test.Click",
        ],
    ));
    let mut got: Vec<(i64, String, Vec<i64>)> = read
        .iter()
        .map(|r| {
            let v = &r["value"];
            // Protobuf's JSON mapping writes int64 as a string.
            let user = match &v["user_id"] {
                Value::String(s) => s.parse().unwrap(),
                n => n.as_i64().unwrap_or(0),
            };
            let items = v["items"].as_array().map_or(Vec::new(), |a| {
                a.iter().map(|x| x.as_i64().unwrap()).collect()
            });
            (user, v["page"].as_str().unwrap().to_string(), items)
        })
        .collect();
    got.sort();
    let expected: Vec<(i64, String, Vec<i64>)> = (0..20)
        .map(|i| (i, format!("/p/{i}"), vec![i, i + 1]))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn a_registry_behind_tls_and_basic_auth_is_reached_with_credentials_from_variables() {
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let input = topic("ratings-tls");
    let v1 = write(tmp.path(), "v1.avsc", RATING_V1);
    produce_avro(
        &brokers,
        &input,
        &v1,
        &ratings(tmp.path(), "a.jsonl", 0, 10, None),
        &[],
    );
    let (user, password) = common::registry::credentials();
    let pipeline = |password_var: &str| {
        write(
            tmp.path(),
            "p.yaml",
            &format!(
                r#"
source:
  kafka:
    brokers: "{brokers}"
    topic: {input}
    format: avro
    schema_registry:
      url: "{}"
      username: "${{REGISTRY_USER}}"
      password: "${{{password_var}}}"
      ca_file: "{}"
    stop_at_end: true
stages: []
sink: {{ jsonl: {{ path: out.jsonl }} }}
"#,
                common::registry::tls_url(),
                common::registry::ca().display()
            ),
        )
    };
    let run = |file: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args(["run", "-q", file.to_str().unwrap()])
            .env("REGISTRY_USER", &user)
            .env("REGISTRY_PASSWORD", &password)
            .env("WRONG_PASSWORD", "not-the-password")
            .output()
            .unwrap()
    };
    let ok = run(&pipeline("REGISTRY_PASSWORD"));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(read_jsonl(&tmp.path().join("out.jsonl")).len(), 10);
    let refused = run(&pipeline("WRONG_PASSWORD"));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(err.contains("401") && err.contains("p.yaml"), "{err}");
    assert!(
        !err.contains("not-the-password") && !err.contains(&password),
        "{err}"
    );
}

#[test]
fn avro_container_files_written_by_fastavro_are_read_into_their_reader_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("avro");
    std::fs::create_dir(&dir).unwrap();
    let v1 = write(tmp.path(), "v1.avsc", RATING_V1);
    let v2 = write(tmp.path(), "v2.avsc", RATING_V2);
    // Two files from an independent writer: one with v1, one with v2.
    common::registry::run_python(
        r#"
import json, sys, fastavro
v1, v2, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
rows = lambda first, n, extra: [dict(user_id=i, item_id=1000 + i, rating=i % 5 + 1, timestamp=i, **extra) for i in range(first, first + n)]
with open(out + "/a.avro", "wb") as f:
    fastavro.writer(f, fastavro.parse_schema(v1), rows(0, 30, {}), codec="deflate")
with open(out + "/b.avro", "wb") as f:
    fastavro.writer(f, fastavro.parse_schema(v2), rows(30, 20, {"device": "tv"}))
"#,
        &[
            v1.to_str().unwrap(),
            v2.to_str().unwrap(),
            dir.to_str().unwrap(),
        ],
    );
    let pipeline = write(
        tmp.path(),
        "p.yaml",
        r#"
source: { avro: { path: avro, reader_schema: v2.avsc } }
stages:
  - select: { columns: [user_id, device] }
sink: { jsonl: { path: out.jsonl } }
runtime: { workers: 2 }
"#,
    );
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    let mut got: Vec<(i64, String)> = read_jsonl(&tmp.path().join("out.jsonl"))
        .iter()
        .map(|r| {
            (
                r["user_id"].as_i64().unwrap(),
                r["device"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    let expected: Vec<(i64, String)> = (0..50)
        .map(|i| (i, if i < 30 { "web" } else { "tv" }.to_string()))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn a_sink_without_auto_register_only_looks_its_schema_up() {
    let brokers = brokers();
    let url = registry();
    let tmp = tempfile::tempdir().unwrap();
    let output = topic("looked-up");
    let input = ratings(tmp.path(), "in.jsonl", 0, 5, None);
    let schema = write(tmp.path(), "v1.avsc", RATING_V1);
    let pipeline = |register: bool| {
        write(
            tmp.path(),
            "p.yaml",
            &format!(
                r#"
source: {{ jsonl: {{ path: "{}" }} }}
stages: []
sink:
  kafka:
    brokers: "{brokers}"
    topic: {output}
    format: avro
    avro: {{ schema: v1.avsc }}
    schema_registry: {{ url: "{url}", auto_register: {register} }}
"#,
                input.display()
            ),
        )
    };
    let refused = riffle(&["run", "-q", pipeline(false).to_str().unwrap()]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains(&format!("not registered under `{output}-value`")),
        "{err}"
    );
    // Registered by a deploy step (here: confluent-kafka's client), the lookup finds it.
    common::registry::run_python(
        "import sys; from confluent_kafka.schema_registry import SchemaRegistryClient, Schema; \
         c = SchemaRegistryClient({'url': sys.argv[1]}); \
         print(c.register_schema(sys.argv[2], Schema(open(sys.argv[3]).read(), 'AVRO')))",
        &[&url, &format!("{output}-value"), schema.to_str().unwrap()],
    );
    riffle_ok(&["run", "-q", pipeline(false).to_str().unwrap()]);
    let read = rows(&run_client(
        "consume_avro.py",
        &[
            "--brokers",
            &brokers,
            "--topic",
            &output,
            "--registry",
            &url,
        ],
    ));
    assert_eq!(read.len(), 5);
}
