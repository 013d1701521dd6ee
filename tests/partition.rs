//! A model given as two ONNX parts: MobileNetV2 split by `scripts/split-model.py` (run from
//! `scripts/setup.sh`) into a backbone (`input` → a feature map) and a head (that feature map →
//! `logits`). Part 1 then part 2 on real frames gives the whole model's logits.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{ArrayRef, BinaryArray, FixedSizeListArray, Int64Array, RecordBatch};
use common::*;
use ort::session::Session;
use ort::value::TensorRef;
use riffle_dataflow::stage::Stage;
use riffle_operators::vision::decode::{Decode, DecodeConfig};
use riffle_operators::vision::resize::{Layout, Resize, ResizeConfig, TensorDtype};

const FRAMES: [usize; 4] = [0, 57, 130, 249];

/// The two parts `scripts/setup.sh` writes; fails (never skips) when they are missing.
fn parts() -> (PathBuf, PathBuf) {
    let dir = model("parts");
    let parts = (
        dir.join("mobilenet_v2_imagenet.part1.onnx"),
        dir.join("mobilenet_v2_imagenet.part2.onnx"),
    );
    for part in [&parts.0, &parts.1] {
        assert!(
            part.is_file(),
            "model part {} not found: run `scripts/setup.sh` (it splits \
             models/mobilenet_v2_imagenet.onnx with scripts/split-model.py)",
            part.display()
        );
    }
    parts
}

/// The frames as the classification pipeline feeds them: decoded, resized to 224×224, NCHW
/// f32 with ImageNet mean/std, one `[4, 3, 224, 224]` buffer.
fn input_tensor() -> Vec<f32> {
    let bytes: Vec<Vec<u8>> = FRAMES
        .iter()
        .map(|f| std::fs::read(frames_dir().join(format!("{f:04}.jpg"))).unwrap())
        .collect();
    let batch = RecordBatch::try_from_iter(vec![
        (
            "frame",
            Arc::new(Int64Array::from_iter_values(FRAMES.map(|f| f as i64))) as ArrayRef,
        ),
        (
            "bytes",
            Arc::new(BinaryArray::from_iter_values(&bytes)) as ArrayRef,
        ),
    ])
    .unwrap();
    let decoded = Decode::new(DecodeConfig::default())
        .process_batch(&batch)
        .unwrap();
    assert!(decoded.rejected.is_empty(), "{:?}", decoded.rejected);
    let mut resize = Resize::new(ResizeConfig {
        input: "pixels".to_string(),
        output: "tensor".to_string(),
        width: 224,
        height: 224,
        layout: Layout::Nchw,
        dtype: TensorDtype::F32,
        mean: Some([0.485, 0.456, 0.406]),
        std: Some([0.229, 0.224, 0.225]),
        scale: None,
        offset: None,
        mode: Default::default(),
        antialias: Some(true),
        pad_value: 114,
        keep_input: false,
        device: Default::default(),
    })
    .unwrap();
    let resized = resize.process_batch(&decoded.records).unwrap();
    assert!(resized.rejected.is_empty(), "{:?}", resized.rejected);
    assert_eq!(resized.records.num_rows(), FRAMES.len());
    let tensor: &FixedSizeListArray = resized
        .records
        .column_by_name("tensor")
        .unwrap()
        .as_fixed_size_list();
    let values = tensor
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec();
    assert_eq!(values.len(), FRAMES.len() * 3 * 224 * 224);
    values
}

fn session(path: PathBuf) -> Session {
    let env = riffle_operators::inference::onnx::environment().unwrap();
    Session::builder(&env)
        .unwrap()
        .commit_from_file(&path)
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// The single input and output names of a session.
fn io_names(session: &Session) -> (String, String) {
    assert_eq!(session.inputs().len(), 1);
    assert_eq!(session.outputs().len(), 1);
    (
        session.inputs()[0].name().to_string(),
        session.outputs()[0].name().to_string(),
    )
}

/// Runs a one-input, one-output session; returns the output's shape and values.
fn run(session: &mut Session, shape: &[i64], values: &[f32]) -> (Vec<i64>, Vec<f32>) {
    let (input, output) = io_names(session);
    let tensor = TensorRef::from_array_view((shape.to_vec(), values)).unwrap();
    let outputs = session.run(ort::inputs![input.as_str() => tensor]).unwrap();
    let (shape, data) = outputs[output.as_str()]
        .try_extract_tensor::<f32>()
        .unwrap();
    (shape.to_vec(), data.to_vec())
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0
}

#[test]
fn two_parts_chained_equal_the_whole_model() {
    require_onnx_runtime();
    let (part1_path, part2_path) = parts();
    let input = input_tensor();
    let shape = [FRAMES.len() as i64, 3, 224, 224];

    let mut whole = session(model("mobilenet_v2_imagenet.onnx"));
    let mut part1 = session(part1_path);
    let mut part2 = session(part2_path);
    let (_, cut_out) = io_names(&part1);
    let (cut_in, logits_name) = io_names(&part2);
    assert_eq!(cut_out, cut_in, "part 2 reads the tensor part 1 writes");
    assert_eq!(logits_name, "logits");

    let (logits_shape, logits) = run(&mut whole, &shape, &input);
    assert_eq!(logits_shape, [FRAMES.len() as i64, 1000]);

    let (cut_shape, cut) = run(&mut part1, &shape, &input);
    assert_eq!(
        cut_shape.len(),
        4,
        "the cut `{cut_out}` is a feature map [N, C, H, W], found {cut_shape:?}"
    );
    assert_eq!(cut_shape[0], FRAMES.len() as i64, "batch of the cut");
    assert!(
        cut_shape[1..].iter().all(|&d| d > 1),
        "the cut {cut_shape:?} is a real feature map"
    );
    let (chained_shape, chained) = run(&mut part2, &cut_shape, &cut);
    assert_eq!(chained_shape, logits_shape);

    let worst = logits
        .iter()
        .zip(&chained)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("cut `{cut_out}` {cut_shape:?}: max |whole - part2(part1)| = {worst:e}");
    assert!(
        worst <= 1e-4,
        "chained parts differ from the whole model by {worst}"
    );
    for (i, frame) in FRAMES.iter().enumerate() {
        let rows = |v: &[f32]| v[i * 1000..(i + 1) * 1000].to_vec();
        assert_eq!(
            argmax(&rows(&logits)),
            argmax(&rows(&chained)),
            "top-1 class of frame {frame}"
        );
    }
}

#[test]
fn parts_take_any_batch_size() {
    require_onnx_runtime();
    let (part1_path, part2_path) = parts();
    let input = input_tensor();
    let per_frame = 3 * 224 * 224;
    let mut whole = session(model("mobilenet_v2_imagenet.onnx"));
    let mut part1 = session(part1_path);
    let mut part2 = session(part2_path);
    // One frame alone, then the last three together: the batch dimension stays dynamic.
    for (start, n) in [(0usize, 1usize), (1, 3)] {
        let values = &input[start * per_frame..(start + n) * per_frame];
        let shape = [n as i64, 3, 224, 224];
        let (_, logits) = run(&mut whole, &shape, values);
        let (cut_shape, cut) = run(&mut part1, &shape, values);
        assert_eq!(cut_shape[0], n as i64);
        let (chained_shape, chained) = run(&mut part2, &cut_shape, &cut);
        assert_eq!(chained_shape, [n as i64, 1000]);
        let worst = logits
            .iter()
            .zip(&chained)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "batch of {n}: differs by {worst}");
    }
}

/// `camera-classify-split.yaml` as a 2-process cluster (backbone in one process, head in the
/// other) with `compression`, on `frames`, writing to `out`.
fn split_run(frames: &std::path::Path, out: &std::path::Path, compression: &str) -> String {
    let dir = out.parent().unwrap();
    let text = shipped("camera-classify-split.yaml", dir)
        .replace(
            &format!("path: {}/data/frames", repo().display()),
            &format!("path: \"{}\"", frames.display()),
        )
        .replace("compression: fp16", &format!("compression: {compression}"));
    let file = write(dir, &format!("split-{compression}.yaml"), &text);
    let port = free_port_pair().to_string();
    let run = riffle_ok(&[
        "run",
        file.to_str().unwrap(),
        "--workers",
        "1",
        "--processes",
        "2",
        "--base-port",
        &port,
        "--output",
        out.to_str().unwrap(),
    ]);
    String::from_utf8_lossy(&run.stderr).into_owned()
}

fn top1(path: &std::path::Path) -> std::collections::BTreeMap<i64, (String, f64)> {
    read_jsonl(path)
        .iter()
        .map(|r| {
            (
                r["frame"].as_i64().unwrap(),
                (
                    r["top_label"].as_str().unwrap().to_string(),
                    r["top_score"].as_f64().unwrap(),
                ),
            )
        })
        .collect()
}

#[test]
fn parts_on_two_processes_give_the_whole_models_top1_with_every_compression() {
    require_onnx_runtime();
    parts();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", (0..250).step_by(10));
    // The whole model, one process.
    let whole_out = tmp.path().join("whole.jsonl");
    let whole_yaml = shipped("camera-classify.yaml", tmp.path()).replace(
        &format!("path: {}/data/frames, cameras: 2", repo().display()),
        &format!("path: \"{}\"", frames.display()),
    );
    let whole_file = write(tmp.path(), "whole.yaml", &whole_yaml);
    run_quietly(&whole_file, &whole_out);
    let whole = top1(&whole_out);
    assert_eq!(whole.len(), 25);
    for compression in ["none", "fp16", "sparse"] {
        let out = tmp.path().join(format!("split-{compression}.jsonl"));
        let stderr = split_run(&frames, &out, compression);
        assert!(
            stderr.contains("bytes received from other processes"),
            "activations crossed processes: {stderr}"
        );
        let split = top1(&out);
        assert_eq!(split.len(), whole.len(), "{compression}: every frame once");
        for (frame, (label, score)) in &whole {
            let (l, s) = &split[frame];
            assert_eq!(l, label, "{compression}: frame {frame} top-1");
            // FP16 activations move the softmax score a little; the others not at all.
            let tolerance = if compression == "fp16" { 5e-3 } else { 1e-5 };
            assert!(
                (s - score).abs() < tolerance,
                "{compression}: frame {frame}: {s} vs {score}"
            );
        }
    }
}
