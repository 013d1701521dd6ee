//! The `redis` sink against a real server (`scripts/redis.sh start`), read back with
//! `redis-cli`: every key ends with the row the results file says is its latest, a kill -9
//! mid-run leaves the same final values as an uninterrupted run, a wrong password fails fast
//! saying so, and `ttl_s` sets a time to live. Each test has its own database and key prefix.
//! The kill test also needs the test broker (`scripts/kafka.sh start`): its source resumes
//! from checkpoints.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::kafka::{brokers, topic};
use common::redis::{cli, dump, prefix, url};
use common::*;
use serde_json::Value;

/// `n` clicks `user_id,item,score` of `users` users, in item order.
fn clicks_csv(dir: &Path, n: usize, users: usize) -> PathBuf {
    let mut csv = String::from("user_id,item,score\n");
    for i in 0..n {
        csv.push_str(&format!("{},{i},{}.25\n", (i * 7) % users, i % 9));
    }
    write(dir, "clicks.csv", &csv)
}

/// The CSV through `select` into `sink` (a YAML flow mapping), one worker, many epochs.
fn csv_pipeline(dir: &Path, name: &str, csv: &Path, sink: &str) -> PathBuf {
    write(
        dir,
        &format!("{name}.yaml"),
        &format!(
            r#"
name: {name}
source: {{ csv: {{ path: "{csv}", batch_size: 16 }} }}
stages:
  - select: {{ columns: [user_id, item, score] }}
sink: {sink}
dead_letter: {{ jsonl: {{ path: {name}.dead-letters.jsonl }} }}
runtime: {{ workers: 1, epoch_records: 40 }}
"#,
            csv = csv.display()
        ),
    )
}

/// The last line of each `column` value in a JSON-lines file, as written.
fn latest_lines(path: &Path, column: &str) -> BTreeMap<i64, String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            (row[column].as_i64().unwrap(), line.to_string())
        })
        .collect()
}

/// Keys of `map` without `prefix`.
fn strip(map: &BTreeMap<String, String>, prefix: &str) -> BTreeMap<String, String> {
    map.iter()
        .map(|(k, v)| (k.strip_prefix(prefix).unwrap().to_string(), v.clone()))
        .collect()
}

#[test]
fn every_key_holds_the_row_the_results_file_says_is_its_latest() {
    let url = url(1);
    let tmp = tempfile::tempdir().unwrap();
    let csv = clicks_csv(tmp.path(), 500, 23);
    let out = tmp.path().join("out.jsonl");
    let file = csv_pipeline(
        tmp.path(),
        "file",
        &csv,
        &format!(r#"{{ jsonl: {{ path: "{}" }} }}"#, out.display()),
    );
    riffle_ok(&["run", "-q", file.to_str().unwrap()]);
    let latest = latest_lines(&out, "user_id");
    assert_eq!(latest.len(), 23);

    let p = prefix("latest");
    let rows = csv_pipeline(
        tmp.path(),
        "rows",
        &csv,
        &format!(r#"{{ redis: {{ url: "{url}", key: "{p}:{{user_id}}", value: json }} }}"#),
    );
    riffle_ok(&["run", "-q", rows.to_str().unwrap()]);
    let expected: BTreeMap<String, String> = latest
        .iter()
        .map(|(user, line)| (format!("{p}:{user}"), line.clone()))
        .collect();
    // Byte for byte the line the file ends each user with.
    assert_eq!(dump(&url, &format!("{p}:*")), expected);

    let items = csv_pipeline(
        tmp.path(),
        "items",
        &csv,
        &format!(r#"{{ redis: {{ url: "{url}", key: "{p}:item:{{user_id}}", value: item }} }}"#),
    );
    riffle_ok(&["run", "-q", items.to_str().unwrap()]);
    let expected: BTreeMap<String, String> = latest
        .iter()
        .map(|(user, line)| {
            let row: Value = serde_json::from_str(line).unwrap();
            (format!("{p}:item:{user}"), row["item"].to_string())
        })
        .collect();
    assert_eq!(dump(&url, &format!("{p}:item:*")), expected);
    assert_eq!(
        cli(&url, &["GET", &format!("{p}:item:0")]).trim(),
        expected[&format!("{p}:item:0")]
    );
}

/// The shipped pipeline file on the first `n` ratings, with its key prefix and paths made the
/// test's, and `sink` (YAML lines) in place of its own when given.
fn shipped_recs(dir: &Path, n: usize, key_prefix: &str, sink: Option<&str>) -> PathBuf {
    let ratings = repo().join("data/ml-100k/ratings.csv");
    assert!(
        ratings.is_file(),
        "{} not found: run `scripts/setup.sh`",
        ratings.display()
    );
    let text = std::fs::read_to_string(&ratings).unwrap();
    let lines: Vec<&str> = text.lines().take(n + 1).collect();
    let csv = write(dir, "ratings.csv", &(lines.join("\n") + "\n"));
    let yaml = std::fs::read_to_string(repo().join("pipelines/clickstream-recs-redis.yaml"))
        .unwrap()
        .replace("../data/ml-100k/ratings.csv", csv.to_str().unwrap())
        .replace("../models", &repo().join("models").display().to_string())
        .replace("../out/", "")
        .replace(
            "\"recs:{user_id}\"",
            &format!("\"{key_prefix}:{{user_id}}\""),
        );
    let yaml = match sink {
        Some(sink) => {
            let (head, rest) = yaml.split_once("\nsink:\n").unwrap();
            let (_, tail) = rest.split_once("\ndead_letter:").unwrap();
            format!("{head}\nsink:\n{sink}\ndead_letter:{tail}")
        }
        None => yaml,
    };
    assert!(yaml.contains(key_prefix) || sink.is_some());
    write(
        dir,
        if sink.is_some() {
            "file.yaml"
        } else {
            "redis.yaml"
        },
        &yaml,
    )
}

#[test]
fn the_shipped_recs_pipeline_serves_each_users_latest_recommendations() {
    require_onnx_runtime();
    let url = url(5);
    let tmp = tempfile::tempdir().unwrap();
    let p = prefix("recs");
    let out = tmp.path().join("out.jsonl");
    let file = shipped_recs(
        tmp.path(),
        1500,
        &p,
        Some(&format!("  jsonl: {{ path: \"{}\" }}\n", out.display())),
    );
    riffle_ok(&["run", "-q", file.to_str().unwrap()]);
    let redis = shipped_recs(tmp.path(), 1500, &p, None);
    let run = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", redis.to_str().unwrap()])
        .env("RIFFLE_REDIS_URL", &url)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let latest = latest_lines(&out, "user_id");
    let got = dump(&url, &format!("{p}:*"));
    assert_eq!(got.len(), latest.len());
    // Each user's key: the results file's last row for them, which answers their last click.
    let csv = std::fs::read_to_string(tmp.path().join("ratings.csv")).unwrap();
    let mut last_click: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for line in csv.lines().skip(1) {
        let f: Vec<i64> = line.split(',').map(|x| x.parse().unwrap()).collect();
        last_click.insert(f[0], (f[1], f[3]));
    }
    for (user, line) in &latest {
        let value = &got[&format!("{p}:{user}")];
        assert_eq!(value, line, "user {user}");
        let row: Value = serde_json::from_str(value).unwrap();
        let click = (
            row["item_id"].as_i64().unwrap(),
            row["timestamp"].as_i64().unwrap(),
        );
        assert_eq!(click, last_click[user], "user {user}: {value}");
        assert!(row["recs"].as_array().unwrap().len() <= 10, "{value}");
    }
    let with_recs = got.values().filter(|v| !v.contains("\"recs\":[]")).count();
    assert!(
        with_recs * 2 > got.len(),
        "{with_recs} of {} users",
        got.len()
    );
}

/// A topic of the clicks in `csv`, keyed by user (each user's clicks in one partition, in
/// order), 2 partitions.
fn clicks_topic(brokers: &str, csv: &Path) -> String {
    let topic = topic("redis-clicks");
    riffle_ok(&[
        "produce",
        "--brokers",
        brokers,
        "--topic",
        &topic,
        "--partitions",
        "2",
        "--csv",
        csv.to_str().unwrap(),
        "--key",
        "user_id",
    ]);
    topic
}

/// Kafka → `select` → Redis with checkpoints, at `rate` clicks per second per worker.
fn kafka_pipeline(
    dir: &Path,
    brokers: &str,
    topic: &str,
    url: &str,
    p: &str,
    rate: u32,
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    write(
        dir,
        "p.yaml",
        &format!(
            r#"
name: redis-kill
source: {{ kafka: {{ brokers: "{brokers}", topic: {topic}, format: json, stop_at_end: true, batch_size: 8, max_records_per_second: {rate} }} }}
stages:
  - select: {{ columns: [user_id, item, score] }}
sink: {{ redis: {{ url: "{url}", key: "{p}:{{user_id}}", value: json }} }}
dead_letter: {{ jsonl: {{ path: dead.jsonl }} }}
runtime: {{ workers: 1, epoch_records: 8, checkpoint: {{ dir: ckpt, interval_ms: 500 }} }}
"#
        ),
    )
}

/// Reads every key of a prefix over and over while a run writes them, noting each time a key
/// goes back to an older click (a smaller `item`) or disappears.
struct Watcher {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl Watcher {
    fn start(url: &str, prefix: &str) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, pattern, flag) = (url.to_string(), format!("{prefix}:*"), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut seen: BTreeMap<String, i64> = BTreeMap::new();
            let mut regressions = Vec::new();
            let mut polls = 0;
            while !flag.load(Ordering::Relaxed) {
                let now = dump(&url, &pattern);
                for (key, before) in &seen {
                    match now.get(key) {
                        None => regressions.push(format!("{key} disappeared")),
                        Some(v) => {
                            let item = serde_json::from_str::<Value>(v).unwrap()["item"]
                                .as_i64()
                                .unwrap();
                            if item < *before {
                                regressions.push(format!("{key}: item {before} then {item}"));
                            }
                        }
                    }
                }
                for (key, v) in now {
                    let row: Value = serde_json::from_str(&v).unwrap();
                    seen.insert(key, row["item"].as_i64().unwrap());
                }
                polls += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            (polls, regressions)
        });
        Watcher { stop, thread }
    }

    /// Polls made, and what went backwards.
    fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn run_args(pipeline: &Path) -> Vec<String> {
    let port = free_port_pair().to_string();
    let path = pipeline.to_str().unwrap();
    ["run", "-q", path, "--processes", "2", "--base-port", &port]
        .map(String::from)
        .to_vec()
}

#[test]
fn a_kill_9_mid_run_leaves_the_values_of_an_uninterrupted_run() {
    let brokers = brokers();
    let url = url(2);
    let tmp = tempfile::tempdir().unwrap();
    let n = 1600;
    // Few users, so that each clicks several times between two commits: a replay that showed
    // uncommitted writes' older values would be seen going back.
    let users = 8;
    let csv = clicks_csv(tmp.path(), n, users);
    let topic = clicks_topic(&brokers, &csv);

    let whole = prefix("whole");
    let p = kafka_pipeline(
        &tmp.path().join("whole"),
        &brokers,
        &topic,
        &url,
        &whole,
        100_000,
    );
    let args = run_args(&p);
    riffle_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let uninterrupted = strip(&dump(&url, &format!("{whole}:*")), &whole);
    // Each user's last click, as the uninterrupted run leaves it.
    let mut expected = BTreeMap::new();
    for i in 0..n {
        let user = (i * 7) % users;
        expected.insert(format!(":{user}"), (i as i64, format!("{}.25", i % 9)));
    }
    let values: BTreeMap<String, (i64, String)> = uninterrupted
        .iter()
        .map(|(k, v)| {
            let row: Value = serde_json::from_str(v).unwrap();
            (
                k.clone(),
                (row["item"].as_i64().unwrap(), row["score"].to_string()),
            )
        })
        .collect();
    assert_eq!(values, expected);

    for victim in [0usize, 1] {
        let killed = prefix(&format!("killed{victim}"));
        let dir = tmp.path().join(format!("victim{victim}"));
        // 2 processes × 100 clicks/s: about 8 s of input.
        let p = kafka_pipeline(&dir, &brokers, &topic, &url, &killed, 100);
        let position_key = format!("riffle:sink:redis-kill:{killed}:{{user_id}}");
        let watcher = Watcher::start(&url, &killed);
        let mut supervisor = Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args(run_args(&p))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let committed = loop {
            let position = cli(&url, &["GET", &position_key]);
            if !position.trim().is_empty() {
                break position;
            }
            assert!(Instant::now() < deadline, "a commit within 60 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        // Between two commits (500 ms apart), so that the kill loses uncommitted results.
        std::thread::sleep(Duration::from_millis(300));
        // Mid-run: something committed, not everything yet.
        let midway = strip(&dump(&url, &format!("{killed}:*")), &killed);
        assert!(
            !midway.is_empty() && midway != uninterrupted,
            "victim {victim}"
        );
        assert!(supervisor.try_wait().unwrap().is_none(), "still running");
        let mut pids = worker_pids(&p);
        pids.sort();
        assert_eq!(pids.len(), 2, "both processes run: {pids:?}");
        // Lower pid = started first = process 0, which writes to Redis.
        let status = Command::new("kill")
            .args(["-9", &pids[victim].to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = supervisor.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut supervisor.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(status.success(), "victim {victim}: {stderr}");
        assert!(
            stderr.contains("restarting the cluster"),
            "victim {victim}: the kill landed mid-run (after commit `{}`): {stderr}",
            committed.trim()
        );
        let (polls, regressions) = watcher.stop();
        // Redis only ever holds a checkpoint's results: the restart's replay of epochs after
        // the last commit never shows an older value (at-least-once writes would).
        assert!(polls > 10, "victim {victim}: {polls} polls");
        assert_eq!(regressions, Vec::<String>::new(), "victim {victim}");
        let after = strip(&dump(&url, &format!("{killed}:*")), &killed);
        assert_eq!(after, uninterrupted, "victim {victim}");
        let position = cli(&url, &["GET", &position_key]);
        assert_ne!(position, committed, "the restarted run committed the rest");
    }
}

/// `riffle run` of a pipeline writing to `url`, and how long it took.
fn timed_run(dir: &Path, name: &str, url: &str, p: &str) -> (Output, Duration) {
    let csv = clicks_csv(dir, 50, 5);
    let file = csv_pipeline(
        dir,
        name,
        &csv,
        &format!(r#"{{ redis: {{ url: "{url}", key: "{p}:{{user_id}}" }} }}"#),
    );
    let started = Instant::now();
    let out = riffle(&["run", "-q", file.to_str().unwrap()]);
    (out, started.elapsed())
}

#[test]
fn a_wrong_password_fails_fast_saying_authentication_and_never_shows_it() {
    let good = url(3);
    let tmp = tempfile::tempdir().unwrap();
    let p = prefix("auth");
    let (scheme, rest) = good.split_once("://").unwrap();
    let (userinfo, host) = rest
        .rsplit_once('@')
        .expect("RIFFLE_REDIS_URL has a password");
    let real = userinfo.split_once(':').unwrap().1;
    let wrong = format!("{scheme}://:wrong-pass-7741@{host}");
    let none = format!("{scheme}://{host}");
    for (name, url) in [("wrong", &wrong), ("none", &none)] {
        let (out, took) = timed_run(tmp.path(), name, url, &p);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {stderr}");
        assert!(took < Duration::from_secs(10), "{name}: {took:?}");
        assert!(stderr.contains("authentication failed"), "{name}: {stderr}");
        assert!(
            !stderr.contains("wrong-pass-7741") && !stderr.contains(real),
            "{name}: a password in {stderr}"
        );
        assert!(
            stderr.contains(host),
            "{name}: the server is named: {stderr}"
        );
    }
    // The same pipeline with the right password runs.
    let (out, _) = timed_run(tmp.path(), "right", &good, &p);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(dump(&good, &format!("{p}:*")).len(), 5);
}

#[test]
fn ttl_s_gives_each_key_a_time_to_live() {
    let url = url(4);
    let tmp = tempfile::tempdir().unwrap();
    let csv = clicks_csv(tmp.path(), 60, 6);
    let p = prefix("ttl");
    for (name, extra) in [("ttl", ", ttl_s: 300"), ("forever", "")] {
        let file = csv_pipeline(
            tmp.path(),
            name,
            &csv,
            &format!(r#"{{ redis: {{ url: "{url}", key: "{p}:{name}:{{user_id}}"{extra} }} }}"#),
        );
        riffle_ok(&["run", "-q", file.to_str().unwrap()]);
    }
    for user in 0..6 {
        let ttl: i64 = cli(&url, &["TTL", &format!("{p}:ttl:{user}")])
            .trim()
            .parse()
            .unwrap();
        assert!((1..=300).contains(&ttl), "user {user}: TTL {ttl}");
        let forever = cli(&url, &["TTL", &format!("{p}:forever:{user}")]);
        assert_eq!(forever.trim(), "-1", "user {user}: no ttl_s, no expiry");
    }
}

#[test]
fn a_key_naming_a_missing_column_fails_validation_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = clicks_csv(tmp.path(), 5, 2);
    let file = csv_pipeline(
        tmp.path(),
        "bad",
        &csv,
        r#"{ redis: { url: "redis://127.0.0.1:1/0", key: "recs:{user}" } }"#,
    );
    let out = riffle(&["validate", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = line_of(&file, "sink:");
    assert!(
        stderr.contains(&format!(
            ":{line}: sink.redis: `key` `recs:{{user}}`: names column `user`"
        )) && stderr.contains("user_id, item, score"),
        "{stderr}"
    );
}
