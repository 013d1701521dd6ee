//! `riffle gpu-check`'s library side: on a GPU host, every GPU path against its CPU
//! counterpart on the same inputs — the CTR model through the model stage (dense executor on
//! the GPU; its embedding tables split over GPUs; ONNX Runtime's CUDA provider when installed)
//! against ONNX Runtime and the dense executor on CPU, and the resize kernels against the CPU
//! resize stage — with the largest difference and the throughput of each. The CLI prints the
//! [`GpuCheckReport`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::UInt32Type;
use arrow_array::{Array, ArrayRef, BinaryArray, Float32Array, Int64Array, RecordBatch};
use riffle_dataflow::{DataflowError, DataflowResult, Stage};
use riffle_gpu::DeviceSpec;

use crate::inference::model::{BatchConfig, Engine, Executor, Model, ModelConfig, OutputSpec};
use crate::vision::decode::{Decode, DecodeConfig};
use crate::vision::resize::{compare_on_gpu, GpuResizeCheck, Layout, ResizeConfig, TensorDtype};

/// Largest difference allowed between a GPU model output and ONNX Runtime on CPU.
pub const MODEL_BOUND: f32 = 1e-4;
/// Largest difference allowed between the resize kernels and the reference arithmetic.
pub const RESIZE_REFERENCE_BOUND: f32 = 1e-4;

/// What [`run`] measured.
#[derive(Clone, Debug)]
pub struct GpuCheckReport {
    /// The CTR model's (user, item) pairs per batch.
    pub pairs: usize,
    /// One row per engine, ONNX Runtime on CPU (the reference) first.
    pub model: Vec<EngineRow>,
    /// Where ONNX Runtime's CUDA provider was looked for, when it is not installed (its row
    /// is then missing).
    pub ort_cuda_missing: Option<PathBuf>,
    /// The frames resized.
    pub frames: usize,
    pub resize: Vec<ResizeRow>,
    /// Every GPU result beyond its bound, in words; empty when all agree.
    pub failed: Vec<String>,
}

/// The model stage on one engine.
#[derive(Clone, Debug)]
pub struct EngineRow {
    pub engine: String,
    /// Mean time of one batch, host I/O included.
    pub per_batch: Duration,
    /// Largest |output − ONNX Runtime on CPU|.
    pub max_diff: f32,
}

/// The resize stage in one configuration.
#[derive(Clone, Debug)]
pub struct ResizeRow {
    pub configuration: String,
    pub check: GpuResizeCheck,
}

/// Runs every check on GPU `ordinal`: the CTR model at `model` over `pairs` pairs, the resize
/// stage over the `.jpg` frames in `frames` (the first 64). Errors when there is no usable GPU
/// or a check cannot run; results beyond their bounds are in [`GpuCheckReport::failed`].
pub fn run(
    model: &Path,
    frames: &Path,
    pairs: usize,
    ordinal: usize,
) -> DataflowResult<GpuCheckReport> {
    let gpus = riffle_gpu::discover()
        .map_err(|why| DataflowError::Config(format!("no GPU to check: {why}")))?;
    let mut failed = Vec::new();
    let (rows, ort_cuda_missing) = check_model(model, pairs, ordinal, gpus.len())?;
    for row in &rows {
        if row.max_diff > MODEL_BOUND {
            failed.push(format!(
                "{}: {:.2e} > {MODEL_BOUND:e}",
                row.engine, row.max_diff
            ));
        }
    }
    let images = frames_of(frames)?;
    let resize = check_resize(&images, ordinal, &mut failed)?;
    Ok(GpuCheckReport {
        pairs,
        model: rows,
        ort_cuda_missing,
        frames: images.len(),
        resize,
        failed,
    })
}

/// The CTR model through the model stage on each engine, same (user, item) pairs.
fn check_model(
    model: &Path,
    pairs: usize,
    ordinal: usize,
    gpus: usize,
) -> DataflowResult<(Vec<EngineRow>, Option<PathBuf>)> {
    let check = CtrCheck {
        model,
        batch: ctr_pairs(pairs)?,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let (reference, ort_cpu) =
        check.time(&mut check.stage(DeviceSpec::Cpu, Executor::Ort, vec![])?)?;
    let gpu = DeviceSpec::Cuda(ordinal);
    let mut rows = vec![EngineRow {
        engine: "ONNX Runtime, CPU".into(),
        per_batch: ort_cpu,
        max_diff: 0.0,
    }];
    rows.push(check.row(
        "dense executor, CPU".into(),
        &mut check.stage(DeviceSpec::Cpu, Executor::Dense, vec![])?,
        &reference,
    )?);

    let mut dense_gpu = check.stage(gpu.clone(), Executor::Dense, vec![])?;
    if dense_gpu.engine() != Engine::DenseCuda(ordinal) {
        return Err(DataflowError::stage(
            "gpu-check",
            format!(
                "expected the dense executor on {gpu}, got {:?}",
                dense_gpu.engine()
            ),
        ));
    }
    let label = format!("dense executor, {gpu} (cuBLAS + NVRTC)");
    rows.push(check.row(label, &mut dense_gpu, &reference)?);
    // Tables split by row range: over two GPUs when there are two, else two parts on one
    // (the same routing and per-part gathers, without a second device).
    let parts = if gpus > 1 {
        vec![gpu.clone(), DeviceSpec::Cuda((ordinal + 1) % gpus)]
    } else {
        vec![gpu.clone(), gpu.clone()]
    };
    let names: Vec<String> = parts.iter().map(ToString::to_string).collect();
    let label = format!("dense executor, tables split over [{}]", names.join(", "));
    rows.push(check.row(
        label,
        &mut check.stage(gpu.clone(), Executor::Dense, parts)?,
        &reference,
    )?);
    let mut ort_cuda_missing = None;
    if crate::inference::onnx::cuda_provider_installed() {
        rows.push(check.row(
            format!("ONNX Runtime CUDA provider, {gpu}, pinned I/O"),
            &mut check.stage(gpu.clone(), Executor::Ort, vec![])?,
            &reference,
        )?);
    } else {
        ort_cuda_missing = Some(crate::inference::onnx::library_path());
    }
    Ok((rows, ort_cuda_missing))
}

/// `pairs` random (user, item) id pairs over the ranges of ml-100k (users 1..=943, items
/// 1..=1682), as the columns `u` and `i`; the same pairs every time.
fn ctr_pairs(pairs: usize) -> DataflowResult<RecordBatch> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m) as i64 + 1
    };
    let users: Vec<i64> = (0..pairs).map(|_| next(943)).collect();
    let items: Vec<i64> = (0..pairs).map(|_| next(1682)).collect();
    Ok(RecordBatch::try_from_iter(vec![
        ("u", Arc::new(Int64Array::from(users)) as ArrayRef),
        ("i", Arc::new(Int64Array::from(items)) as ArrayRef),
    ])?)
}

/// The CTR model's check: the model, the batch every engine runs, and the threads each may use.
struct CtrCheck<'a> {
    model: &'a Path,
    batch: RecordBatch,
    threads: usize,
}

impl CtrCheck<'_> {
    /// The model stage on `device` with `executor`, its embedding tables on `tables`.
    fn stage(
        &self,
        device: DeviceSpec,
        executor: Executor,
        tables: Vec<DeviceSpec>,
    ) -> DataflowResult<Model> {
        let config = ModelConfig {
            path: self.model.to_path_buf(),
            inputs: [("user_id", "u"), ("item_id", "i")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            outputs: [("p_click".to_string(), OutputSpec::Column("p".into()))]
                .into_iter()
                .collect(),
            batch: BatchConfig::default(),
            intra_op_threads: Some(self.threads),
            device,
            executor,
            embedding_devices: tables,
            keep_inputs: false,
            share: Default::default(),
            poll_ms: 1000,
            variants: Vec::new(),
            variant_key: None,
            shadow: None,
        };
        Model::new(config, self.threads)
    }

    /// The stage's `p` column for the batch, and the mean time of one batch after a warm-up.
    fn time(&self, m: &mut Model) -> DataflowResult<(Vec<f32>, Duration)> {
        m.process_batch(&self.batch)?; // warm-up: sessions, kernels, cuBLAS handles
        let runs = 5;
        let started = Instant::now();
        let mut out = None;
        for _ in 0..runs {
            out = Some(m.process_batch(&self.batch)?.records);
        }
        let values = out
            .as_ref()
            .and_then(|o| o.column_by_name("p"))
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| DataflowError::stage("gpu-check", "no `p` output column"))?
            .values()
            .to_vec();
        Ok((values, started.elapsed() / runs))
    }

    /// `stage` timed, named `engine`, with its largest difference from `reference`.
    fn row(
        &self,
        engine: String,
        stage: &mut Model,
        reference: &[f32],
    ) -> DataflowResult<EngineRow> {
        let (values, per_batch) = self.time(stage)?;
        Ok(EngineRow {
            engine,
            per_batch,
            max_diff: worst(&values, reference),
        })
    }
}

/// The first 64 `.jpg` frames of `frames`, decoded: RGB8 pixels, width, height.
fn frames_of(frames: &Path) -> DataflowResult<Vec<(Vec<u8>, u32, u32)>> {
    let reading = |e| DataflowError::io(format!("reading frames from {}", frames.display()), e);
    let mut files: Vec<_> = std::fs::read_dir(frames)
        .map_err(reading)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
        .collect();
    files.sort();
    files.truncate(64);
    if files.is_empty() {
        return Err(DataflowError::Config(format!(
            "no .jpg frames in {}",
            frames.display()
        )));
    }
    let bytes = files
        .iter()
        .map(std::fs::read)
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(reading)?;
    let batch = RecordBatch::try_from_iter(vec![(
        "bytes",
        Arc::new(BinaryArray::from_iter_values(&bytes)) as ArrayRef,
    )])?;
    let decoded = Decode::new(DecodeConfig::default())
        .process_batch(&batch)?
        .records;
    let column = |name: &str| {
        decoded
            .column_by_name(name)
            .ok_or_else(|| DataflowError::stage("gpu-check", format!("no decoded `{name}`")))
    };
    let pixels = column("pixels")?.as_binary::<i32>();
    let width = column("width")?.as_primitive::<UInt32Type>();
    let height = column("height")?.as_primitive::<UInt32Type>();
    Ok((0..decoded.num_rows())
        .map(|r| (pixels.value(r).to_vec(), width.value(r), height.value(r)))
        .collect())
}

/// The resize kernels against the CPU resize stage on real frames, in the shipped pipelines'
/// configurations.
fn check_resize(
    images: &[(Vec<u8>, u32, u32)],
    ordinal: usize,
    failed: &mut Vec<String>,
) -> DataflowResult<Vec<ResizeRow>> {
    let config = |width, height, layout, dtype, mean, std| ResizeConfig {
        input: "pixels".into(),
        output: "tensor".into(),
        width,
        height,
        layout,
        dtype,
        mean,
        std,
        scale: None,
        offset: None,
        mode: Default::default(),
        antialias: Some(true),
        pad_value: 114,
        keep_input: false,
        device: DeviceSpec::Cpu,
    };
    let configs = [
        (
            "300×300 NHWC u8 (camera-perception)",
            config(300, 300, Layout::Nhwc, TensorDtype::U8, None, None),
        ),
        (
            "224×224 NCHW f32, ImageNet mean/std, antialiased (the classify stretch, as the CPU default)",
            config(
                224,
                224,
                Layout::Nchw,
                TensorDtype::F32,
                Some([0.485, 0.456, 0.406]),
                Some([0.229, 0.224, 0.225]),
            ),
        ),
    ];
    let mut rows = Vec::new();
    for (name, config) in configs {
        let check = compare_on_gpu(&config, images, ordinal)?;
        // The kernel does the reference's arithmetic; fast_image_resize may round one level
        // differently (1/255 of the range, divided by the smallest std).
        let level = match config.std {
            Some(std) => 1.0 / 255.0 / std.iter().copied().fold(f32::MAX, f32::min),
            None if config.mean.is_some() => 1.0 / 255.0,
            None => match config.dtype {
                TensorDtype::U8 => 1.0,
                TensorDtype::F32 => 1.0 / 255.0,
            },
        };
        if check.max_diff_vs_reference > RESIZE_REFERENCE_BOUND {
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
        rows.push(ResizeRow {
            configuration: name.to_string(),
            check,
        });
    }
    Ok(rows)
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
