//! The `csv` sink end to end, through the same entry point as `riffle run`: the bundled Open
//! Bandit events, their list columns dropped by a `select`, give the same rows as a CSV file
//! (with its header) as the `jsonl` sink gives, and results that keep a list column are
//! refused at validation, naming it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use riffle_pipelines::run::{exit, run, RunOptions};

/// A pipeline over the bundled events (lists declared, as pipelines/clicks-obd.yaml does)
/// with `stages` and `sink`, written in `dir`.
fn pipeline(dir: &Path, name: &str, stages: &str, sink: &str) -> PathBuf {
    let events = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/clickstream/obd-events.jsonl");
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &file,
        format!(
            r#"
source:
  jsonl:
    path: {}
    schema: {{ event_id: int64, user_feat: "float32[4]", affinity: "float32[80]", position: int64 }}
stages: {stages}
sink: {sink}
runtime: {{ workers: 2 }}
"#,
            events.display()
        ),
    )
    .unwrap();
    file
}

/// Runs `file`, which must succeed; the number of results it reports.
fn results(file: &Path) -> u64 {
    let outcome = run(RunOptions::new(file).stop_on_signals(false)).unwrap();
    assert_eq!(outcome.exit_code(), exit::OK);
    outcome.report.as_ref().unwrap().summary.results
}

#[test]
fn a_csv_file_holds_the_rows_the_jsonl_sink_writes_under_one_header() {
    let tmp = tempfile::tempdir().unwrap();
    let select = "[ { select: { columns: [event_id, position] } } ]";
    let csv = pipeline(
        tmp.path(),
        "csv",
        select,
        "{ csv: { path: out/clicks.csv } }",
    );
    let jsonl = pipeline(
        tmp.path(),
        "jsonl",
        select,
        "{ jsonl: { path: out/clicks.jsonl } }",
    );
    let (from_csv, from_jsonl) = (results(&csv), results(&jsonl));
    assert_eq!(from_csv, 300);
    assert_eq!(from_csv, from_jsonl);

    let text = std::fs::read_to_string(tmp.path().join("out/clicks.csv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("event_id,position"));
    let rows: Vec<(i64, i64)> = lines
        .map(|l| {
            let (id, position) = l.split_once(',').unwrap();
            (id.parse().unwrap(), position.parse().unwrap())
        })
        .collect();
    assert_eq!(rows.len() as u64, from_csv);
    let written = std::fs::read_to_string(tmp.path().join("out/clicks.jsonl")).unwrap();
    let from_jsonl: BTreeSet<(i64, i64)> = written
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["event_id"].as_i64().unwrap(),
                v["position"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows.iter().copied().collect::<BTreeSet<_>>(), from_jsonl);
}

#[test]
fn results_with_a_list_column_are_refused_at_validation_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = pipeline(
        tmp.path(),
        "lists",
        "[]",
        "{ csv: { path: out/clicks.csv } }",
    );
    let e = run(RunOptions::new(&file).stop_on_signals(false))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`user_feat` (FixedSizeList(") && e.contains("`affinity`"),
        "{e}"
    );
    assert!(
        e.contains("`select: { columns: [event_id, position] }`"),
        "{e}"
    );
}
