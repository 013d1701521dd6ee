//! `riffle gpu-check`: on a GPU host, the dense CTR graph on the GPU (cuBLAS + NVRTC kernels)
//! against the same graph on CPU and ONNX Runtime on CPU, on the same inputs: the largest
//! difference and the throughput of each. Exits non-zero when the GPU result differs by more
//! than 1e-4 or no GPU can be used.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use arrow_array::{Array, Float32Array, Int64Array, RecordBatch};
use riffle_dataflow::Stage;
use riffle_operators::dense::{DenseGraph, Tensor};
use riffle_operators::dense_cuda::CudaDense;

pub fn gpu_check_command(model: &Path, pairs: usize, ordinal: usize) -> Result<()> {
    let gpus = riffle_operators::gpu::discover();
    match &gpus {
        Ok(list) => {
            for g in list {
                println!("cuda:{}: {}", g.ordinal, g.name);
            }
        }
        Err(why) => bail!("no GPU to check: {why}"),
    }
    let graph = DenseGraph::load(model)?;
    let [user, item] = graph.inputs.as_slice() else {
        bail!(
            "expected a model with two id inputs, found {:?}",
            graph.inputs
        );
    };
    let (user, item) = (user.clone(), item.clone());
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
    let inputs = [
        (user.as_str(), Tensor::i64(vec![pairs], users.clone())),
        (item.as_str(), Tensor::i64(vec![pairs], items.clone())),
    ];

    let started = Instant::now();
    let reference = graph.run_cpu(&inputs)?;
    let cpu_time = started.elapsed();
    let reference = reference[0].as_f32()?.to_vec();

    // ONNX Runtime on CPU, as the model stage runs it.
    let spec = serde_json::json!({
        "path": model,
        "inputs": { user.clone(): "u", item.clone(): "i" },
        "outputs": { graph.outputs[0].clone(): "p" },
        "intra_op_threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
    });
    let mut ort = riffle_operators::model::Model::new(serde_json::from_value(spec)?, 1)?;
    let batch = RecordBatch::try_from_iter(vec![
        ("u", Arc::new(Int64Array::from(users)) as Arc<dyn Array>),
        ("i", Arc::new(Int64Array::from(items)) as Arc<dyn Array>),
    ])?;
    let started = Instant::now();
    let out = ort.process_batch(&batch)?.records;
    let ort_time = started.elapsed();
    let ort_values = out
        .column_by_name("p")
        .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
        .context("ONNX Runtime's output")?
        .values()
        .to_vec();

    let gpu = CudaDense::new(DenseGraph::load(model)?, ordinal)?;
    gpu.run(&inputs)?; // warm-up: kernels, cuBLAS handles
    let runs = 5;
    let started = Instant::now();
    let mut result = Vec::new();
    for _ in 0..runs {
        result = gpu.run(&inputs)?;
    }
    let gpu_time = started.elapsed() / runs;
    let gpu_values = result[0].as_f32()?;

    let worst = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let vs_cpu = worst(gpu_values, &reference);
    let vs_ort = worst(gpu_values, &ort_values);
    let rate = |t: std::time::Duration| pairs as f64 / t.as_secs_f64();
    println!("| path | pairs/s | max |difference| to the GPU result |");
    println!("|---|---:|---:|");
    println!(
        "| GPU cuda:{ordinal} (cuBLAS + NVRTC, host I/O included) | {:.0} | 0 |",
        rate(gpu_time)
    );
    println!(
        "| ONNX Runtime, CPU | {:.0} | {vs_ort:.2e} |",
        rate(ort_time)
    );
    println!(
        "| dense executor, CPU | {:.0} | {vs_cpu:.2e} |",
        rate(cpu_time)
    );
    if vs_cpu > 1e-4 || vs_ort > 1e-4 {
        bail!("the GPU result differs from the CPU ones by more than 1e-4");
    }
    println!("gpu-check: GPU and CPU agree within 1e-4 on {pairs} pairs");
    Ok(())
}
