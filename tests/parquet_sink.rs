//! The `parquet` sink end to end: click events from Kafka (the bundled Open Bandit sample) to
//! hive-partitioned Parquet with checkpoints, a `kill -9` mid-run and a restart; the files are
//! read back by DuckDB (an independent reader, from PyPI) and every event must be there exactly
//! once, with its nested columns, and no staged file visible. Needs the test broker
//! (`scripts/kafka.sh start`); the object-store variant needs S3Proxy (`scripts/s3.sh start`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::kafka::{brokers, topic};
use common::*;
use serde_json::Value;

const DUCKDB: &str = "duckdb==1.5.6";
/// Copies of the 300 bundled events, each with its own `event_id`s.
const COPIES: usize = 8;
const EVENTS: usize = 300 * COPIES;

/// Python with DuckDB on its path: installed from PyPI into the cache on first use. Fails
/// (never skips) when it cannot be installed, saying how.
fn duckdb_python() -> (PathBuf, PathBuf) {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let target = cache_dir().join("python-duckdb-1.5.6");
    let works = |dir: &Path| {
        Command::new("python3")
            .args(["-c", "import duckdb"])
            .env("PYTHONPATH", dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !works(&target) {
        let part = cache_dir().join(format!("python-duckdb.part-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&part);
        let installed = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--only-binary=:all:",
                "--target",
            ])
            .arg(&part)
            .arg(DUCKDB)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            installed,
            "cannot install {DUCKDB} from PyPI into {} (the independent Parquet reader): \
             install it by hand with `python3 -m pip install --target {} {DUCKDB}`",
            part.display(),
            target.display()
        );
        // Another test binary may have got there first: theirs is as good.
        if std::fs::rename(&part, &target).is_err() {
            let _ = std::fs::remove_dir_all(&part);
        }
    }
    assert!(
        works(&target),
        "DuckDB in {} does not import",
        target.display()
    );
    (PathBuf::from("python3"), target)
}

/// DuckDB's view of a published tree against the events file: JSON with `rows`, `distinct`,
/// `missing` and `extra` (multiset differences of `(event_id, position, user_feat[1], number
/// of affinities)`), `files` (what a reader of `**/*.parquet` opens) and `types`.
const CHECK: &str = r#"
import duckdb, json, os, sys
out, events = sys.argv[1], sys.argv[2]
c = duckdb.connect()
have = any(f.endswith('.parquet') for _, _, fs in os.walk(out) for f in fs)
if not have:
    print(json.dumps({"rows": 0, "distinct": 0, "missing": None, "extra": None, "files": [], "types": {}}))
    sys.exit(0)
c.sql(f"create view got as select * from read_parquet('{out}/**/*.parquet', hive_partitioning = true, filename = true)")
c.sql(f"create view want as select * from read_json('{events}', format = 'newline_delimited')")
cols = "event_id::BIGINT, position::BIGINT, round(user_feat[1]::DOUBLE, 5), len(affinity)"
one = lambda q: c.sql(q).fetchone()[0]
print(json.dumps({
    "rows": one("select count(*) from got"),
    "distinct": one("select count(distinct event_id) from got"),
    "missing": one(f"select count(*) from (select {cols} from want except all select {cols} from got)"),
    "extra": one(f"select count(*) from (select {cols} from got except all select {cols} from want)"),
    "files": [r[0] for r in c.sql("select distinct filename from got order by 1").fetchall()],
    "types": {r[0]: r[1] for r in c.sql("describe select user_feat, affinity, position from got").fetchall()},
}))
"#;

/// The numbers of a [`duckdb_check`], for messages.
fn counts(check: &Value) -> String {
    ["rows", "distinct", "missing", "extra"]
        .map(|k| format!("{k} {}", check[k]))
        .join(", ")
}

fn duckdb_check(out: &Path, events: &Path) -> Value {
    let (python, path) = duckdb_python();
    let done = Command::new(python)
        .args(["-c", CHECK])
        .arg(out)
        .arg(events)
        .env("PYTHONPATH", path)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "duckdb: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    serde_json::from_slice(&done.stdout).unwrap()
}

/// The bundled events, [`COPIES`] times with distinct ids, as a JSON-lines file and a topic of
/// 2 partitions.
fn events_topic(tmp: &Path, name: &str) -> (PathBuf, String) {
    let bundled =
        std::fs::read_to_string(repo().join("data/clickstream/obd-events.jsonl")).unwrap();
    let mut lines = String::new();
    for copy in 0..COPIES {
        for line in bundled.lines() {
            let mut event: Value = serde_json::from_str(line).unwrap();
            let id = event["event_id"].as_i64().unwrap() + (copy * 300) as i64;
            event["event_id"] = id.into();
            lines.push_str(&event.to_string());
            lines.push('\n');
        }
    }
    assert_eq!(lines.lines().count(), EVENTS);
    let events = write(tmp, "events.jsonl", &lines);
    let topic = topic(name);
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers(),
        "--topic",
        &topic,
        "--partitions",
        "2",
        "--jsonl",
        events.to_str().unwrap(),
    ]);
    (events, topic)
}

/// Events → Parquet partitioned by position, with checkpoints a second apart, paced at
/// 2 × `rate` events/s.
fn pipeline(dir: &Path, topic: &str, rate: u32, sink: &str) -> PathBuf {
    write(
        dir,
        "clicks-parquet.yaml",
        &format!(
            r#"
name: clicks-parquet
source:
  kafka:
    brokers: "{brokers}"
    topic: {topic}
    format: json
    stop_at_end: true
    batch_size: 25
    max_records_per_second: {rate}
    schema: {{ event_id: int64, user_feat: "float32[4]", affinity: "float32[80]", position: int64 }}
stages:
  - select: {{ columns: [event_id, user_feat, affinity, position] }}
sink:
  parquet: {sink}
runtime: {{ workers: 2, epoch_records: 25, checkpoint: {{ dir: ckpt, interval_ms: 1000 }} }}
"#,
            brokers = brokers()
        ),
    )
}

fn parquet_files(dir: &Path, staged: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().contains("/_staging/") == staged
                && (path.extension().is_some_and(|e| e == "parquet")
                    || path.to_string_lossy().ends_with(".parquet.staged"))
            {
                out.push(path);
            }
        }
    }
    out
}

fn has_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
    })
}

/// Runs `pipeline`, `kill -9`s it once a checkpoint exists and some files are published (and
/// before its input ends), then runs it again to the end. Returns DuckDB's view of `out` right
/// after the kill and the restart's log.
fn run_killed_then_restarted(
    pipeline: &Path,
    out: &Path,
    published: impl Fn() -> bool,
    events: &Path,
) -> (Value, String) {
    let dir = pipeline.parent().unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q"])
        .arg(pipeline)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !(has_checkpoint(&dir.join("ckpt")) && published()) {
        if let Some(status) = run.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
            panic!("the run ended ({status}) before the kill: {stderr}");
        }
        assert!(
            Instant::now() < deadline,
            "a checkpoint and published files"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Between checkpoints (a second apart), so files closed since the last one are staged.
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        run.try_wait().unwrap().is_none(),
        "still running at the kill"
    );
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    let staged = parquet_files(out, true).len();
    eprintln!("{staged} staged file(s) left by the kill");
    let at_kill = duckdb_check(out, events);
    for file in at_kill["files"].as_array().unwrap() {
        let file = file.as_str().unwrap();
        assert!(
            !file.contains("_staging"),
            "a reader sees no staged file: {file}"
        );
    }
    let restart = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q"])
        .arg(pipeline)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&restart.stderr).into_owned();
    assert!(restart.status.success(), "the restart: {log}");
    if staged > 0 {
        assert!(
            log.contains("staged file(s) no checkpoint covered"),
            "the restart fenced the killed run's staged files: {log}"
        );
    }
    (at_kill, log)
}

#[test]
fn kill_9_mid_run_then_restart_publishes_every_event_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (events, topic) = events_topic(tmp.path(), "pq-clicks");
    let out = tmp.path().join("clicks");
    let sink = "{ path: clicks, partition_by: [position], roll: { rows: 150, seconds: 0.3 } }";
    let p = pipeline(tmp.path(), &topic, 250, sink);
    let published = || !parquet_files(&out, false).is_empty();
    let (at_kill, log) = run_killed_then_restarted(&p, &out, published, &events);

    // What a reader saw at the kill: complete files of whole epochs, each event at most once.
    let seen = at_kill["rows"].as_u64().unwrap();
    eprintln!("{seen} of {EVENTS} events published at the kill");
    assert!(
        seen > 0 && seen < EVENTS as u64,
        "the kill landed mid-run: {seen} of {EVENTS} events published"
    );
    assert_eq!(
        at_kill["extra"],
        0,
        "nothing doubled or foreign: {}",
        counts(&at_kill)
    );
    assert_eq!(at_kill["distinct"].as_u64(), Some(seen));
    assert!(
        log.contains("resuming from checkpoint"),
        "the restart resumed from the checkpoint: {log}"
    );

    let got = duckdb_check(&out, &events);
    let counts = counts(&got);
    assert_eq!(got["rows"], EVENTS, "{counts}");
    assert_eq!(got["distinct"], EVENTS, "{counts}");
    assert_eq!(got["missing"], 0, "every event: {counts}");
    assert_eq!(got["extra"], 0, "once: {counts}");
    let files: Vec<&str> = got["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(!files.is_empty());
    for file in &files {
        let relative = file.strip_prefix(out.to_str().unwrap()).unwrap();
        assert!(
            relative.starts_with("/position=") && relative.contains("/part-"),
            "a published hive-partitioned file: {relative}"
        );
    }
    assert!(
        parquet_files(&out, true).is_empty(),
        "nothing left staged after the last commit"
    );
    let types = &got["types"];
    // Lists in Parquet (their lengths are checked above with the values).
    assert_eq!(types["user_feat"], "FLOAT[]", "{types}");
    assert_eq!(types["affinity"], "FLOAT[]", "{types}");
    assert_eq!(
        types["position"], "BIGINT",
        "from the folder names: {types}"
    );
}

#[test]
fn without_checkpoints_a_run_publishes_its_files_as_they_close() {
    let tmp = tempfile::tempdir().unwrap();
    let (events, topic) = events_topic(tmp.path(), "pq-plain");
    let out = tmp.path().join("clicks");
    let p = pipeline(
        tmp.path(),
        &topic,
        100_000,
        "{ path: clicks, roll: { rows: 1000, seconds: 60 }, compression: snappy }",
    );
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace(", checkpoint: { dir: ckpt, interval_ms: 1000 }", "");
    std::fs::write(&p, text).unwrap();
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let got = duckdb_check(&out, &events);
    let counts = counts(&got);
    assert_eq!(got["rows"], EVENTS, "{counts}");
    assert_eq!(got["missing"], 0, "{counts}");
    assert_eq!(got["extra"], 0, "{counts}");
    assert!(!tmp.path().join("ckpt").exists());
    assert!(
        !out.join("_staging").exists(),
        "nothing staged without checkpoints"
    );
    // 2400 rows rolled at the first epoch boundary past 1000: a few files, not one per epoch.
    let files = got["files"].as_array().unwrap().len();
    assert!((2..=4).contains(&files), "{files} files");
}

#[test]
fn a_partition_key_that_is_not_a_column_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let p = write(
        tmp.path(),
        "bad.yaml",
        r#"
source: { jsonl: { path: events.jsonl } }
sink: { parquet: { path: out, partition_by: [country] } }
"#,
    );
    write(
        tmp.path(),
        "events.jsonl",
        "{\"event_id\": 1, \"position\": 2}\n",
    );
    let done = riffle(&["validate", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success(), "{stderr}");
    assert!(
        stderr.contains("partition_by: no column `country`") && stderr.contains("event_id"),
        "{stderr}"
    );
    assert!(stderr.contains("bad.yaml:3"), "the sink's line: {stderr}");
}

/// The object-store variant, against S3Proxy: the same kill and restart, the files read back
/// from S3Proxy's own folder (a bucket is a folder there), which DuckDB reads.
#[test]
fn kill_9_mid_run_into_an_object_store_publishes_every_event_exactly_once() {
    // scripts/test.sh starts the server and exports its settings; unset, this fails (never
    // skips).
    let how = "run scripts/s3.sh start and eval \"$(scripts/s3.sh env)\"";
    let endpoint = std::env::var("AWS_ENDPOINT_URL")
        .unwrap_or_else(|_| panic!("AWS_ENDPOINT_URL is not set: {how}"));
    let bucket = std::env::var("RIFFLE_S3_BUCKET")
        .unwrap_or_else(|_| panic!("RIFFLE_S3_BUCKET is not set: {how}"));
    let port = endpoint.rsplit(':').next().unwrap().trim_end_matches('/');
    // Where scripts/s3.sh keeps the server's state: its own rule.
    let state = std::env::var_os("RIFFLE_S3_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("RIFFLE_SERVICES_DIR")
                .map_or_else(cache_dir, PathBuf::from)
                .join(format!("s3-{port}"))
        });
    let tmp = tempfile::tempdir().unwrap();
    let (events, topic) = events_topic(tmp.path(), "pq-s3");
    let prefix = format!(
        "parquet-{}-{}",
        std::process::id(),
        tmp.path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches('.')
            .to_lowercase()
    );
    let out = state.join("data").join(&bucket).join(&prefix);
    let sink = format!(
        "{{ url: \"s3://{bucket}/{prefix}\", endpoint: \"{endpoint}\", partition_by: [position], \
         roll: {{ rows: 150, seconds: 0.3 }} }}"
    );
    let p = pipeline(tmp.path(), &topic, 250, &sink);
    let published = || !parquet_files(&out, false).is_empty();
    let (at_kill, log) = run_killed_then_restarted(&p, &out, published, &events);
    let seen = at_kill["rows"].as_u64().unwrap();
    assert!(seen > 0 && seen < EVENTS as u64, "mid-run: {seen}");
    assert_eq!(at_kill["extra"], 0, "{}", counts(&at_kill));
    assert!(log.contains("resuming from checkpoint"), "{log}");
    let got = duckdb_check(&out, &events);
    let counts = counts(&got);
    assert_eq!(got["rows"], EVENTS, "{counts}");
    assert_eq!(got["missing"], 0, "{counts}");
    assert_eq!(got["extra"], 0, "{counts}");
    assert!(parquet_files(&out, true).is_empty(), "nothing left staged");
}
