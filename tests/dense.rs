//! The dense-graph executor (the reference for a GPU path without ONNX Runtime's CUDA
//! provider) gives the CTR model's outputs within 1e-4 of ONNX Runtime on CPU.

mod common;

use common::*;
use ort::session::Session;
use ort::value::TensorRef;
use riffle_operators::dense::{DenseGraph, Tensor};

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
    let env = riffle_operators::onnx::environment().unwrap();
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
