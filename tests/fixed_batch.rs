//! Models exported with a fixed batch size run correctly: batches are split into the model's
//! batch (the last one padded), and results equal the same model with a dynamic batch.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A copy of the SSDLite person detector whose input batch is fixed at `n` (made with the `onnx`
/// Python package that scripts/setup.sh installs into the cache).
fn fixed_batch_model(tmp: &Path, n: usize) -> PathBuf {
    let python = cache_dir().join("python");
    assert!(
        python.join("onnx").is_dir(),
        "the onnx Python package is missing from {}: run scripts/setup.sh",
        python.display()
    );
    let out = tmp.join(format!("ssdlite_batch{n}.onnx"));
    let script = format!(
        "import onnx, sys\n\
         m = onnx.load(sys.argv[1])\n\
         m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = {n}\n\
         onnx.save(m, sys.argv[2])\n"
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .arg(model("ssdlite_person.onnx"))
        .arg(&out)
        .env("PYTHONPATH", &python)
        .status()
        .unwrap();
    assert!(status.success(), "making the fixed-batch model");
    out
}

#[test]
fn a_model_with_a_fixed_batch_gives_the_dynamic_models_results() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 100..111);
    let dynamic_out = tmp.path().join("dynamic.jsonl");
    let dynamic = write(
        tmp.path(),
        "dynamic.yaml",
        &detection_pipeline(&frames, &dynamic_out, 1, 4, 1),
    );
    riffle_ok(&["run", "-q", dynamic.to_str().unwrap()]);
    let expected = read_jsonl(&dynamic_out);
    assert_eq!(expected.len(), 11);
    for n in [1, 3] {
        let fixed = fixed_batch_model(tmp.path(), n);
        let out = tmp.path().join(format!("fixed{n}.jsonl"));
        let text = detection_pipeline(&frames, &out, 1, 4, 1).replace(
            &model("ssdlite_person.onnx").display().to_string(),
            &fixed.display().to_string(),
        );
        let p = write(tmp.path(), &format!("fixed{n}.yaml"), &text);
        riffle_ok(&["validate", p.to_str().unwrap()]);
        riffle_ok(&["run", "-q", p.to_str().unwrap()]);
        let got = read_jsonl(&out);
        let key = |r: &serde_json::Value| r["frame"].as_i64().unwrap();
        let mut got_sorted = got.clone();
        got_sorted.sort_by_key(key);
        let mut want = expected.clone();
        want.sort_by_key(key);
        assert_eq!(got_sorted.len(), want.len(), "batch {n}: every frame once");
        for (g, w) in got_sorted.iter().zip(&want) {
            assert_eq!(
                g["detections_count"],
                w["detections_count"],
                "batch {n}, frame {}",
                key(w)
            );
            for (a, b) in g["detections"]
                .as_array()
                .unwrap()
                .iter()
                .zip(w["detections"].as_array().unwrap())
            {
                let (sa, sb) = (a["score"].as_f64().unwrap(), b["score"].as_f64().unwrap());
                assert!(
                    (sa - sb).abs() < 1e-4,
                    "batch {n}, frame {}: {sa} vs {sb}",
                    key(w)
                );
            }
        }
    }
}
