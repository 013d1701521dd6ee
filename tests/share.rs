//! `share: process`: one model instance serving all of a process's workers gives the same
//! results as one instance per worker.

mod common;

use std::collections::BTreeMap;

use common::*;

/// (camera, frame) → (count, scores) of a results file.
fn by_frame(path: &std::path::Path) -> BTreeMap<(String, i64), (i64, Vec<f64>)> {
    read_jsonl(path)
        .into_iter()
        .map(|r| {
            let scores = r["detections"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["score"].as_f64().unwrap())
                .collect();
            let key = (
                r["camera_id"].as_str().unwrap().to_string(),
                r["frame"].as_i64().unwrap(),
            );
            (key, (r["detections_count"].as_i64().unwrap(), scores))
        })
        .collect()
}

#[test]
fn one_model_per_process_gives_the_per_worker_results() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 120..160);
    let mut results = Vec::new();
    for share in ["worker", "process"] {
        let out = tmp.path().join(format!("{share}.jsonl"));
        let text = detection_pipeline(&frames, &out, 4, 4, 4).replace(
            "      batch: { max_size: 4, max_delay_ms: 5 }",
            &format!("      batch: {{ max_size: 4, max_delay_ms: 5 }}\n      share: {share}"),
        );
        assert!(text.contains("share: "), "the pipeline text changed");
        let pipeline = write(tmp.path(), &format!("{share}.yaml"), &text);
        let plan = riffle_ok(&["plan", pipeline.to_str().unwrap()]);
        let plan = String::from_utf8_lossy(&plan.stdout);
        assert_eq!(
            plan.contains("one instance per process"),
            share == "process",
            "{plan}"
        );
        riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
        results.push(by_frame(&out));
    }
    let (worker, process) = (&results[0], &results[1]);
    assert_eq!(worker.len(), 40, "every frame answered once");
    assert_eq!(
        worker.keys().collect::<Vec<_>>(),
        process.keys().collect::<Vec<_>>()
    );
    let mut detections = 0;
    for (key, (count, scores)) in worker {
        let (other_count, other_scores) = &process[key];
        assert_eq!(count, other_count, "{key:?}");
        // Batches differ between the runs: convolutions may differ in the last bits.
        for (a, b) in scores.iter().zip(other_scores) {
            assert!((a - b).abs() < 1e-4, "{key:?}: {a} vs {b}");
        }
        detections += count;
    }
    assert!(detections > 10, "only {detections} detections compared");
}
