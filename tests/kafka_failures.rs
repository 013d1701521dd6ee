//! Failures an operator meets on a SASL_SSL Kafka (`scripts/kafka.sh start`'s broker), tried as
//! they would: each run ends on its own, with an error naming the cause, and a stop signal
//! always ends a run.
//!
//! - A sink with a wrong password fails at its start saying "authentication", with one worker
//!   or two, creating its topic or not, with transactions or without.
//! - A wrong SASL mechanism is named as such (no TLS hint); a missing or unreadable CA file is
//!   named with its path; a wait for the brokers ends as soon as librdkafka reports an error
//!   that retrying cannot cure.
//! - A worker that fails mid-run stops the whole run with its own error (no "worker 1 has been
//!   silent … its process or host is gone" in a one-process run).
//! - SIGTERM stops a run whose worker is stuck in a call (a sink waiting for a topic that will
//!   never exist).
//!
//! Times here are hang guards only (a run still going after 30 s is killed and the test
//! fails), never measurements.

mod common;

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::kafka::{brokers, topic};
use common::write;

/// A run still going after this is hung: killed, and the test fails.
const HUNG: Duration = Duration::from_secs(30);

/// A value `scripts/kafka.sh env` exports (`scripts/test.sh` evaluates it).
fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `eval \"$(scripts/kafka.sh env)\"` (scripts/test.sh does)")
    })
}

/// The test broker's SASL_SSL listener, with `mechanism`, `password` and CA file `ca`: the
/// `options:` block of a Kafka source or sink (indented for a block under `kafka:`).
fn sasl_options(mechanism: &str, password: &str, ca: &str) -> String {
    format!(
        "    options:\n      security.protocol: SASL_SSL\n      sasl.mechanisms: {mechanism}\n      \
         sasl.username: {user}\n      sasl.password: {password}\n      ssl.ca.location: {ca}\n",
        user = var("RIFFLE_KAFKA_USER"),
    )
}

/// 300 rows of `user,item`.
fn csv(dir: &Path) -> std::path::PathBuf {
    let mut text = String::from("user,item\n");
    for i in 1..=300 {
        text.push_str(&format!("{i},{}\n", i * 2));
    }
    write(dir, "in.csv", &text)
}

/// A CSV of 300 rows into a Kafka sink: `sink` is the rest of the sink's block (brokers,
/// topic, options), `runtime` the runtime block.
fn csv_to_kafka(dir: &Path, sink: &str, runtime: &str) -> std::path::PathBuf {
    let input = csv(dir);
    write(
        dir,
        "p.yaml",
        &format!(
            "source:\n  csv: {{ path: \"{}\" }}\nstages: []\nsink:\n  kafka:\n{sink}{runtime}",
            input.display()
        ),
    )
}

/// The 300 rows of [`csv`] in a new topic of the plain listener, read by a Kafka source into a
/// Kafka sink: `sink` and `runtime` as for [`csv_to_kafka`].
fn kafka_to_kafka(dir: &Path, sink: &str, runtime: &str) -> std::path::PathBuf {
    let brokers = brokers();
    let input = topic("rows");
    let rows = csv(dir);
    common::riffle_ok(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--partitions",
        "2",
        "--csv",
        rows.to_str().unwrap(),
    ]);
    write(
        dir,
        "p.yaml",
        &format!(
            "source:\n  kafka: {{ brokers: \"{brokers}\", topic: {input}, format: json, \
             stop_at_end: true }}\nstages: []\nsink:\n  kafka:\n{sink}{runtime}"
        ),
    )
}

struct Ended {
    status: ExitStatus,
    stderr: String,
}

/// Runs `riffle run -q pipeline` with `extra` arguments to its end; `signal` is called with the
/// child's pid once it runs (to stop it). A run still going after [`HUNG`] is killed and
/// fails the test.
fn run(pipeline: &Path, extra: &[&str], signal: impl FnOnce(u32)) -> Ended {
    let dir = pipeline.parent().expect("the pipeline's directory");
    let log = dir.join("stderr.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q"])
        .args(extra)
        .arg(pipeline)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    signal(child.id());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > HUNG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the run is hung: still going after {HUNG:?}; stderr so far:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ended {
        status,
        stderr: std::fs::read_to_string(&log).unwrap(),
    }
}

/// The run failed, and its error says none of what hid the cause before: timeouts,
/// undelivered counts, a lost peer.
fn assert_failed_with_its_cause(ended: &Ended, what: &str) {
    let stderr = &ended.stderr;
    assert!(!ended.status.success(), "{what}: exits non-zero\n{stderr}");
    for hiding in [
        "OperationTimedOut",
        "still undelivered",
        "has been silent",
        "process or host is gone",
    ] {
        assert!(
            !stderr.contains(hiding),
            "{what}: `{hiding}` hides the cause\n{stderr}"
        );
    }
}

/// The sink checks its connection and credentials at its start, as the source does: a wrong
/// password stops the run at once saying "authentication", whatever the worker count, whether
/// it creates its topic, and with transactions (checked before they are initialised).
#[test]
fn a_sink_with_a_wrong_password_fails_at_start_saying_authentication() {
    brokers();
    let ssl = var("RIFFLE_KAFKA_SSL_BROKERS");
    let options = sasl_options("SCRAM-SHA-512", "not-the-password", &var("RIFFLE_KAFKA_CA"));
    for (case, settings, runtime) in [
        // The run that never ended: two workers, a topic it does not create.
        (
            "2 workers, create_topic: false",
            "    create_topic: false\n",
            "runtime: { workers: 2 }\n",
        ),
        (
            "1 worker, creating its topic",
            "",
            "runtime: { workers: 1 }\n",
        ),
        (
            "transactions with checkpoints",
            "    exactly_once: transactions\n",
            "runtime: { workers: 2, checkpoint: { dir: ckpt } }\n",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let sink = format!(
            "    brokers: \"{ssl}\"\n    topic: {}\n{settings}{options}",
            topic("wrong-password")
        );
        let pipeline = if runtime.contains("checkpoint") {
            // Checkpoints need a source that resumes: the same rows from a topic.
            kafka_to_kafka(tmp.path(), &sink, runtime)
        } else {
            csv_to_kafka(tmp.path(), &sink, runtime)
        };
        let ended = run(&pipeline, &[], |_| {});
        assert_failed_with_its_cause(&ended, case);
        assert!(
            ended.stderr.contains("authentication failed")
                && ended.stderr.contains("sasl.password"),
            "{case}: names the cause\n{}",
            ended.stderr
        );
        assert!(
            !ended.stderr.contains("not-the-password"),
            "{case}: the password is not printed\n{}",
            ended.stderr
        );
    }
}

/// A SASL mechanism the brokers do not offer is named as such, with what they offer, for a
/// sink and for a source: not a hint at TLS.
#[test]
fn a_wrong_sasl_mechanism_is_named_not_taken_for_tls() {
    brokers();
    let ssl = var("RIFFLE_KAFKA_SSL_BROKERS");
    let options = sasl_options(
        "SCRAM-SHA-256",
        &var("RIFFLE_KAFKA_PASSWORD"),
        &var("RIFFLE_KAFKA_CA"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let sink = format!(
        "    brokers: \"{ssl}\"\n    topic: {}\n{options}",
        topic("mechanism")
    );
    let as_sink = csv_to_kafka(tmp.path(), &sink, "runtime: { workers: 2 }\n");
    let as_source = write(
        tmp.path(),
        "source.yaml",
        &format!(
            "source:\n  kafka:\n    brokers: \"{ssl}\"\n    topic: {}\n    format: json\n    \
             stop_at_end: true\n{options}stages: []\nsink: {{ jsonl: {{ path: out.jsonl }} }}\n",
            topic("mechanism-in")
        ),
    );
    for (case, pipeline) in [("sink", as_sink), ("source", as_source)] {
        let ended = run(&pipeline, &[], |_| {});
        assert_failed_with_its_cause(&ended, case);
        let stderr = &ended.stderr;
        assert!(
            stderr.contains("do not offer this SASL mechanism")
                && stderr.contains("sasl.mechanisms")
                && stderr.contains("SCRAM-SHA-512"),
            "{case}: names the mechanism and what the brokers offer\n{stderr}"
        );
        assert!(
            !stderr.contains("TLS") && !stderr.contains("ssl.ca.location"),
            "{case}: no TLS hint\n{stderr}"
        );
    }
}

/// A CA file that is missing, or there but no certificate, is named with its path, for a
/// source and for a sink.
#[test]
fn a_missing_or_unreadable_ca_file_is_named_with_its_path() {
    brokers();
    let ssl = var("RIFFLE_KAFKA_SSL_BROKERS");
    let password = var("RIFFLE_KAFKA_PASSWORD");
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing-ca.pem");
    let garbage = write(tmp.path(), "garbage-ca.pem", "not a certificate\n");
    for ca in [&missing, &garbage] {
        let options = sasl_options("SCRAM-SHA-512", &password, &ca.display().to_string());
        let dir = tempfile::tempdir().unwrap();
        let sink = format!(
            "    brokers: \"{ssl}\"\n    topic: {}\n{options}",
            topic("ca")
        );
        let as_sink = csv_to_kafka(dir.path(), &sink, "runtime: { workers: 2 }\n");
        let as_source = write(
            dir.path(),
            "source.yaml",
            &format!(
                "source:\n  kafka:\n    brokers: \"{ssl}\"\n    topic: {}\n    format: json\n    \
                 stop_at_end: true\n{options}stages: []\nsink: {{ jsonl: {{ path: out.jsonl }} }}\n",
                topic("ca-in")
            ),
        );
        for (case, pipeline) in [("sink", as_sink), ("source", as_source)] {
            let ended = run(&pipeline, &[], |_| {});
            assert_failed_with_its_cause(&ended, case);
            assert!(
                ended.stderr.contains("ssl.ca.location")
                    && ended.stderr.contains(&ca.display().to_string()),
                "{case}, {}: names the option and the path\n{}",
                ca.display(),
                ended.stderr
            );
        }
    }
}

/// A wait for the brokers' metadata ends once librdkafka reports wrong credentials, not at
/// its timeout: with 10 minutes to wait, it returns within the hang guard, naming the cause.
#[test]
fn a_wait_for_the_brokers_ends_at_an_error_retrying_cannot_cure() {
    use riffle_connectors::kafka::client::{client_config, fetch_metadata, Diagnosed, Role};
    brokers();
    let ssl = var("RIFFLE_KAFKA_SSL_BROKERS");
    let options: std::collections::BTreeMap<String, String> = [
        ("security.protocol", "SASL_SSL".to_string()),
        ("sasl.mechanisms", "SCRAM-SHA-512".to_string()),
        ("sasl.username", var("RIFFLE_KAFKA_USER")),
        ("sasl.password", "not-the-password".to_string()),
        ("ssl.ca.location", var("RIFFLE_KAFKA_CA")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let consumer: rdkafka::consumer::BaseConsumer<Diagnosed> =
            client_config(&ssl, &options, Role::Admin)
                .create_with_context(Diagnosed::default())
                .unwrap();
        let answer = fetch_metadata(&consumer, None, Duration::from_secs(600)).map(|_| ());
        let _ = done.send(answer);
    });
    let answer = result
        .recv_timeout(HUNG)
        .expect("the wait ends at the authentication error, not after its 600 s");
    let err = answer.expect_err("wrong credentials");
    assert!(err.starts_with("authentication failed"), "{err}");
    assert!(err.contains("invalid credentials"), "{err}");
}

/// A worker that fails mid-run (the sink: every delivery refused, each message larger than
/// the topic takes) stops the whole two-worker run with its own error, while the other worker
/// had already finished its part.
#[test]
fn a_worker_that_fails_mid_run_stops_the_whole_run_with_its_error() {
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let sink = format!(
        "    brokers: \"{brokers}\"\n    topic: {}\n    replication_factor: 1\n    \
         topic_config: {{ max.message.bytes: \"16\" }}\n",
        topic("too-small")
    );
    let ended = run(
        &csv_to_kafka(tmp.path(), &sink, "runtime: { workers: 2 }\n"),
        &[],
        |_| {},
    );
    assert_failed_with_its_cause(&ended, "a refused delivery");
    assert!(
        ended.stderr.contains("MessageSizeTooLarge") && ended.stderr.contains("not delivered"),
        "the sink's own error\n{}",
        ended.stderr
    );
}

/// SIGTERM stops a run whose worker is stuck in a call: here the sink waits (for 10 minutes)
/// to deliver to a topic that does not exist and that nobody will create. The run ends with
/// an error naming the stuck worker.
#[test]
fn sigterm_stops_a_run_whose_worker_is_stuck() {
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let sink = format!(
        "    brokers: \"{brokers}\"\n    topic: {}\n    create_topic: false\n    \
         delivery_timeout_ms: 600000\n    options:\n      allow.auto.create.topics: \"false\"\n      \
         topic.metadata.propagation.max.ms: \"600000\"\n      message.timeout.ms: \"600000\"\n",
        topic("never-created")
    );
    let pipeline = csv_to_kafka(tmp.path(), &sink, "runtime: { workers: 2 }\n");
    let port = common::free_port().to_string();
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let ended = run(
        &pipeline,
        &["--metrics-addr", &format!("127.0.0.1:{port}")],
        |pid| {
            // Stuck once the sink has taken every result: it then waits for their delivery.
            let deadline = Instant::now() + HUNG;
            while !sink_took(&metrics, 300) {
                assert!(Instant::now() < deadline, "the sink took the 300 results");
                std::thread::sleep(Duration::from_millis(100));
            }
            // SAFETY: kill(2) on our own child's pid, not yet reaped.
            let sent = unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            assert_eq!(sent, 0, "SIGTERM sent");
        },
    );
    assert!(
        !ended.status.success(),
        "a stuck stop is not a clean end\n{}",
        ended.stderr
    );
    assert!(
        ended.stderr.contains("stopped on request") && ended.stderr.contains("worker 0"),
        "names the stop and the stuck worker\n{}",
        ended.stderr
    );
}

/// Whether the run's `/metrics` show `rows` results taken by the sink.
fn sink_took(url: &str, rows: u64) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let Ok(mut response) = agent.get(url).call() else {
        return false;
    };
    let body = response.body_mut().read_to_string().unwrap_or_default();
    body.lines().any(|l| {
        l.strip_prefix("riffle_stage_records_out_total{stage=\"sink\"} ")
            .and_then(|n| n.trim().parse::<f64>().ok())
            .is_some_and(|n| n >= rows as f64)
    })
}
