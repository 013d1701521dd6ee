//! The `postgres` sink against a real PostgreSQL server (`scripts/postgres.sh start`), read back
//! with `psql`: every row lands once, a kill -9 and a restart neither lose nor repeat rows, an
//! upsert keeps the latest row per key, and a table that does not fit or a wrong password fail
//! the run at its start with a clear error. The kill test also needs the test Kafka broker
//! (`scripts/kafka.sh start`): a topic is the source a checkpointed run resumes. `tls`: the
//! same over TLS.

mod common;
#[path = "postgres_sink/tls.rs"]
mod tls;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::postgres::{query, scalar, table, url, with_password};
use common::*;

/// A pipeline file: `source` and `sink` are YAML blocks (indented two spaces), the URL comes
/// from the environment as `${RIFFLE_PG_URL}` (the file never holds it).
fn pipeline(dir: &Path, name: &str, source: &str, sink: &str, runtime: &str) -> std::path::PathBuf {
    write(
        dir,
        &format!("{name}.yaml"),
        &format!("name: {name}\nsource:\n{source}\nsink:\n{sink}\nruntime: {runtime}\n"),
    )
}

fn postgres_sink(table: &str, extra: &str) -> String {
    format!("  postgres:\n    url: \"${{RIFFLE_PG_URL}}\"\n    table: {table}\n{extra}")
}

fn run_failing(pipeline: &Path) -> String {
    let out = riffle(&["run", "-q", pipeline.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the run fails: {stderr}");
    stderr
}

#[test]
fn a_full_run_lands_every_row_once_with_its_types() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let t = table("clicks");
    let csv = repo().join("data/clickstream/obd-random-all-2000.csv");
    let p = pipeline(
        tmp.path(),
        "pg-full",
        &format!("  csv: {{ path: \"{}\", batch_size: 128 }}", csv.display()),
        &postgres_sink(&t, "    batch_rows: 300\n"),
        "{ workers: 2, epoch_records: 256 }",
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);

    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let item_sum: i64 = rows.iter().map(|r| r[1].parse::<i64>().unwrap()).sum();
    let clicks: i64 = rows.iter().map(|r| r[3].parse::<i64>().unwrap()).sum();
    let back = query(
        &url,
        &format!(
            "SELECT count(*), sum(item_id), sum(click), count(DISTINCT (timestamp, item_id, \
             position, user_feature_3)) FROM {t}"
        ),
    );
    assert_eq!(
        back[0],
        [
            rows.len().to_string(),
            item_sum.to_string(),
            clicks.to_string(),
            rows.len().to_string()
        ],
        "every row once (count, sums, distinct rows)"
    );
    let types = query(
        &url,
        &format!(
            "SELECT column_name, data_type FROM information_schema.columns \
             WHERE table_name = '{t}' ORDER BY ordinal_position"
        ),
    );
    let types: Vec<(String, String)> = types
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    let expected = [
        ("timestamp", "timestamp with time zone"),
        ("item_id", "bigint"),
        ("position", "bigint"),
        ("click", "bigint"),
        ("propensity_score", "double precision"),
        ("user_feature_0", "text"),
    ];
    for (column, sql) in expected {
        assert!(
            types.contains(&(column.to_string(), sql.to_string())),
            "{column} is {sql}: {types:?}"
        );
    }
    // The first record, value by value.
    let first = query(
        &url,
        &format!(
            "SELECT item_id, position, click, propensity_score, user_feature_0 FROM {t} \
             WHERE timestamp = '2019-11-24 00:00:34.762830+00' AND user_feature_3 = \
             'f97571b9c14a786aab269f0b427d2a85'"
        ),
    );
    assert_eq!(
        first,
        [["14", "3", "0", "0.0125", "81ce123cbb5bd8ce818f60fb3586bba5"]],
        "the first CSV record round-trips"
    );
}

#[test]
fn fixed_size_lists_land_as_jsonb_arrays() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let t = table("obd");
    let events = repo().join("data/clickstream/obd-events.jsonl");
    let source = format!(
        "  jsonl:\n    path: \"{}\"\n    schema:\n      event_id: int64\n      user_feat: \
         float32[4]\n      position: int64",
        events.display()
    );
    let p = pipeline(
        tmp.path(),
        "pg-lists",
        &source,
        &postgres_sink(&t, "    key: event_id\n"),
        "{ workers: 1 }",
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let back = query(
        &url,
        &format!(
            "SELECT count(*), min(jsonb_array_length(user_feat)), max(jsonb_array_length(user_feat)), \
             pg_typeof(min(user_feat::text)::jsonb) FROM {t}"
        ),
    );
    assert_eq!(
        back[0],
        ["300", "4", "4", "jsonb"],
        "300 rows of [4] arrays"
    );
    let first: f64 = scalar(
        &url,
        &format!("SELECT user_feat->>0 FROM {t} WHERE event_id = 0"),
    )
    .parse()
    .unwrap();
    assert!(
        (first - 0.507_050_6).abs() < 1e-6,
        "user_feat[0] of event 0: {first}"
    );
    let key = scalar(
        &url,
        &format!(
            "SELECT string_agg(a.attname, ',') FROM pg_index i JOIN pg_attribute a \
             ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = '{t}'::regclass AND i.indisprimary"
        ),
    );
    assert_eq!(
        key, "event_id",
        "the key is the created table's primary key"
    );
}

#[test]
fn dead_letters_go_to_a_table_beside_the_results() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let t = table("scored");
    let lines = [
        r#"{"id": 1, "v": [0.5, 1.5]}"#,
        r#"{"id": 2, "v": [0.5]}"#,
        r#"{"id": 3, "v": [2.5, 3.5]}"#,
    ];
    let input = write(tmp.path(), "in.jsonl", &(lines.join("\n") + "\n"));
    let source = format!(
        "  jsonl:\n    path: \"{}\"\n    schema:\n      id: int64\n      v: float32[2]",
        input.display()
    );
    let p = pipeline(
        tmp.path(),
        "pg-dead",
        &source,
        &postgres_sink(&t, ""),
        "{ workers: 1 }",
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let rows = query(&url, &format!("SELECT id, v::text FROM {t} ORDER BY id"));
    assert_eq!(rows, [["1", "[0.5, 1.5]"], ["3", "[2.5, 3.5]"]]);
    let dead = query(
        &url,
        &format!("SELECT stage, reason, record FROM {t}_dead_letters"),
    );
    assert_eq!(dead.len(), 1, "the short list is a dead letter: {dead:?}");
    assert!(
        dead[0][2].contains("\"line\":2"),
        "the record says where it came from: {dead:?}"
    );
    assert!(
        dead[0][1].contains("expected 2"),
        "with its reason: {dead:?}"
    );
}

/// Rows `id,version,label`: each id of `ids` with every version in order, one id after the
/// other (so an id's versions follow each other closely, in one statement or across two).
fn versions_csv(
    dir: &Path,
    name: &str,
    ids: std::ops::Range<i64>,
    versions: std::ops::RangeInclusive<i64>,
) -> std::path::PathBuf {
    let mut text = String::from("id,version,label\n");
    for id in ids {
        for v in versions.clone() {
            text.push_str(&format!("{id},{v},v{v}-of-{id}\n"));
        }
    }
    write(dir, name, &text)
}

#[test]
fn upsert_keeps_the_latest_row_of_each_key_across_runs() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let t = table("latest");
    let sink = postgres_sink(&t, "    key: [id]\n    mode: upsert\n    batch_rows: 7\n");
    // Each key five times in one run, in statements of 7 rows: repeats fall in one statement
    // and across statements.
    let first = versions_csv(tmp.path(), "first.csv", 0..20, 1..=5);
    let p = pipeline(
        tmp.path(),
        "pg-upsert",
        &format!("  csv: {{ path: \"{}\", batch_size: 16 }}", first.display()),
        &sink,
        "{ workers: 1 }",
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let rows = query(
        &url,
        &format!("SELECT id, version, label FROM {t} ORDER BY id"),
    );
    let expected: Vec<Vec<String>> = (0..20)
        .map(|id| vec![id.to_string(), "5".into(), format!("v5-of-{id}")])
        .collect();
    assert_eq!(rows, expected, "one row per key, its last version");

    // A second run updates the keys it has and adds the others.
    let second = versions_csv(tmp.path(), "second.csv", 10..30, 6..=6);
    let p = pipeline(
        tmp.path(),
        "pg-upsert",
        &format!(
            "  csv: {{ path: \"{}\", batch_size: 16 }}",
            second.display()
        ),
        &sink,
        "{ workers: 1 }",
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let rows = query(&url, &format!("SELECT id, version FROM {t} ORDER BY id"));
    let expected: Vec<Vec<String>> = (0..30)
        .map(|id| vec![id.to_string(), if id < 10 { "5" } else { "6" }.to_string()])
        .collect();
    assert_eq!(rows, expected, "updated where present, inserted where not");
}

#[test]
fn a_table_that_does_not_fit_fails_the_run_at_its_start_naming_table_column_and_types() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let csv = write(tmp.path(), "ids.csv", "id,value\n1,0.5\n2,1.5\n");
    let source = format!("  csv: {{ path: \"{}\" }}", csv.display());

    // `value` arrives as Float64; the table has text.
    let t = table("wrong_type");
    query(&url, &format!("CREATE TABLE {t} (id bigint, value text)"));
    let p = pipeline(
        tmp.path(),
        "pg-misfit",
        &source,
        &postgres_sink(&t, ""),
        "{ workers: 1 }",
    );
    let stderr = run_failing(&p);
    for part in [t.as_str(), "`value`", "Float64", "text"] {
        assert!(stderr.contains(part), "the error names {part}: {stderr}");
    }
    assert_eq!(
        scalar(&url, &format!("SELECT count(*) FROM {t}")),
        "0",
        "nothing written"
    );

    // A column the table lacks.
    let t = table("missing_column");
    query(&url, &format!("CREATE TABLE {t} (id bigint)"));
    let p = pipeline(
        tmp.path(),
        "pg-misfit",
        &source,
        &postgres_sink(&t, ""),
        "{ workers: 1 }",
    );
    let stderr = run_failing(&p);
    assert!(
        stderr.contains(&format!("table `{t}` has no column `value`"))
            && stderr.contains("Float64"),
        "the error names the missing column and its type: {stderr}"
    );

    // No table, and none to be created.
    let t = table("absent");
    let p = pipeline(
        tmp.path(),
        "pg-misfit",
        &source,
        &postgres_sink(&t, "    create_table: false\n"),
        "{ workers: 1 }",
    );
    let stderr = run_failing(&p);
    assert!(
        stderr.contains(&format!("table `{t}` does not exist")),
        "the error names the missing table: {stderr}"
    );
}

#[test]
fn a_wrong_password_fails_fast_naming_authentication_and_never_shows_the_password() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let csv = write(tmp.path(), "ids.csv", "id\n1\n");
    let secret = "not-the-password-8c1f";
    let p = write(
        tmp.path(),
        "pg-auth.yaml",
        &format!(
            "name: pg-auth\nsource:\n  csv: {{ path: \"{}\" }}\nsink:\n  postgres:\n    url: \
             \"{}\"\n    table: {}\n",
            csv.display(),
            with_password(&url, secret),
            table("auth")
        ),
    );
    let started = Instant::now();
    let stderr = run_failing(&p);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "fails within seconds, not {:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains("authentication"),
        "the error names authentication: {stderr}"
    );
    assert!(
        !stderr.contains(secret),
        "the password is not shown: {stderr}"
    );
}

/// A topic of `n` JSON records `{id, value}` over 2 partitions.
fn id_topic(tmp: &Path, name: &str, n: usize) -> String {
    let mut csv = String::from("id,value\n");
    for i in 0..n {
        csv.push_str(&format!("{i},{}.5\n", i % 7));
    }
    let csv = write(tmp, &format!("{name}.csv"), &csv);
    let topic = kafka::topic(name);
    riffle_ok(&[
        "produce",
        "--brokers",
        &kafka::brokers(),
        "--topic",
        &topic,
        "--partitions",
        "2",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    topic
}

/// (rows, distinct ids) in `t`.
fn counts(url: &str, t: &str) -> (usize, usize) {
    let row = &query(
        url,
        &format!("SELECT count(*), count(DISTINCT id) FROM {t}"),
    )[0];
    (row[0].parse().unwrap(), row[1].parse().unwrap())
}

#[test]
fn a_kill_9_mid_run_and_a_restart_write_every_row_exactly_once() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let n = 480;
    let topic = id_topic(tmp.path(), "pg-kill", n);
    let t = table("kill");
    let name = format!("pg-kill-{t}");
    // Paced: about 12 s for the whole topic, a checkpoint (and its transaction) per epoch.
    let source = format!(
        "  kafka: {{ brokers: \"{}\", topic: {topic}, format: json, stop_at_end: true, \
         batch_size: 8, max_records_per_second: 40 }}",
        kafka::brokers()
    );
    let p = pipeline(
        tmp.path(),
        &name,
        &source,
        &postgres_sink(&t, ""),
        "{ workers: 1, epoch_records: 8, checkpoint: { dir: ckpt, interval_ms: 0 } }",
    );
    let mut run = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The kill lands after a commit recorded a position, before the input's end.
    let committed = |min_rows: usize| {
        let exist = scalar(
            &url,
            &format!(
                "SELECT to_regclass('riffle_sink_positions') IS NOT NULL \
                 AND to_regclass('{t}') IS NOT NULL"
            ),
        );
        exist == "t"
            && !query(
                &url,
                &format!(
                    "SELECT epoch FROM riffle_sink_positions WHERE sink_id = '{name}/{t}' \
                     AND epoch IS NOT NULL"
                ),
            )
            .is_empty()
            && counts(&url, &t).0 >= min_rows
    };
    // The moment is drawn from a seed printed here, so a failing run can be replayed.
    let mut rng = Rng::seeded("RIFFLE_PG_KILL_SEED");
    let min_rows = n / 8 + rng.below(n / 3);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !committed(min_rows) {
        assert!(
            Instant::now() < deadline,
            "a committed position within 60 s"
        );
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended before the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    let (rows, ids) = counts(&url, &t);
    eprintln!("killed with {rows} of {n} rows committed");
    assert!(
        rows < n,
        "the kill landed before the end ({rows} of {n} rows)"
    );
    assert_eq!(rows, ids, "no row twice at the kill");

    // The same command resumes from the committed checkpoint.
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let (rows, ids) = counts(&url, &t);
    assert_eq!(ids, n, "every input row landed");
    assert_eq!(rows, n, "and none twice");
    let span = &query(&url, &format!("SELECT min(id), max(id) FROM {t}"))[0];
    assert_eq!(span, &["0".to_string(), (n - 1).to_string()]);
}

/// Kafka (2 partitions) → postgres with a checkpoint per epoch, paced to about 12 s over two
/// processes of one worker.
fn cluster_pipeline(dir: &Path, topic: &str, t: &str) -> std::path::PathBuf {
    let source = format!(
        "  kafka: {{ brokers: \"{}\", topic: {topic}, format: json, stop_at_end: true, \
         batch_size: 8, max_records_per_second: 20 }}",
        kafka::brokers()
    );
    pipeline(
        dir,
        &format!("pg-cluster-{t}"),
        &source,
        &postgres_sink(t, ""),
        "{ workers: 1, epoch_records: 8, checkpoint: { dir: ckpt, interval_ms: 0 } }",
    )
}

#[test]
fn a_supervised_cluster_losing_either_process_restarts_and_writes_every_row_exactly_once() {
    let url = url();
    let tmp = tempfile::tempdir().unwrap();
    let n = 480;
    let topic = id_topic(tmp.path(), "pg-cluster", n);
    let mut rng = Rng::seeded("RIFFLE_PG_KILL_SEED");
    // Process 0 opens the sink and commits; process 1 only reads the position on restart.
    for victim in [0, 1] {
        let after_ms = 2500 + rng.below(4000) as u64;
        let dir = tmp.path().join(format!("victim{victim}"));
        std::fs::create_dir_all(&dir).unwrap();
        let t = table(&format!("cluster{victim}"));
        let p = cluster_pipeline(&dir, &topic, &t);
        run_killing_one(&p, &[], victim, after_ms);
        let (rows, ids) = counts(&url, &t);
        let what = format!("process {victim} killed at {after_ms} ms");
        assert_eq!(ids, n, "{what}: every input row landed");
        assert_eq!(rows, n, "{what}: and none twice");
    }
}
