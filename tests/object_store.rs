//! Checkpoints on an S3-compatible object store (`runtime.checkpoint.url`), with the real
//! `riffle` binary against a real server (S3Proxy, `scripts/s3.sh`) and a Kafka source paced
//! so that the run is still going when a test interferes: a `kill -9` and a restart, the store
//! down mid-run, a torn checkpoint object, and two clusters on one prefix. Every test checks
//! the JSON-lines output holds each record exactly once.
//!
//! Needs the test broker (`scripts/kafka.sh start`) and the S3 server (`scripts/s3.sh start`,
//! `eval "$(scripts/s3.sh env)"`); scripts/test.sh starts both.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::kafka::{brokers, topic};
use common::s3::{bucket, checkpoints, fresh_url, location, OwnServer};
use common::*;
use riffle_dataflow::checkpoint::{CheckpointStore, Location};

/// Logs that tell what the checkpoints did (resumed from, skipped, delayed, the lease).
const LOG: &str = "warn,riffle_dataflow=info";

/// A topic of `n` JSON records `{id, value}` over 2 partitions.
fn id_topic(tmp: &Path, name: &str, n: usize) -> String {
    let mut csv = String::from("id,value\n");
    for i in 0..n {
        csv.push_str(&format!("{i},{}.5\n", i % 7));
    }
    let csv = write(tmp, &format!("{name}.csv"), &csv);
    let topic = topic(name);
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers(),
        "--topic",
        &topic,
        "--partitions",
        "2",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    topic
}

/// Kafka → JSON lines (`out.jsonl`) at `rate` records a second, checkpointing with the
/// `runtime.checkpoint` keys `checkpoint` (a flow mapping's inside).
fn pipeline(dir: &Path, topic: &str, rate: u32, checkpoint: &str) -> PathBuf {
    write(
        dir,
        "ids.yaml",
        &format!(
            r#"
source: {{ kafka: {{ brokers: "{brokers}", topic: {topic}, format: json, stop_at_end: true, batch_size: 8, max_records_per_second: {rate} }} }}
stages:
  - select: {{ columns: [id, value] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 1, epoch_records: 8, checkpoint: {{ {checkpoint} }} }}
"#,
            brokers = brokers()
        ),
    )
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("RUST_LOG", LOG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `riffle ARGS` to its end, with the checkpoints' logs.
fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("RUST_LOG", LOG)
        .output()
        .unwrap()
}

/// Waits for `child` to exit (at most `timeout`): its status and standard error.
fn finish(mut child: Child, timeout: Duration) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the run did not end within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each id's count in `out`, failing on any line that is not a whole JSON record.
/// Bytes of results waiting beside `out` for a checkpoint (`<name>.<offset>.uncommitted`).
fn staged_bytes(out: &Path) -> u64 {
    let name = out.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&format!("{name}.")) && n.ends_with(".uncommitted")
        })
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

fn id_counts(out: &Path) -> BTreeMap<i64, usize> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let row: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: corrupt line {line:?}: {e}", out.display(), i + 1));
        let id = row["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("{}:{}: no id in {line}", out.display(), i + 1));
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

/// Every id of `0..n` exactly once in `out`.
fn assert_exactly_once(out: &Path, n: usize, context: &str) {
    let counts = id_counts(out);
    let missing: Vec<i64> = (0..n as i64).filter(|i| !counts.contains_key(i)).collect();
    let twice: Vec<(&i64, &usize)> = counts.iter().filter(|(_, &c)| c > 1).collect();
    assert!(
        missing.is_empty() && twice.is_empty(),
        "{context}: missing {missing:?}, duplicated {twice:?}"
    );
    assert_eq!(counts.len(), n, "{context}: only the topic's ids");
}

/// The epoch in a checkpoint object's name.
fn epoch_of(name: &str) -> u64 {
    name.trim_start_matches("epoch-")
        .trim_end_matches(".ckpt")
        .parse()
        .unwrap()
}

/// Offsets the newest intact checkpoint under `at` has for the source: records read.
fn checkpointed_records(at: &Location) -> i64 {
    let latest = CheckpointStore::on(at.clone(), 3).latest().unwrap();
    let latest = latest.expect("a checkpoint");
    latest.sources.values().flat_map(|p| p.values()).sum()
}

#[test]
fn a_run_killed_with_sigkill_resumes_from_its_s3_checkpoint_exactly_once() {
    let bucket = bucket();
    let tmp = tempfile::tempdir().unwrap();
    let n = 240;
    let topic = id_topic(tmp.path(), "s3-kill", n);
    let url = fresh_url(&bucket, "kill");
    let at = location(&url, None);
    // 40 records a second: about 6 s of reading.
    let p = pipeline(
        tmp.path(),
        &topic,
        40,
        &format!("url: \"{url}\", timeout_s: 5"),
    );
    let out = tmp.path().join("out.jsonl");
    let mut first = spawn(&["run", "-q", p.to_str().unwrap()]);
    wait_for(
        "a checkpoint object and results",
        Duration::from_secs(60),
        || !checkpoints(&at).is_empty() && std::fs::metadata(&out).is_ok_and(|m| m.len() > 0),
    );
    assert!(
        at.exists("riffle.lease").unwrap(),
        "the run holds the lease"
    );
    assert!(
        first.try_wait().unwrap().is_none(),
        "the run was still going when the kill came"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    let written = id_counts(&out).len();
    assert!(
        written < n,
        "the kill landed mid-run ({written} of {n} written)"
    );
    assert!(
        at.exists("riffle.lease").unwrap(),
        "a killed run leaves its lease behind"
    );

    // The same command again: the dead process's lease is taken over at once (same host), the
    // run resumes from the checkpoint, and the results file is cut back to it.
    let again = run(&["run", "-q", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(stderr.contains("took over the lease"), "{stderr}");
    assert!(stderr.contains("is gone"), "{stderr}");
    assert!(
        stderr.contains("resuming from checkpoint epoch") && stderr.contains(&url),
        "{stderr}"
    );
    assert_exactly_once(&out, n, &format!("killed with {written} of {n} written"));
    assert_eq!(
        checkpointed_records(&at),
        n as i64,
        "the last checkpoint covers all"
    );
    assert!(
        !at.exists("riffle.lease").unwrap(),
        "a clean exit removes the lease"
    );
    assert!(checkpoints(&at).len() <= 3, "pruned to `keep`");
}

#[test]
fn a_store_down_mid_run_holds_results_back_until_a_checkpoint_covers_them_and_the_output_is_exactly_once(
) {
    let tmp = tempfile::tempdir().unwrap();
    let server = OwnServer::start(&tmp.path().join("s3"));
    let bucket = bucket();
    let n = 320;
    let topic = id_topic(tmp.path(), "s3-down", n);
    let url = fresh_url(&bucket, "down");
    let at = location(&url, Some(&server.endpoint()));
    let p = pipeline(
        tmp.path(),
        &topic,
        40,
        &format!(
            "url: \"{url}\", endpoint: \"{}\", timeout_s: 1, give_up_s: 120",
            server.endpoint()
        ),
    );
    let out = tmp.path().join("out.jsonl");
    let runner = spawn(&["run", "-q", p.to_str().unwrap()]);
    wait_for("a first checkpoint", Duration::from_secs(60), || {
        !checkpoints(&at).is_empty()
    });
    // The store goes away for 3 s. The run goes on: its results wait in the staging file
    // beside the output until a checkpoint covers them, so no reader sees one that a crash
    // meanwhile would take back.
    server.stop();
    let staged_before = staged_bytes(&out);
    std::thread::sleep(Duration::from_secs(3));
    let staged_during = staged_bytes(&out);
    server.resume();
    let (status, stderr) = finish(runner, Duration::from_secs(120));
    assert!(status.success(), "{stderr}");
    assert!(
        staged_during > staged_before,
        "results were written while the store was down, held back beside the output \
         ({staged_before} → {staged_during} staged bytes)"
    );
    assert!(
        stderr.contains("delayed") && stderr.contains(&url),
        "the log names the delayed checkpoint and the store: {stderr}"
    );
    assert!(
        stderr.contains("of failed writes"),
        "the log says when checkpoints went through again: {stderr}"
    );
    assert_exactly_once(&out, n, "after the outage");
    assert_eq!(
        checkpointed_records(&at),
        n as i64,
        "the run's last checkpoint, written after the outage, covers every record"
    );
}

#[test]
fn a_store_down_longer_than_give_up_s_fails_the_run_and_the_rerun_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let server = OwnServer::start(&tmp.path().join("s3"));
    let bucket = bucket();
    let n = 240;
    let topic = id_topic(tmp.path(), "s3-give-up", n);
    let url = fresh_url(&bucket, "give-up");
    let at = location(&url, Some(&server.endpoint()));
    let p = pipeline(
        tmp.path(),
        &topic,
        40,
        &format!(
            "url: \"{url}\", endpoint: \"{}\", timeout_s: 1, give_up_s: 2",
            server.endpoint()
        ),
    );
    let out = tmp.path().join("out.jsonl");
    let runner = spawn(&["run", "-q", p.to_str().unwrap()]);
    wait_for("a first checkpoint", Duration::from_secs(60), || {
        !checkpoints(&at).is_empty()
    });
    // A store that hangs (its process paused) rather than refusing: each request times out.
    let pid = server.pid().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let (status, stderr) = finish(runner, Duration::from_secs(60));
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("giving up on checkpoints at {url}"))
            && stderr.contains("runtime.checkpoint.give_up_s"),
        "one error naming the store and the setting: {stderr}"
    );
    let written = id_counts(&out).len();
    assert!(written < n, "it failed mid-run ({written} of {n})");

    let again = run(&["run", "-q", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert_exactly_once(&out, n, &format!("failed with {written} of {n} written"));
}

#[test]
fn a_torn_newest_checkpoint_object_is_skipped_and_the_previous_one_resumed() {
    let bucket = bucket();
    let tmp = tempfile::tempdir().unwrap();
    let n = 240;
    let topic = id_topic(tmp.path(), "s3-torn", n);
    let url = fresh_url(&bucket, "torn");
    let at = location(&url, None);
    let p = pipeline(
        tmp.path(),
        &topic,
        40,
        &format!("url: \"{url}\", keep: 5, timeout_s: 5"),
    );
    let out = tmp.path().join("out.jsonl");
    let mut first = spawn(&["run", "-q", p.to_str().unwrap()]);
    wait_for("two checkpoint objects", Duration::from_secs(60), || {
        checkpoints(&at).len() >= 2
    });
    assert!(first.try_wait().unwrap().is_none(), "still running");
    first.kill().unwrap();
    first.wait().unwrap();

    // The newest checkpoint's upload cut short: half of it, put by another client.
    let names = checkpoints(&at);
    let newest = names.last().unwrap().clone();
    let previous = epoch_of(&names[names.len() - 2]);
    let whole = at.get(&newest).unwrap().unwrap();
    at.put(&newest, whole[..whole.len() / 2].to_vec()).unwrap();

    let again = run(&["run", "-q", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("skipping checkpoint {url}/{newest}")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "resuming from checkpoint epoch {previous} in {url}"
        )),
        "the previous checkpoint is the one resumed from: {stderr}"
    );
    assert!(stderr.contains("removed 1 unusable checkpoint"), "{stderr}");
    assert_exactly_once(&out, n, "after the torn checkpoint");
}

#[test]
fn a_second_cluster_on_the_same_prefix_is_refused_naming_the_holder() {
    let bucket = bucket();
    let tmp = tempfile::tempdir().unwrap();
    let n = 240;
    let topic = id_topic(tmp.path(), "s3-lease", n);
    let url = fresh_url(&bucket, "lease");
    let at = location(&url, None);
    let p = pipeline(
        tmp.path(),
        &topic,
        40,
        &format!("url: \"{url}\", timeout_s: 5"),
    );
    let first = spawn(&["run", "-q", p.to_str().unwrap()]);
    let holder = first.id();
    wait_for("the first run's lease", Duration::from_secs(60), || {
        at.exists("riffle.lease").unwrap()
    });

    // Another output file (no local lock in the way), the same prefix by the flag.
    let other = tmp.path().join("other.jsonl");
    let started = Instant::now();
    let second = run(&[
        "run",
        "-q",
        p.to_str().unwrap(),
        "--output",
        other.to_str().unwrap(),
        "--checkpoint-url",
        &url,
    ]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("checkpoints at {url} are in use by another run"))
            && stderr.contains(&format!("pid {holder} on host")),
        "the error names the prefix and the holder: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused at once, not after a timeout"
    );
    assert_eq!(id_counts(&other).len(), 0, "the second run wrote nothing");

    let (status, stderr) = finish(first, Duration::from_secs(120));
    assert!(status.success(), "the first run is undisturbed: {stderr}");
    assert_exactly_once(&tmp.path().join("out.jsonl"), n, "the first run");
    assert!(!at.exists("riffle.lease").unwrap(), "released at its end");
}

#[test]
fn a_lease_not_renewed_for_its_timeout_is_taken_over() {
    let bucket = bucket();
    let tmp = tempfile::tempdir().unwrap();
    let n = 40;
    let topic = id_topic(tmp.path(), "s3-stale", n);
    let url = fresh_url(&bucket, "stale");
    let at = location(&url, None);
    // A holder on another host (one this test cannot see die), renewed just now, 4 s timeout.
    let renewed_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let lease = serde_json::json!({
        "host": "another-host", "pid": 4242, "generation": 1,
        "renewed_ms": renewed_ms, "timeout_ms": 4000
    });
    at.put("riffle.lease", lease.to_string().into_bytes())
        .unwrap();
    let p = pipeline(
        tmp.path(),
        &topic,
        400,
        &format!("url: \"{url}\", timeout_s: 5"),
    );
    let refused = run(&["run", "-q", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("pid 4242 on host another-host (run 1)"),
        "{stderr}"
    );
    assert!(!tmp.path().join("out.jsonl").exists(), "nothing written");

    // Once the holder has been silent for its timeout, the next run takes over.
    let stale_at = Duration::from_millis(renewed_ms + 4000);
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        < stale_at
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let taken = run(&["run", "-q", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&taken.stderr);
    assert!(taken.status.success(), "{stderr}");
    assert!(
        stderr.contains("took over the lease")
            && stderr.contains("pid 4242 on host another-host (run 1): not renewed for"),
        "{stderr}"
    );
    assert_exactly_once(&tmp.path().join("out.jsonl"), n, "after the takeover");
    assert!(!at.exists("riffle.lease").unwrap());
}

#[test]
fn a_supervised_cluster_whose_lease_holder_is_killed_restarts_and_resumes_exactly_once() {
    let bucket = bucket();
    let tmp = tempfile::tempdir().unwrap();
    let n = 240;
    let topic = id_topic(tmp.path(), "s3-cluster", n);
    let url = fresh_url(&bucket, "cluster");
    let at = location(&url, None);
    // The file checkpoints to a directory; the flag moves them to the store (and is passed
    // on to the supervisor's processes).
    let p = pipeline(tmp.path(), &topic, 60, "dir: unused, keep: 4");
    let port = free_port_pair().to_string();
    let path = p.to_str().unwrap();
    let supervisor = spawn(&[
        "run",
        "-q",
        path,
        "--processes",
        "2",
        "--base-port",
        &port,
        "--checkpoint-url",
        &url,
    ]);
    wait_for("a checkpoint object", Duration::from_secs(60), || {
        !checkpoints(&at).is_empty()
    });
    let mut pids = worker_pids(&p);
    assert_eq!(pids.len(), 2, "both processes run: {pids:?}");
    pids.sort();
    // Lower pid = started first = process 0, which holds the lease.
    let holder: serde_json::Value =
        serde_json::from_slice(&at.get("riffle.lease").unwrap().unwrap()).unwrap();
    assert_eq!(holder["pid"].as_u64(), Some(pids[0] as u64), "{holder}");
    assert!(Command::new("kill")
        .args(["-9", &pids[0].to_string()])
        .status()
        .unwrap()
        .success());
    let (status, stderr) = finish(supervisor, Duration::from_secs(180));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("restarting the cluster"), "{stderr}");
    assert!(stderr.contains("took over the lease"), "{stderr}");
    assert_exactly_once(&tmp.path().join("out.jsonl"), n, "after the restart");
    assert!(!tmp.path().join("unused").exists(), "no local checkpoints");
    assert!(!at.exists("riffle.lease").unwrap());
}

#[test]
fn checkpoint_settings_are_checked_with_their_field() {
    let tmp = tempfile::tempdir().unwrap();
    let topic = &id_topic(tmp.path(), "s3-validate", 4);
    let cases = [
        (
            "dir: ckpt, url: \"s3://b/p\"",
            "runtime.checkpoint.url",
            "exactly one of `dir` (a directory) and `url`",
        ),
        (
            "url: \"gs://b/p\"",
            "runtime.checkpoint.url",
            "expected s3://bucket/prefix",
        ),
        (
            "dir: ckpt, endpoint: \"http://127.0.0.1:9\"",
            "runtime.checkpoint.endpoint",
            "goes with `url`, not `dir`",
        ),
        (
            "keep: 3",
            "runtime.checkpoint:",
            "expected exactly one of `dir`",
        ),
        ("url: \"s3://b/p\", lease_s: 1", "lease_s", "3"),
    ];
    for (keys, field, message) in cases {
        let p = pipeline(tmp.path(), topic, 40, keys);
        let out = riffle(&["validate", p.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{keys}: {stderr}");
        assert!(
            stderr.contains(field) && stderr.contains(message),
            "{keys}: expected {field} and {message:?} in {stderr}"
        );
    }
    let p = pipeline(tmp.path(), topic, 40, "dir: ckpt");
    let out = riffle(&["validate", p.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = riffle(&[
        "run",
        "-q",
        p.to_str().unwrap(),
        "--checkpoint-url",
        "s3:///p",
    ]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        stderr.contains("--checkpoint-url") && stderr.contains("expected s3://bucket/prefix"),
        "{stderr}"
    );
}
