//! `riffle gpu-check`: on a GPU host, every GPU path against its CPU counterpart on the same
//! inputs — the CTR model through the model stage (dense executor on the GPU; its embedding
//! tables split over GPUs; ONNX Runtime's CUDA provider when installed) against ONNX Runtime and
//! the dense executor on CPU, and the resize kernel against the CPU resize stage — with the
//! largest difference and the throughput of each. Exits non-zero when a GPU result differs by
//! more than the stated bound or no GPU can be used.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::UInt32Type;
use arrow_array::{Array, ArrayRef, BinaryArray, Float32Array, Int64Array, RecordBatch};
use riffle_dataflow::Stage;
use riffle_operators::decode::{Decode, DecodeConfig};
use riffle_operators::model::{Engine, Model};
use riffle_operators::resize::ResizeConfig;

/// Largest difference allowed between a GPU model output and ONNX Runtime on CPU.
const MODEL_BOUND: f32 = 1e-4;

pub fn gpu_check_command(model: &Path, frames: &Path, pairs: usize, ordinal: usize) -> Result<()> {
    // `riffle devices` lists them; here only how many.
    let gpus = match riffle_operators::gpu::discover() {
        Ok(list) => list,
        Err(why) => bail!("no GPU to check: {why}"),
    };
    let mut failed = Vec::new();
    check_model(model, pairs, ordinal, gpus.len(), &mut failed)?;
    check_resize(frames, ordinal, &mut failed)?;
    if !failed.is_empty() {
        bail!(
            "GPU results differ from the CPU ones: {}",
            failed.join("; ")
        );
    }
    println!("gpu-check: every GPU path agrees with its CPU path");
    Ok(())
}

/// The CTR model through the model stage on each engine, same (user, item) pairs.
fn check_model(
    model: &Path,
    pairs: usize,
    ordinal: usize,
    gpus: usize,
    failed: &mut Vec<String>,
) -> Result<()> {
    // Ids over the ranges of ml-100k (users 1..=943, items 1..=1682).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m) as i64 + 1
    };
    let users: Vec<i64> = (0..pairs).map(|_| next(943)).collect();
    let items: Vec<i64> = (0..pairs).map(|_| next(1682)).collect();
    let batch = RecordBatch::try_from_iter(vec![
        ("u", Arc::new(Int64Array::from(users)) as ArrayRef),
        ("i", Arc::new(Int64Array::from(items)) as ArrayRef),
    ])?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stage = |device: String, executor: &str, tables: Vec<String>| -> Result<Model> {
        let spec = serde_json::json!({
            "path": model,
            "inputs": { "user_id": "u", "item_id": "i" },
            "outputs": { "p_click": "p" },
            "intra_op_threads": threads,
            "device": device,
            "executor": executor,
            "embedding_devices": tables,
        });
        Ok(Model::new(serde_json::from_value(spec)?, threads)?)
    };
    let run = |m: &mut Model| -> Result<(Vec<f32>, Duration)> {
        m.process_batch(&batch)?; // warm-up: sessions, kernels, cuBLAS handles
        let runs = 5;
        let started = Instant::now();
        let mut out = None;
        for _ in 0..runs {
            out = Some(m.process_batch(&batch)?.records);
        }
        let out = out.context("no run")?;
        let values = out
            .column_by_name("p")
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .context("the model's output column")?
            .values()
            .to_vec();
        Ok((values, started.elapsed() / runs))
    };

    let (reference, ort_cpu) = run(&mut stage("cpu".into(), "ort", vec![])?)?;
    let gpu = format!("cuda:{ordinal}");
    let mut rows = vec![("ONNX Runtime, CPU".to_string(), ort_cpu, 0f32)];
    let (dense_cpu, t) = run(&mut stage("cpu".into(), "dense", vec![])?)?;
    rows.push((
        "dense executor, CPU".into(),
        t,
        worst(&dense_cpu, &reference),
    ));

    let mut dense_gpu = stage(gpu.clone(), "dense", vec![])?;
    if dense_gpu.engine() != Engine::DenseCuda(ordinal) {
        bail!(
            "expected the dense executor on {gpu}, got {:?}",
            dense_gpu.engine()
        );
    }
    let (values, t) = run(&mut dense_gpu)?;
    rows.push((
        format!("dense executor, {gpu} (cuBLAS + NVRTC)"),
        t,
        worst(&values, &reference),
    ));
    // Tables split by row range: over two GPUs when there are two, else two parts on one
    // (the same routing and per-part gathers, without a second device).
    let parts = if gpus > 1 {
        vec![gpu.clone(), format!("cuda:{}", (ordinal + 1) % gpus)]
    } else {
        vec![gpu.clone(), gpu.clone()]
    };
    let label = format!("dense executor, tables split over [{}]", parts.join(", "));
    let (values, t) = run(&mut stage(gpu.clone(), "dense", parts)?)?;
    rows.push((label, t, worst(&values, &reference)));
    if riffle_operators::onnx::cuda_provider_installed() {
        let (values, t) = run(&mut stage(gpu.clone(), "ort", vec![])?)?;
        rows.push((
            format!("ONNX Runtime CUDA provider, {gpu}, pinned I/O"),
            t,
            worst(&values, &reference),
        ));
    } else {
        println!(
            "(ONNX Runtime's CUDA provider is not installed next to {}: its row is skipped)",
            riffle_operators::onnx::library_path().display()
        );
    }

    println!("\nCTR model, {pairs} (user, item) pairs per batch, model stage, host I/O included");
    println!("| engine | pairs/s | max |difference| to ONNX Runtime CPU |");
    println!("|---|---:|---:|");
    for (name, t, diff) in &rows {
        println!(
            "| {name} | {:.0} | {diff:.2e} |",
            pairs as f64 / t.as_secs_f64()
        );
        if *diff > MODEL_BOUND {
            failed.push(format!("{name}: {diff:.2e} > {MODEL_BOUND:e}"));
        }
    }
    Ok(())
}

/// The resize kernel against the CPU resize stage on real frames, in the shipped pipelines'
/// configurations.
fn check_resize(frames: &Path, ordinal: usize, failed: &mut Vec<String>) -> Result<()> {
    let mut files: Vec<_> = std::fs::read_dir(frames)
        .with_context(|| format!("reading frames from {}", frames.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
        .collect();
    files.sort();
    files.truncate(64);
    if files.is_empty() {
        bail!("no .jpg frames in {}", frames.display());
    }
    let bytes = files
        .iter()
        .map(std::fs::read)
        .collect::<std::io::Result<Vec<_>>>()?;
    let batch = RecordBatch::try_from_iter(vec![(
        "bytes",
        Arc::new(BinaryArray::from_iter_values(&bytes)) as ArrayRef,
    )])?;
    let decoded = Decode::new(DecodeConfig::default())
        .process_batch(&batch)?
        .records;
    let pixels = decoded
        .column_by_name("pixels")
        .context("decoded pixels")?
        .as_binary::<i32>();
    let width = decoded
        .column_by_name("width")
        .context("width")?
        .as_primitive::<UInt32Type>();
    let height = decoded
        .column_by_name("height")
        .context("height")?
        .as_primitive::<UInt32Type>();
    let images: Vec<(Vec<u8>, u32, u32)> = (0..decoded.num_rows())
        .map(|r| (pixels.value(r).to_vec(), width.value(r), height.value(r)))
        .collect();

    println!("\nresize, {} frames of {}", images.len(), frames.display());
    println!("| configuration | GPU images/s | CPU images/s | max |GPU − reference| | max |GPU − CPU stage| |");
    println!("|---|---:|---:|---:|---:|");
    let configs = [
        (
            "300×300 NHWC u8 (camera-perception)",
            serde_json::json!({ "width": 300, "height": 300, "layout": "nhwc", "dtype": "u8" }),
        ),
        (
            "224×224 NCHW f32, ImageNet mean/std (camera-classify)",
            serde_json::json!({
                "width": 224, "height": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]
            }),
        ),
    ];
    for (name, spec) in configs {
        let config: ResizeConfig = serde_json::from_value(spec)?;
        let check = riffle_operators::resize_cuda::compare_on_gpu(&config, &images, ordinal)?;
        println!(
            "| {name} | {:.0} | {:.0} | {:.2e} | {:.2e} |",
            check.gpu_images_per_s,
            check.cpu_images_per_s,
            check.max_diff_vs_reference,
            check.max_diff_vs_cpu_stage
        );
        // The kernel does the reference's arithmetic; fast_image_resize may round one level
        // differently (1/255 of the range, divided by the smallest std).
        let level = match config.std {
            Some(std) => 1.0 / 255.0 / std.iter().copied().fold(f32::MAX, f32::min),
            None if config.mean.is_some() => 1.0 / 255.0,
            None => match config.dtype {
                riffle_operators::resize::TensorDtype::U8 => 1.0,
                riffle_operators::resize::TensorDtype::F32 => 1.0 / 255.0,
            },
        };
        if check.max_diff_vs_reference > 1e-4 {
            failed.push(format!(
                "resize {name}: {:.2e} from the reference",
                check.max_diff_vs_reference
            ));
        }
        if check.max_diff_vs_cpu_stage > level * 1.001 {
            failed.push(format!(
                "resize {name}: {:.2e} from the CPU stage (more than one pixel level)",
                check.max_diff_vs_cpu_stage
            ));
        }
    }
    Ok(())
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}
