//! Pipelines on a real Apache Kafka broker (`scripts/kafka.sh start`): frames in and
//! detections out equal the file run, clicks as JSON, a topic written by kcat, poison messages
//! in the dead-letter topic.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::kafka::{brokers, consume_all, consume_committed, detection_from_kafka, topic};
use common::*;
use riffle_connectors::kafka::topics::{ensure_topic, TopicSpec};
use serde_json::Value;

/// Tests share the broker; the outage test pauses it and so runs alone.
static BROKER: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn produce(args: &[&str]) {
    riffle_ok(&[&["produce"], args].concat());
}

/// A new topic of 4 partitions holding the first `frames` bundled frames as 4 cameras
/// (`street-0` .. `street-3`).
fn frames_topic(brokers: &str, tmp: &std::path::Path, name: &str, frames: usize) -> String {
    cameras_topic(brokers, tmp, name, frames, 4)
}

/// A new topic of `cameras` partitions holding the first `frames` bundled frames as that many
/// cameras, camera k in partition k.
fn cameras_topic(
    brokers: &str,
    tmp: &std::path::Path,
    name: &str,
    frames: usize,
    cameras: usize,
) -> String {
    let dir = frames_subset(tmp, "street", 0..frames);
    let input = topic(name);
    let cameras = cameras.to_string();
    produce(&[
        "--brokers",
        brokers,
        "--topic",
        &input,
        "--partitions",
        &cameras,
        "--frames",
        dir.to_str().unwrap(),
        "--cameras",
        &cameras,
    ]);
    input
}

/// The YAML after the stages for an exactly-once Kafka → Kafka run: results keyed by camera to
/// 2 partitions of `output` (`sink_extra`: more sink keys), dead letters to a file, `workers`
/// per process, checkpoints every `interval_ms`.
fn exactly_once_tail(
    brokers: &str,
    output: &str,
    sink_extra: &str,
    workers: usize,
    interval_ms: u64,
) -> String {
    format!(
        "sink: {{ kafka: {{ brokers: \"{brokers}\", topic: {output}, key: camera_id, partitions: 2, {sink_extra} }} }}\n\
         dead_letter: {{ jsonl: {{ path: dead.jsonl }} }}\n\
         runtime: {{ workers: {workers}, epoch_records: 4, checkpoint: {{ dir: ckpt, interval_ms: {interval_ms} }} }}"
    )
}

fn detections_by_frame(
    rows: impl IntoIterator<Item = Value>,
) -> BTreeMap<(String, i64), Vec<(String, f64)>> {
    rows.into_iter()
        .map(|r| {
            let key = (
                r["camera_id"].as_str().unwrap().to_string(),
                r["frame"].as_i64().unwrap(),
            );
            let dets = r["detections"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    (
                        d["label"].as_str().unwrap_or("").to_string(),
                        (d["score"].as_f64().unwrap() * 1e4).round() / 1e4,
                    )
                })
                .collect();
            (key, dets)
        })
        .collect()
}

fn kafka_camera_pipeline(dir: &Path, brokers: &str, input: &str, output: &str) -> String {
    shipped("camera-perception-kafka.yaml", dir)
        .replace("127.0.0.1:9092", brokers)
        .replace("topic: cameras", &format!("topic: {input}"))
        .replace("topic: detections", &format!("topic: {output}"))
}

#[test]
fn frames_through_kafka_equal_the_file_run() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "bikes", 124..140);
    let (input, output) = (topic("cameras"), topic("detections"));
    produce(&[
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--partitions",
        "3",
        "--frames",
        frames.to_str().unwrap(),
        "--cameras",
        "2",
    ]);

    let p = write(
        tmp.path(),
        "kafka.yaml",
        &kafka_camera_pipeline(tmp.path(), &brokers, &input, &output),
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let received = consume_all(&brokers, &output);
    assert_eq!(received.len(), 16, "one result per frame");
    for r in &received {
        let row: Value = serde_json::from_slice(&r.value).unwrap();
        assert_eq!(
            r.key.as_deref(),
            row["camera_id"].as_str(),
            "message key = camera_id"
        );
    }
    let from_kafka = detections_by_frame(
        received
            .iter()
            .map(|r| serde_json::from_slice(&r.value).unwrap()),
    );

    // The same frames from files, through the same stages.
    let out = tmp.path().join("files.jsonl");
    let text = shipped("camera-perception.yaml", tmp.path())
        .replace(
            &repo().join("data/frames").display().to_string(),
            frames.to_str().unwrap(),
        )
        .replace("cameras: 4", "cameras: 2");
    let p = write(tmp.path(), "files.yaml", &text);
    run_quietly(&p, &out);
    let from_files = detections_by_frame(read_jsonl(&out));
    assert_eq!(from_kafka, from_files);
    assert!(
        from_kafka.values().any(|d| !d.is_empty()),
        "frames 124..140 show the cyclist"
    );
}

#[test]
fn clickstream_json_from_kafka_keeps_the_clicks() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let csv = repo().join("data/clickstream/obd-random-all-2000.csv");
    let input = topic("clicks");
    produce(&[
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--csv",
        csv.to_str().unwrap(),
        "--key",
        "user_feature_0",
    ]);
    let out = tmp.path().join("clicks.jsonl");
    let text = std::fs::read_to_string(repo().join("pipelines/clicks-kafka.yaml"))
        .unwrap()
        .replace("127.0.0.1:9092", &brokers)
        .replace("topic: clicks", &format!("topic: {input}"));
    let p = write(tmp.path(), "clicks.yaml", &text);
    run_quietly(&p, &out);

    // Expected straight from the CSV: the rows with click = 1.
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut expected: Vec<(String, String, i64)> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[3] == "1")
        .map(|f| (f[0].to_string(), f[5].to_string(), f[1].parse().unwrap()))
        .collect();
    // Produced from typed CSV columns: the UTC timestamps arrive in ISO form.
    for row in &mut expected {
        row.0 = row
            .0
            .replace(' ', "T")
            .trim_end_matches("+00:00")
            .to_string();
    }
    let mut got: Vec<(String, String, i64)> = read_jsonl(&out)
        .iter()
        .map(|r| {
            (
                r["timestamp"].as_str().unwrap().to_string(),
                r["user"].as_str().unwrap().to_string(),
                r["item_id"].as_i64().unwrap(),
            )
        })
        .collect();
    expected.sort();
    got.sort();
    assert!(!expected.is_empty());
    assert_eq!(got, expected);
}

fn kcat(args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("kcat not found ({e}): install it with `apt-get install kcat` (scripts/test.sh does)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "kcat {args:?} failed");
}

/// `riffle produce` creates its topic as asked (partitions, replication factor, topic configs),
/// with its `-X` options on every client it makes.
#[test]
fn produce_creates_the_topic_with_its_settings() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;

    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let csv = write(tmp.path(), "in.csv", "user,item\n1,2\n3,4\n");
    let name = topic("created");
    produce(&[
        "--brokers",
        &brokers,
        "--topic",
        &name,
        "--partitions",
        "3",
        "--replication-factor",
        "1",
        "--topic-config",
        "retention.ms=3600000",
        "-X",
        "client.id=riffle-produce-test",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let metadata = admin
        .inner()
        .fetch_metadata(Some(&name), std::time::Duration::from_secs(10))
        .unwrap();
    let partitions = metadata.topics()[0].partitions();
    assert_eq!(partitions.len(), 3);
    assert!(partitions.iter().all(|p| p.replicas().len() == 1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let described = runtime
        .block_on(admin.describe_configs([&ResourceSpecifier::Topic(&name)], &AdminOptions::new()))
        .unwrap();
    let config = described.into_iter().next().unwrap().unwrap();
    assert_eq!(
        config.get("retention.ms").and_then(|e| e.value.as_deref()),
        Some("3600000")
    );
    assert_eq!(consume_all(&brokers, &name).len(), 2);
    // A bad -X is refused by librdkafka, naming the property.
    let out = riffle(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &name,
        "-X",
        "no.such.property=1",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no.such.property"), "{stderr}");
}

/// The test broker's SASL_SSL listener and SCRAM user (`scripts/kafka.sh env`, which
/// `scripts/test.sh` evaluates): the address and the `-X` options that log in.
fn sasl_ssl() -> (String, Vec<String>) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: run `eval \"$(scripts/kafka.sh env)\"` (scripts/test.sh does)"
            )
        })
    };
    let options = [
        "security.protocol=SASL_SSL".to_string(),
        "sasl.mechanisms=SCRAM-SHA-512".to_string(),
        format!("sasl.username={}", var("RIFFLE_KAFKA_USER")),
        format!("sasl.password={}", var("RIFFLE_KAFKA_PASSWORD")),
        format!("ssl.ca.location={}", var("RIFFLE_KAFKA_CA")),
    ];
    (var("RIFFLE_KAFKA_SSL_BROKERS"), options.to_vec())
}

/// Over SASL_SSL (SCRAM-SHA-512): a sink configured from `${VAR}`s creates its topic and
/// writes; `riffle produce` and `riffle consume` log in with `-X`.
#[test]
fn sink_produce_and_consume_over_sasl_ssl() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    brokers();
    let (ssl, options) = sasl_ssl();
    let x: Vec<&str> = options.iter().flat_map(|o| ["-X", o.as_str()]).collect();
    let tmp = tempfile::tempdir().unwrap();
    let csv = write(tmp.path(), "in.csv", "user,item\n1,2\n3,4\n5,6\n");
    let output = topic("sasl-out");
    // The secrets come from the environment scripts/test.sh exported.
    let p = write(
        tmp.path(),
        "p.yaml",
        &format!(
            "source:\n  csv: {{ path: in.csv }}\nstages: []\nsink:\n  kafka:\n    \
             brokers: ${{RIFFLE_KAFKA_SSL_BROKERS}}\n    topic: {output}\n    partitions: 2\n    \
             replication_factor: 1\n    topic_config: {{ retention.ms: \"3600000\" }}\n    \
             options:\n      security.protocol: SASL_SSL\n      \
             sasl.mechanisms: SCRAM-SHA-512\n      sasl.username: ${{RIFFLE_KAFKA_USER}}\n      \
             sasl.password: ${{RIFFLE_KAFKA_PASSWORD}}\n      \
             ssl.ca.location: ${{RIFFLE_KAFKA_CA}}\n      compression.type: zstd\n"
        ),
    );
    riffle_ok(&["run", p.to_str().unwrap(), "--quiet"]);
    let consume = |topic: &str| {
        let out = riffle_ok(&[&["consume", "--brokers", &ssl, "--topic", topic], &x[..]].concat());
        let mut values: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        values.sort_by_key(|v| v["user"].as_i64());
        values
    };
    let results = consume(&output);
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[2]["item"], 6);

    let input = topic("sasl-in");
    let mut args = vec!["--brokers", &ssl, "--topic", &input, "--partitions", "3"];
    args.extend([
        "--replication-factor",
        "1",
        "--topic-config",
        "retention.ms=3600000",
    ]);
    args.extend(["--csv", csv.to_str().unwrap()]);
    args.extend(&x);
    produce(&args);
    assert_eq!(consume(&input).len(), 3);
    // Without the options the SASL_SSL listener is not spoken to.
    let out = riffle(&["consume", "--brokers", &ssl, "--topic", &input]);
    assert!(!out.status.success());
}

/// Kafka → Kafka over SASL_SSL with the credentials from the environment, exactly-once through
/// transactions; then the same file with a wrong password fails with one clear line.
#[test]
fn a_kafka_pipeline_over_sasl_ssl_and_a_wrong_password() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    brokers();
    let (ssl, options) = sasl_ssl();
    let x: Vec<&str> = options.iter().flat_map(|o| ["-X", o.as_str()]).collect();
    let tmp = tempfile::tempdir().unwrap();
    let csv = write(tmp.path(), "in.csv", "user,item\n1,2\n3,4\n5,6\n7,8\n");
    let (input, output) = (topic("sasl-pipe-in"), topic("sasl-pipe-out"));
    produce(
        &[
            &["--brokers", &ssl, "--topic", &input, "--partitions", "2"][..],
            &["--csv", csv.to_str().unwrap()],
            &x,
        ]
        .concat(),
    );
    let client = "      security.protocol: SASL_SSL\n      sasl.mechanisms: SCRAM-SHA-512\n      \
                  sasl.username: ${RIFFLE_KAFKA_USER}\n      sasl.password: ${RIFFLE_KAFKA_PASSWORD}\n      \
                  ssl.ca.location: ${RIFFLE_KAFKA_CA}\n";
    let p = write(
        tmp.path(),
        "sasl.yaml",
        &format!(
            "source:\n  kafka:\n    brokers: ${{RIFFLE_KAFKA_SSL_BROKERS}}\n    topic: {input}\n    \
             format: json\n    stop_at_end: true\n    options:\n{client}\
             stages:\n  - filter: {{ column: user, op: gt, value: 2 }}\n\
             sink:\n  kafka:\n    brokers: ${{RIFFLE_KAFKA_SSL_BROKERS}}\n    topic: {output}\n    \
             partitions: 1\n    exactly_once: transactions\n    options:\n{client}\
             dead_letter: {{ jsonl: {{ path: dead.jsonl }} }}\n\
             runtime: {{ workers: 2, checkpoint: {{ dir: ckpt, interval_ms: 200 }} }}\n"
        ),
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let out = riffle_ok(&[&["consume", "--brokers", &ssl, "--topic", &output], &x[..]].concat());
    let mut users: Vec<i64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["user"]
                .as_i64()
                .unwrap()
        })
        .collect();
    users.sort();
    assert_eq!(
        users,
        vec![3, 5, 7],
        "each filtered row once, over SASL_SSL"
    );

    let started = std::time::Instant::now();
    let wrong = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("RIFFLE_KAFKA_PASSWORD", "not-the-password")
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, no log flood: {stderr}");
    assert!(
        lines[0].contains("authentication failed") && lines[0].contains("sasl.password"),
        "{stderr}"
    );
    assert!(
        !lines[0].contains("not-the-password"),
        "the password is not printed: {stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn topic_written_by_kcat_is_read_and_poison_goes_to_the_dead_letter_topic() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (topic("kcat-in"), topic("kcat-out"));
    ensure_topic(&brokers, &Default::default(), &TopicSpec::new(&input, 2)).unwrap();
    // kcat: key and value separated by `|`, one message per line; one value is not JSON.
    let lines = "u1|{\"user\":\"u1\",\"item\":3,\"price\":9.5}\n\
                 u2|{\"user\":\"u2\",\"item\":7,\"price\":1.25}\n\
                 u3|{\"user\":\"u3\",\"item\":\n\
                 u1|{\"user\":\"u1\",\"item\":8,\"price\":4.0}\n";
    kcat(&["-P", "-b", &brokers, "-t", &input, "-K", "|"], lines);
    let p = write(
        tmp.path(),
        "kcat.yaml",
        &format!(
            r#"
source:
  kafka:
    brokers: "{brokers}"
    topic: {input}
    format: json
    key: user_key
    stop_at_end: true
    schema: {{ user: string, item: int64, price: float64 }}
stages:
  - filter: {{ column: price, op: gt, value: 2.0 }}
sink:
  kafka: {{ brokers: "{brokers}", topic: {output}, key: user_key }}
runtime: {{ workers: 2 }}
"#
        ),
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let mut out: Vec<(Option<String>, Value)> = consume_all(&brokers, &output)
        .into_iter()
        .map(|r| (r.key, serde_json::from_slice(&r.value).unwrap()))
        .collect();
    out.sort_by_key(|(_, v)| v["item"].as_i64());
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].0.as_deref(), Some("u1"));
    assert_eq!(out[0].1["item"], 3);
    assert_eq!(out[1].1["item"], 8);
    assert_eq!(out[1].1["user_key"], "u1", "the kcat key is a column");

    let dead = consume_all(&brokers, &format!("{output}-dead-letters"));
    assert_eq!(dead.len(), 1, "the truncated JSON message");
    assert_eq!(
        dead[0].headers.get("stage").map(String::as_str),
        Some("source")
    );
    assert!(
        !dead[0]
            .headers
            .get("reason")
            .cloned()
            .unwrap_or_default()
            .is_empty(),
        "reason header"
    );
    let letter: Value = serde_json::from_slice(&dead[0].value).unwrap();
    assert!(
        letter["record"].as_str().unwrap().contains("offset"),
        "{letter}"
    );
}

#[test]
fn truncated_jpeg_from_kafka_goes_to_the_dead_letter_topic_and_the_rest_runs() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", [128, 129, 130]);
    let good = std::fs::read(frames.join("cam/0130.jpg")).unwrap();
    std::fs::write(frames.join("cam/0131.jpg"), &good[..good.len() / 2]).unwrap();
    let (input, output) = (topic("poison-in"), topic("poison-out"));
    produce(&[
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--partitions",
        "2",
        "--frames",
        frames.to_str().unwrap(),
    ]);
    let p = write(
        tmp.path(),
        "p.yaml",
        &kafka_camera_pipeline(tmp.path(), &brokers, &input, &output),
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let results = consume_all(&brokers, &output);
    assert_eq!(results.len(), 3);
    let dead = consume_all(&brokers, &format!("{output}-dead-letters"));
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].headers.get("stage").map(String::as_str),
        Some("decode")
    );
    assert!(
        dead[0].headers["reason"].contains("JPEG"),
        "{:?}",
        dead[0].headers
    );
    let letter: Value = serde_json::from_slice(&dead[0].value).unwrap();
    let record: Value = serde_json::from_str(letter["record"].as_str().unwrap()).unwrap();
    assert_eq!(record["frame"], 131);
}

#[test]
fn a_run_with_checkpoints_resumes_where_the_last_one_ended() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let input = topic("resume-in");
    ensure_topic(&brokers, &Default::default(), &TopicSpec::new(&input, 2)).unwrap();
    let send = |from: i64, to: i64| {
        let lines: String = (from..to)
            .map(|i| format!("k{i}|{{\"n\":{i}}}\n"))
            .collect();
        kcat(&["-P", "-b", &brokers, "-t", &input, "-K", "|"], &lines);
    };
    let ckpt = tmp.path().join("ckpt");
    let p = write(
        tmp.path(),
        "resume.yaml",
        &format!(
            r#"
source: {{ kafka: {{ brokers: "{brokers}", topic: {input}, format: json, stop_at_end: true, schema: {{ n: int64 }}, batch_size: 4 }} }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 2, epoch_records: 3 }}
"#
        ),
    );
    let numbers = |out: &std::path::Path| {
        let mut n: Vec<i64> = read_jsonl(out)
            .iter()
            .map(|r| r["n"].as_i64().unwrap())
            .collect();
        n.sort();
        n
    };
    send(0, 10);
    let out = tmp.path().join("out.jsonl");
    let run = |workers: &str| {
        riffle_ok(&[
            "run",
            "-q",
            p.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--workers",
            workers,
        ])
    };
    run("2");
    assert_eq!(numbers(&out), (0..10).collect::<Vec<_>>());
    let store = riffle_dataflow::checkpoint::CheckpointStore::open(&ckpt, 3).unwrap();
    let latest = store.latest().unwrap().expect("a checkpoint after the run");
    let offsets = &latest.sources[&format!("kafka:{input}")];
    assert_eq!(
        offsets.values().sum::<i64>(),
        10,
        "next offsets cover all 10 messages: {offsets:?}"
    );

    // The next run reads only what came after, and appends to the same file.
    send(10, 15);
    // Offsets are kept per partition, not per worker: resume with another worker count.
    run("3");
    assert_eq!(
        numbers(&out),
        (0..15).collect::<Vec<_>>(),
        "each message exactly once"
    );
    let again = store.latest().unwrap().unwrap();
    assert!(
        again.epoch > latest.epoch,
        "epochs continue across runs: {} then {}",
        latest.epoch,
        again.epoch
    );

    // The checkpoint belongs to that file: resuming into another one fails at once, clearly.
    let started = std::time::Instant::now();
    let other = tmp.path().join("other.jsonl");
    let run = riffle(&[
        "run",
        "-q",
        p.to_str().unwrap(),
        "--output",
        other.to_str().unwrap(),
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("the checkpoint recorded"), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "a failed worker must not leave the others waiting"
    );
}

#[test]
fn kill_9_of_a_worker_process_loses_and_duplicates_nothing() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let input = frames_topic(&brokers, tmp.path(), "kill-in", 200);
    let pipeline = detection_from_kafka(
        &brokers,
        &input,
        4,
        None,
        "sink: { jsonl: { path: out.jsonl } }\nruntime: { workers: 1, epoch_records: 4 }",
    );
    let expected = split_cameras("street", 200, 4);
    // Trials kill each process in turn, at different moments.
    for (trial, (victim, after_ms)) in [(0usize, 1500u64), (1, 2200), (0, 3000)]
        .into_iter()
        .enumerate()
    {
        let dir = tmp.path().join(format!("trial{trial}"));
        std::fs::create_dir_all(&dir).unwrap();
        let p = write(&dir, "kill.yaml", &pipeline);
        let out = dir.join("out.jsonl");
        run_killing_one(
            &p,
            &[
                "--output",
                out.to_str().unwrap(),
                "--checkpoint-dir",
                dir.join("ckpt").to_str().unwrap(),
            ],
            victim,
            after_ms,
        );
        let got = camera_frames(&out);
        assert_eq!(
            got.len(),
            expected.len(),
            "trial {trial}: every frame exactly once (no loss, no duplicate)"
        );
        assert_eq!(got, expected, "trial {trial}");
    }
}

/// The test broker's pid, now (a restart changes it).
fn broker_pid() -> String {
    let port = std::env::var("RIFFLE_KAFKA_PORT")
        .expect("RIFFLE_KAFKA_PORT: the test broker's port (scripts/test.sh sets it)");
    let out = Command::new(repo().join("scripts/kafka.sh"))
        .arg("pid")
        .env("RIFFLE_KAFKA_PORT", port)
        .output()
        .unwrap();
    let pid = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(
        out.status.success() && !pid.is_empty(),
        "no test broker running (scripts/kafka.sh start)"
    );
    pid
}

/// librdkafka prefetches a whole small topic at once: with at most 64 KB queued (two frames)
/// per partition, a run paced at a few frames a second needs the broker until its end.
fn fetching_as_it_goes(yaml: String) -> String {
    let paced = yaml.replace(
        "stop_at_end: true,",
        "stop_at_end: true, options: { queued.max.messages.kbytes: \"64\" },",
    );
    assert_ne!(paced, yaml, "the source's options were set");
    paced
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[test]
fn a_10_second_broker_outage_mid_run_loses_nothing() {
    // Stops the broker: no other test in this binary may run meanwhile.
    let _broker = BROKER.write().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let broker_pid = broker_pid();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "street", 0..120);
    let input = topic("outage-in");
    produce(&[
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--partitions",
        "2",
        "--frames",
        frames.to_str().unwrap(),
        "--cameras",
        "2",
    ]);
    let out = tmp.path().join("out.jsonl");
    // 2 workers × 8 frames/s: 120 frames take about 7.5 s of reading.
    let p = write(
        tmp.path(),
        "outage.yaml",
        &fetching_as_it_goes(detection_from_kafka(
            &brokers,
            &input,
            2,
            Some(8),
            &format!(
                "sink: {{ jsonl: {{ path: \"{}\" }} }}\nruntime: {{ workers: 2, epoch_records: 2, max_epochs_in_flight: 1 }}",
                out.display()
            ),
        )),
    );
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("RUST_LOG", "error")
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while lines(&out) == 0 {
        assert!(std::time::Instant::now() < deadline, "first results");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        run.try_wait().unwrap().is_none(),
        "the run must still be going when the broker stops"
    );
    // The broker stops answering for 10 s (paused: its data survives, as on a real restart).
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &broker_pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    // Resumed even if this test fails, so later tests find a working broker.
    struct Resume<'a>(&'a str);
    impl Drop for Resume<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", self.0])
                .status();
        }
    }
    let resume = Resume(&broker_pid);
    let at_stop = lines(&out);
    std::thread::sleep(std::time::Duration::from_secs(10));
    // The run waited for the broker: alive, with frames it had not fetched yet.
    let at_resume = lines(&out);
    assert!(
        run.try_wait().unwrap().is_none(),
        "the run waits out the outage"
    );
    assert!(
        at_resume < 120,
        "the run needed the broker after the outage ({at_stop} results at the stop, \
         {at_resume} at its end)"
    );
    drop(resume);
    let status = run.wait().unwrap();
    assert!(status.success());
    assert_eq!(
        camera_frames(&out),
        split_cameras("street", 120, 2),
        "every frame exactly once after the outage"
    );
}

/// The broker crashes (`kill -9`) and restarts on its data mid-run, under a Kafka → Kafka
/// exactly-once run of 2 supervised processes: a reader with `read_committed` then sees every
/// result once.
#[test]
fn a_broker_crash_and_restart_mid_run_leaves_each_result_once() {
    let _broker = BROKER.write().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let input = frames_topic(&brokers, tmp.path(), "restart-in", 120);
    let output = topic("restart-out");
    let p = write(
        tmp.path(),
        "restart.yaml",
        &fetching_as_it_goes(detection_from_kafka(
            &brokers,
            &input,
            2,
            Some(8),
            // An outage longer than the transaction timeout: the broker aborts the open
            // transaction itself as it comes back.
            &exactly_once_tail(
                &brokers,
                &output,
                "exactly_once: transactions, transaction_timeout_ms: 10000",
                1,
                500,
            ),
        )),
    );
    let mut supervisor = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap(), "--processes", "2"])
        .args(["--base-port", &free_port_pair().to_string()])
        .env(
            "RUST_LOG",
            "error,riffle_connectors::kafka::transactions=info",
        )
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    // (The sink creates the topic once it starts.)
    let committed = || {
        let out = kcat_read(&brokers, &output, "read_committed");
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    while committed() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "first committed results"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let before = committed();
    assert!(
        supervisor.try_wait().unwrap().is_none() && before < 120,
        "the crash lands mid-run ({before} of 120 committed)"
    );
    let restarted = Command::new(repo().join("scripts/kafka.sh"))
        .arg("restart")
        .output()
        .unwrap();
    assert!(
        restarted.status.success(),
        "restarting the broker: {}",
        String::from_utf8_lossy(&restarted.stderr)
    );
    let status = supervisor.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut supervisor.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    // Whether the broker left a transaction open on a partition (it does in most runs at this
    // timeout) and the restarted sink aborted it: without that, the epoch is written twice.
    for line in stderr.lines().filter(|l| l.contains("was left open")) {
        eprintln!("{line}");
    }
    let got = frames_of_lines(&kcat_values(&brokers, &output, "read_committed"), "kcat");
    assert_eq!(
        got,
        split_cameras("street", 120, 4),
        "every frame once after the broker's restart ({before} committed before it)"
    );
}

#[test]
fn kill_9_into_a_kafka_sink_with_markers_leaves_every_result_committed_exactly_once() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let input = frames_topic(&brokers, tmp.path(), "eo-in", 160);
    let expected = split_cameras("street", 160, 4);
    let mut redone = 0;
    // Paced at 2 × 15 frames/s: a run takes about 5 s, after 1–2 s of start-up.
    for (trial, (victim, after_ms)) in [(0usize, 3500u64), (1, 4500)].into_iter().enumerate() {
        let output = topic(&format!("eo-out{trial}"));
        let pipeline = detection_from_kafka(
            &brokers,
            &input,
            4,
            Some(15),
            &exactly_once_tail(&brokers, &output, "exactly_once: markers", 1, 700),
        );
        let dir = tmp.path().join(format!("trial{trial}"));
        std::fs::create_dir_all(&dir).unwrap();
        let p = write(&dir, "eo.yaml", &pipeline);
        run_killing_one(&p, &[], victim, after_ms);
        let (committed, left) = consume_committed(&brokers, &output);
        let mut got: Vec<(String, i64)> = committed
            .iter()
            .map(|m| {
                let v: Value = serde_json::from_slice(&m.value).unwrap();
                (
                    v["camera_id"].as_str().unwrap().to_string(),
                    v["frame"].as_i64().unwrap(),
                )
            })
            .collect();
        got.sort();
        let raw = consume_all(&brokers, &output)
            .iter()
            .filter(|m| !m.value.is_empty())
            .count();
        eprintln!(
            "trial {trial}: {raw} results written, {} committed, {left} voided by the fence",
            got.len()
        );
        assert_eq!(
            left, 0,
            "trial {trial}: the last run committed all it wrote"
        );
        assert_eq!(got, expected, "trial {trial}: every frame exactly once");
        redone += raw - got.len();
    }
    // Checkpoints 0.7 s apart: the killed runs had written results no checkpoint covered,
    // which the topic holds twice and the committed view once.
    assert!(redone > 0, "the trials exercised fencing");
}

/// The venv with kafka-python (a consumer that shares no code with librdkafka), made by
/// `scripts/setup.sh`.
fn kafka_python() -> std::path::PathBuf {
    let cache = cache_dir();
    let python = cache.join("kafka-venv/bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import kafka"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ready,
        "{} has no kafka-python: run scripts/setup.sh (or `python3 -m venv {venv} && \
         {venv}/bin/pip install kafka-python==3.0.12`)",
        python.display(),
        venv = cache.join("kafka-venv").display()
    );
    python
}

/// `(camera_id, frame)` of JSON result lines; fails on an empty line (a marker record).
fn frames_of_lines(text: &str, reader: &str) -> Vec<(String, i64)> {
    let mut got: Vec<(String, i64)> = text
        .lines()
        .map(|line| {
            assert!(!line.trim().is_empty(), "{reader}: an empty message");
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{reader}: not a result ({e}): {line:?}"));
            (
                v["camera_id"].as_str().unwrap().to_string(),
                v["frame"].as_i64().unwrap(),
            )
        })
        .collect();
    got.sort();
    got
}

/// Every message value of `topic` read by kcat (Debian's, an independent client) at
/// `isolation`.
fn kcat_values(brokers: &str, topic: &str, isolation: &str) -> String {
    let out = kcat_read(brokers, topic, isolation);
    assert!(
        out.status.success(),
        "kcat: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn kcat_read(brokers: &str, topic: &str, isolation: &str) -> std::process::Output {
    Command::new("kcat")
        .args([
            "-C",
            "-b",
            brokers,
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
        ])
        .args(["-X", &format!("isolation.level={isolation}"), "-f", "%s\n"])
        .output()
        .expect("kcat (Debian package `kcat`; scripts/test.sh installs it)")
}

#[test]
fn kill_9_at_random_moments_leaves_each_result_once_for_read_committed_consumers() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let python = kafka_python();
    let tmp = tempfile::tempdir().unwrap();
    let input = frames_topic(&brokers, tmp.path(), "txn-in", 120);
    let expected = split_cameras("street", 120, 4);
    // Moments drawn from a seed printed here, so a failing trial can be replayed.
    let mut rng = Rng::seeded("RIFFLE_KILL_SEED");
    let mut next = move || rng.next();
    let mut aborted = 0;
    for trial in 0..10 {
        let victim = (next() % 2) as usize;
        // A run reads for about 4 s after 1–2 s of start-up.
        let after_ms = 1800 + next() % 2700;
        let output = topic(&format!("txn-out{trial}"));
        let pipeline = detection_from_kafka(
            &brokers,
            &input,
            4,
            Some(15),
            &exactly_once_tail(&brokers, &output, "exactly_once: transactions", 1, 500),
        );
        let dir = tmp.path().join(format!("trial{trial}"));
        std::fs::create_dir_all(&dir).unwrap();
        let p = write(&dir, "txn.yaml", &pipeline);
        run_killing_one(&p, &[], victim, after_ms);
        let what = format!("trial {trial} (process {victim} killed at {after_ms} ms)");
        let kcat = frames_of_lines(&kcat_values(&brokers, &output, "read_committed"), "kcat");
        assert_eq!(
            kcat, expected,
            "{what}: kcat read_committed sees every frame once"
        );
        let py = Command::new(&python)
            .arg(repo().join("tests/interop/read_committed.py"))
            .args([&brokers, &output])
            .output()
            .unwrap();
        assert!(
            py.status.success(),
            "{what}: kafka-python: {}",
            String::from_utf8_lossy(&py.stderr)
        );
        let py = frames_of_lines(&String::from_utf8(py.stdout).unwrap(), "kafka-python");
        assert_eq!(
            py, expected,
            "{what}: kafka-python read_committed sees every frame once"
        );
        let all = kcat_values(&brokers, &output, "read_uncommitted");
        aborted += all.lines().count() - expected.len();
    }
    // The killed runs had written results in transactions that never committed: a reader
    // that ignores transactions sees them, read_committed ones do not.
    assert!(aborted > 0, "the trials aborted some transactions");
}

/// Consumer-group mode: cluster A reads alone, then cluster B joins the group mid-run and
/// takes partitions over; together they commit every frame exactly once.
#[test]
fn a_second_cluster_joining_the_group_takes_partitions_without_loss_or_duplicates() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let input = frames_topic(&brokers, tmp.path(), "group-in", 160);
    let expected = split_cameras("street", 160, 4);
    let output = topic("group-out");
    let group = topic("group");
    let cluster = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = detection_from_kafka(
            &brokers,
            &input,
            4,
            Some(8),
            &exactly_once_tail(
                &brokers,
                &output,
                &format!("exactly_once: transactions, transactional_id: riffle-{name}-{output}"),
                2,
                300,
            ),
        )
        .replace(
            "stop_at_end: true",
            &format!("stop_at_end: true, group_id: {group}"),
        );
        let p = write(&dir, "group.yaml", &yaml);
        let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args(["run", "-q", p.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stderr(log)
            .spawn()
            .unwrap();
        (child, dir.join("stderr.log"))
    };
    let (mut a, a_log) = cluster("a");
    std::thread::sleep(std::time::Duration::from_secs(5));
    let (mut b, b_log) = cluster("b");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let mut children = [&mut a, &mut b];
    for i in 0..2 {
        let status = loop {
            if let Some(s) = children[i].try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                for child in children.iter_mut() {
                    let _ = child.kill();
                }
                panic!(
                    "the clusters did not finish:\nA: {}\nB: {}",
                    std::fs::read_to_string(&a_log).unwrap_or_default(),
                    std::fs::read_to_string(&b_log).unwrap_or_default()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        assert!(
            status.success(),
            "cluster {} failed ({status}):\nA: {}\nB: {}",
            ["A", "B"][i],
            std::fs::read_to_string(&a_log).unwrap_or_default(),
            std::fs::read_to_string(&b_log).unwrap_or_default()
        );
    }
    let (a_log, b_log) = (
        std::fs::read_to_string(&a_log).unwrap(),
        std::fs::read_to_string(&b_log).unwrap(),
    );
    assert!(
        a_log.contains("kafka group: handed over partitions ["),
        "A handed partitions to B: {a_log}"
    );
    assert!(
        b_log
            .lines()
            .any(|l| l.contains("kafka group: assigned partitions [") && !l.contains("[]")),
        "B got partitions: {b_log}"
    );
    let got = frames_of_lines(&kcat_values(&brokers, &output, "read_committed"), "kcat");
    assert_eq!(got, expected, "every frame once across both clusters");
}

/// Consumer-group mode on a topic that grows: a partition added mid-run joins the assignment
/// and its frames are committed once, with the others.
#[test]
fn a_partition_added_mid_run_is_read_once() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    // 60 frames as 2 cameras on 2 partitions.
    let input = cameras_topic(&brokers, tmp.path(), "grow-in", 60, 2);
    let output = topic("grow-out");
    let yaml = detection_from_kafka(
        &brokers,
        &input,
        4,
        Some(10),
        &exactly_once_tail(&brokers, &output, "exactly_once: transactions", 2, 300),
    )
    .replace(
        "stop_at_end: true",
        &format!("group_id: {}", topic("grow-group")),
    );
    let p = write(tmp.path(), "grow.yaml", &yaml);
    let log = std::fs::File::create(tmp.path().join("stderr.log")).unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stderr(log)
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let run = Kill(&mut run);
    std::thread::sleep(std::time::Duration::from_secs(3));

    // A third partition, and 20 frames of a third camera in it.
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let added = runtime
        .block_on(admin.create_partitions(
            [&NewPartitions::new(&input, 3)],
            &AdminOptions::new().operation_timeout(Some(std::time::Duration::from_secs(10))),
        ))
        .unwrap();
    assert!(added.iter().all(|r| r.is_ok()), "{added:?}");
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let frames = frames_subset(&tmp.path().join("more"), "street", 60..80);
    let mut files: Vec<_> = std::fs::read_dir(frames.join("street"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for (i, file) in files.iter().enumerate() {
        let bytes = std::fs::read(file).unwrap();
        let frame = (60 + i).to_string();
        let headers = OwnedHeaders::new().insert(Header {
            key: "frame",
            value: Some(frame.as_bytes()),
        });
        producer
            .send(
                BaseRecord::to(&input)
                    .partition(2)
                    .key("street-2")
                    .payload(&bytes)
                    .headers(headers),
            )
            .unwrap();
    }
    producer.flush(std::time::Duration::from_secs(30)).unwrap();

    let mut expected = split_cameras("street", 60, 2);
    expected.extend((60..80).map(|f| ("street-2".to_string(), f)));
    expected.sort();
    // The run never ends by itself (no stop_at_end): wait until everything is committed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let got = loop {
        let got = frames_of_lines(&kcat_values(&brokers, &output, "read_committed"), "kcat");
        if got.len() >= expected.len() || std::time::Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    drop(run);
    let log = std::fs::read_to_string(tmp.path().join("stderr.log")).unwrap();
    assert_eq!(
        got, expected,
        "every frame once, the added partition's too:\n{log}"
    );
    let assigned_2 = log.lines().any(|l| {
        l.split("kafka group: assigned partitions [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .is_some_and(|list| list.split(", ").any(|p| p == "2"))
    });
    assert!(assigned_2, "partition 2 was assigned: {log}");
}

#[test]
fn the_shipped_kafka_recommendation_pipeline_answers_every_click_once() {
    let _broker = BROKER.read().unwrap_or_else(|e| e.into_inner());
    require_onnx_runtime();
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let ratings = repo().join("data/ml-100k/ratings.csv");
    assert!(
        ratings.is_file(),
        "run scripts/setup.sh (it fetches MovieLens-100k)"
    );
    let text = std::fs::read_to_string(&ratings).unwrap();
    let prefix: Vec<&str> = text.lines().take(1501).collect();
    let csv = write(tmp.path(), "ratings.csv", &(prefix.join("\n") + "\n"));
    let (input, output) = (topic("ratings"), topic("recs"));
    produce(&[
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--partitions",
        "4",
        "--csv",
        csv.to_str().unwrap(),
        "--key",
        "user_id",
    ]);
    let yaml = shipped("clickstream-recs-kafka.yaml", tmp.path())
        .replace("127.0.0.1:9092", &brokers)
        .replace("topic: ratings", &format!("topic: {input}"))
        .replace("topic: recs", &format!("topic: {output}"));
    let file = write(tmp.path(), "recs-kafka.yaml", &yaml);
    let port = free_port_pair().to_string();
    riffle_ok(&[
        "run",
        "-q",
        file.to_str().unwrap(),
        "--processes",
        "2",
        "--base-port",
        &port,
    ]);
    let (committed, left) = consume_committed(&brokers, &output);
    assert_eq!(left, 0);
    let mut clicks: Vec<(i64, i64, i64)> = committed
        .iter()
        .map(|m| {
            let v: Value = serde_json::from_slice(&m.value).unwrap();
            assert!(v["recs"].as_array().unwrap().len() <= 10, "{v}");
            (
                v["timestamp"].as_i64().unwrap(),
                v["user_id"].as_i64().unwrap(),
                v["item_id"].as_i64().unwrap(),
            )
        })
        .collect();
    clicks.sort();
    let mut expected: Vec<(i64, i64, i64)> = prefix[1..]
        .iter()
        .map(|l| {
            let f: Vec<i64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            (f[3], f[0], f[1])
        })
        .collect();
    expected.sort();
    assert_eq!(clicks, expected, "every click answered exactly once");
    let with_recs = committed
        .iter()
        .filter(|m| {
            m.value.windows(8).any(|w| w == b"\"recs\":[")
                && !m.value.windows(9).any(|w| w == b"\"recs\":[]")
        })
        .count();
    assert!(
        with_recs > 1000,
        "most clicks get recommendations: {with_recs}"
    );
}

#[test]
fn a_live_topic_gets_results_before_their_epoch_commits() {
    let _shared = BROKER.read().unwrap_or_else(|p| p.into_inner());
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..30);
    let live = topic("live");
    let out = tmp.path().join("out.jsonl");
    // 30 frames at 10 a second in one epoch: the committed file is written when the input
    // ends (3 s), the live topic as frames are read.
    let text = format!(
        r#"
source: {{ images: {{ path: "{frames}", batch_size: 1, max_records_per_second: 10 }} }}
stages:
  - decode: {{}}
  - select: {{ columns: [camera_id, frame] }}
sink: {{ jsonl: {{ path: "{out}" }} }}
live_sink: {{ kafka: {{ brokers: "{brokers}", topic: "{live}", exactly_once: transactions }} }}
runtime: {{ workers: 1, epoch_records: 1000 }}
"#,
        frames = frames.display(),
        out = out.display(),
    );
    let pipeline = write(tmp.path(), "p.yaml", &text);
    let mut child = spawn_run(&pipeline);
    std::thread::sleep(std::time::Duration::from_millis(2000));
    // The live topic is written without transactions (whatever `exactly_once` says), so a
    // read_committed reader sees it at once.
    let midway = consume_all(&brokers, &live).len();
    let committed_midway = std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
    assert!(child.wait().unwrap().success());
    assert!(midway >= 5, "{midway} live messages 2 s into the run");
    assert_eq!(committed_midway, 0);
    let mut live_frames: Vec<i64> = consume_all(&brokers, &live)
        .iter()
        .map(|m| {
            serde_json::from_slice::<Value>(&m.value).unwrap()["frame"]
                .as_i64()
                .unwrap()
        })
        .collect();
    live_frames.sort();
    let committed: Vec<i64> = camera_frames(&out).into_iter().map(|(_, f)| f).collect();
    assert_eq!(live_frames, committed);
    assert_eq!(committed.len(), 30);
}
