//! A multi-input tabular model fed from JSON: the shipped Open Bandit pipelines
//! (pipelines/clicks-obd.yaml from a file, clicks-obd-kafka.yaml from a topic) give the click
//! probabilities that numpy computes from the model file's own weights
//! (scripts/train-obd-ctr.py reference), bad records become dead letters, and the `tensor`
//! stage builds the same inputs from undeclared (inferred) columns.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// ONNX Runtime's float32 against numpy's: the same operations, summed in another order.
const TOLERANCE: f64 = 1e-5;

fn events() -> PathBuf {
    repo().join("data/clickstream/obd-events.jsonl")
}

/// p_click by event id, as scripts/train-obd-ctr.py computes it with numpy (needs numpy and
/// onnx from scripts/setup.sh; fails saying so when they are missing).
fn reference(events: &Path) -> BTreeMap<i64, f64> {
    let python_path = cache_dir().join("python");
    let run = Command::new("python3")
        .arg(repo().join("scripts/train-obd-ctr.py"))
        .arg("reference")
        .arg(events)
        .env("PYTHONPATH", &python_path)
        .output()
        .expect("running python3 scripts/train-obd-ctr.py");
    assert!(
        run.status.success(),
        "scripts/train-obd-ctr.py reference failed (numpy and onnx are expected in {}: run \
         `scripts/setup.sh`):\n{}",
        python_path.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["event_id"].as_i64().unwrap(),
                v["p_click"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// p_click by event id in a results file.
fn scored(path: &Path) -> BTreeMap<i64, f64> {
    read_jsonl(path)
        .iter()
        .map(|r| {
            (
                r["event_id"].as_i64().unwrap(),
                r["p_click"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn assert_close(got: &BTreeMap<i64, f64>, expected: &BTreeMap<i64, f64>) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "scored events"
    );
    for (id, p) in got {
        let e = expected[id];
        assert!(
            (p - e).abs() <= TOLERANCE,
            "event {id}: p_click {p}, numpy {e}"
        );
    }
}

/// A shipped pipeline's text with its relative paths made absolute (it runs from a temp dir).
fn shipped(name: &str) -> String {
    std::fs::read_to_string(repo().join("pipelines").join(name))
        .unwrap()
        .replace("../models/", &format!("{}/models/", repo().display()))
        .replace("../data/", &format!("{}/data/", repo().display()))
}

#[test]
fn the_obd_pipeline_scores_like_numpy_from_the_model_weights() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = write(tmp.path(), "obd.yaml", &shipped("clicks-obd.yaml"));
    let out = tmp.path().join("scored.jsonl");
    run_quietly(&pipeline, &out);
    let expected = reference(&events());
    assert_eq!(expected.len(), 300);
    assert_close(&scored(&out), &expected);
    // Declared order: the model's inputs kept only `position`, as selected.
    let first = &read_jsonl(&out)[0];
    let keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 3, "{first}");
    assert!(first["position"]
        .as_i64()
        .is_some_and(|p| (1..=3).contains(&p)));
}

#[test]
fn records_that_do_not_fit_the_declared_schema_are_dead_letters() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let good: Vec<String> = std::fs::read_to_string(events())
        .unwrap()
        .lines()
        .take(20)
        .map(str::to_string)
        .collect();
    let mut short: serde_json::Value = serde_json::from_str(&good[0]).unwrap();
    short["event_id"] = 9001.into();
    short["affinity"].as_array_mut().unwrap().pop();
    let mut text: serde_json::Value = serde_json::from_str(&good[1]).unwrap();
    text["event_id"] = 9002.into();
    text["user_feat"][2] = "high".into();
    let mut lines = good.clone();
    lines.insert(5, short.to_string());
    lines.insert(10, text.to_string());
    let input = write(tmp.path(), "events.jsonl", &(lines.join("\n") + "\n"));
    let yaml = shipped("clicks-obd.yaml").replace(
        &format!("{}/data/clickstream/obd-events.jsonl", repo().display()),
        input.to_str().unwrap(),
    );
    let pipeline = write(tmp.path(), "obd.yaml", &yaml);
    let out = tmp.path().join("scored.jsonl");
    run_quietly(&pipeline, &out);

    let expected = reference(&write(tmp.path(), "good.jsonl", &good.join("\n")));
    assert_close(&scored(&out), &expected);
    let letters = read_jsonl(&tmp.path().join("scored.dead-letters.jsonl"));
    let mut reasons: Vec<(i64, String)> = letters
        .iter()
        .map(|l| {
            let record: serde_json::Value =
                serde_json::from_str(l["record"].as_str().unwrap()).unwrap();
            (
                record["line"].as_i64().unwrap(),
                l["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert_eq!(reasons[0].0, 6);
    assert!(
        reasons[0].1.contains("'affinity'") && reasons[0].1.contains("expected 80 but got 79"),
        "{}",
        reasons[0].1
    );
    assert_eq!(reasons[1].0, 11);
    assert!(
        reasons[1].1.contains("'user_feat'") && reasons[1].1.contains("\"high\""),
        "{}",
        reasons[1].1
    );
}

#[test]
fn the_tensor_stage_builds_the_same_inputs_from_undeclared_columns() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    // The user features as four scalar fields, the affinities as an array: inferred as Float64
    // columns and a List of Float64.
    let mut lines = Vec::new();
    for line in std::fs::read_to_string(events()).unwrap().lines().take(100) {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut record = serde_json::json!({
            "event_id": e["event_id"],
            "position": e["position"],
            "affinity_list": e["affinity"],
        });
        for (i, v) in e["user_feat"].as_array().unwrap().iter().enumerate() {
            record[format!("user_feature_{i}")] = v.clone();
        }
        lines.push(record.to_string());
    }
    let input = write(tmp.path(), "wide.jsonl", &(lines.join("\n") + "\n"));
    let yaml = format!(
        r#"
source:
  jsonl: {{ path: "{input}" }}
stages:
  - tensor: {{ output: user_feat, columns_prefix: user_feature_ }}
  - tensor: {{ output: affinity, from: affinity_list, length: 80 }}
  - model:
      path: "{model}"
      inputs: {{ user_feat: user_feat, affinity: affinity, position: position }}
      outputs: {{ p_click: p_click }}
  - select: {{ columns: [event_id, p_click] }}
sink:
  jsonl: {{ path: out.jsonl }}
"#,
        input = input.display(),
        model = model("obd_ctr.onnx").display(),
    );
    let pipeline = write(tmp.path(), "wide.yaml", &yaml);
    let out = tmp.path().join("scored.jsonl");
    run_quietly(&pipeline, &out);
    let expected: BTreeMap<i64, f64> = reference(&events())
        .into_iter()
        .filter(|(id, _)| *id < 100)
        .collect();
    assert_eq!(expected.len(), 100);
    assert_close(&scored(&out), &expected);
}

#[test]
fn obd_events_through_kafka_score_like_numpy() {
    require_onnx_runtime();
    let brokers = common::kafka::brokers();
    let tmp = tempfile::tempdir().unwrap();
    let topic = common::kafka::topic("obd-events");
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &topic,
        "--jsonl",
        events().to_str().unwrap(),
    ]);
    let yaml = shipped("clicks-obd-kafka.yaml")
        .replace("127.0.0.1:9092", &brokers)
        .replace("topic: obd-events", &format!("topic: {topic}"));
    let pipeline = write(tmp.path(), "obd-kafka.yaml", &yaml);
    let out = tmp.path().join("scored.jsonl");
    run_quietly(&pipeline, &out);
    assert_close(&scored(&out), &reference(&events()));
}
