//! The dense-graph executor (the reference for a GPU path without ONNX Runtime's CUDA
//! provider) gives the CTR model's outputs within 1e-4 of ONNX Runtime on CPU.

mod common;

use common::*;
use ort::session::Session;
use ort::value::TensorRef;
use riffle_operators::inference::dense::{DenseGraph, Tensor};

#[test]
fn the_ctr_graph_matches_onnx_runtime() {
    require_onnx_runtime();
    let path = model("ml100k_ncf_ctr.onnx");
    let graph = DenseGraph::load(&path).unwrap();
    assert_eq!(graph.inputs, vec!["user_id", "item_id"]);
    assert_eq!(graph.outputs, vec!["p_click"]);
    // Deterministic pseudo-random ids over the whole id ranges (1..=943 users, 1..=1682 items).
    let n = 2000;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m) as i64 + 1
    };
    let users: Vec<i64> = (0..n).map(|_| next(943)).collect();
    let items: Vec<i64> = (0..n).map(|_| next(1682)).collect();
    let ours = graph
        .run_cpu(&[
            ("user_id", Tensor::i64(vec![n], users.clone())),
            ("item_id", Tensor::i64(vec![n], items.clone())),
        ])
        .unwrap();
    let ours = ours[0].as_f32().unwrap();
    let env = riffle_operators::inference::onnx::environment().unwrap();
    let mut session = Session::builder(&env)
        .unwrap()
        .commit_from_file(&path)
        .unwrap();
    let outputs = session
        .run(ort::inputs![
            "user_id" => TensorRef::from_array_view(([n], users.as_slice())).unwrap(),
            "item_id" => TensorRef::from_array_view(([n], items.as_slice())).unwrap(),
        ])
        .unwrap();
    let (shape, theirs) = outputs["p_click"].try_extract_tensor::<f32>().unwrap();
    assert_eq!(shape.to_vec(), vec![n as i64]);
    let worst = ours
        .iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "max |dense - ORT| = {worst}");
    // Not a constant: the model separates clicks from non-clicks.
    let spread = theirs.iter().copied().fold(f32::MIN, f32::max)
        - theirs.iter().copied().fold(f32::MAX, f32::min);
    assert!(spread > 0.5, "{spread}");
}

#[test]
fn an_unsupported_op_is_named_at_load() {
    let e = DenseGraph::load(&model("mobilenet_v2_imagenet.onnx"))
        .err()
        .expect("MobileNetV2 has convolutions");
    assert!(e.to_string().contains("`Conv`"), "{e}");
}

/// Deterministic ids over the CTR model's ranges (users 1..=943, items 1..=1682).
fn ids(n: usize, seed: u64) -> (Vec<i64>, Vec<i64>) {
    let mut state = seed;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m) as i64 + 1
    };
    let users = (0..n).map(|_| next(943)).collect();
    let items = (0..n).map(|_| next(1682)).collect();
    (users, items)
}

#[test]
fn embedding_tables_split_by_row_range_give_the_same_scores() {
    let path = model("ml100k_ncf_ctr.onnx");
    let whole = DenseGraph::load(&path).unwrap();
    let tables = whole.embedding_tables();
    assert!(tables.len() >= 2, "user and item tables: {tables:?}");
    let (users, items) = ids(3000, 0x9e37_79b9_7f4a_7c15);
    let inputs = [
        ("user_id", Tensor::i64(vec![3000], users)),
        ("item_id", Tensor::i64(vec![3000], items)),
    ];
    let expected = whole.run_cpu(&inputs).unwrap();
    for parts in [2, 3, 7] {
        let mut split = DenseGraph::load(&path).unwrap();
        split.split_tables(parts).unwrap();
        // The whole tables are gone: every lookup went through the parts.
        assert!(split.embedding_tables().is_empty());
        assert_eq!(split.run_cpu(&inputs).unwrap(), expected, "{parts} parts");
    }
}

#[test]
fn the_model_stage_runs_the_dense_executor_like_onnx_runtime() {
    use arrow_array::{Array, Float32Array, Int64Array, RecordBatch};
    use riffle_dataflow::Stage;
    use riffle_operators::inference::model::{Engine, Model};
    use std::sync::Arc;
    require_onnx_runtime();
    let stage = |executor: &str| {
        let spec = serde_json::json!({
            "path": model("ml100k_ncf_ctr.onnx"),
            "inputs": { "user_id": "user", "item_id": "item" },
            "outputs": { "p_click": "score" },
            "executor": executor,
        });
        Model::new(serde_json::from_value(spec).unwrap(), 1).unwrap()
    };
    let (mut dense, mut ort) = (stage("dense"), stage("ort"));
    assert_eq!(dense.engine(), Engine::DenseCpu);
    assert_eq!(ort.engine(), Engine::OrtCpu);
    let (users, items) = ids(500, 0x2545_f491_4f6c_dd1d);
    let batch = RecordBatch::try_from_iter(vec![
        ("user", Arc::new(Int64Array::from(users)) as Arc<dyn Array>),
        ("item", Arc::new(Int64Array::from(items)) as Arc<dyn Array>),
    ])
    .unwrap();
    let schema = ort.output_schema(&batch.schema()).unwrap();
    assert_eq!(dense.output_schema(&batch.schema()).unwrap(), schema);
    let scores = |out: riffle_dataflow::StageOutput| {
        assert_eq!(out.records.schema(), schema);
        out.records
            .column_by_name("score")
            .unwrap()
            .as_any()
            .downcast_ref::<Float32Array>()
            .unwrap()
            .values()
            .to_vec()
    };
    let a = scores(dense.process_batch(&batch).unwrap());
    let b = scores(ort.process_batch(&batch).unwrap());
    assert_eq!(a.len(), 500);
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "max |dense - ORT| = {worst}");
}
