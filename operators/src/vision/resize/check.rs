//! `riffle gpu-check`'s resize part: the stage on a GPU against the CPU stage and the
//! reference arithmetic, over one batch.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::types::{Float32Type, UInt8Type};
use arrow_array::{ArrayRef, BinaryArray, RecordBatch, UInt32Array};
use riffle_dataflow::stage::Stage;
use riffle_dataflow::tensor::tensor_values;
use riffle_dataflow::{DataflowError, DataflowResult};

use super::reference::{err, reference_tensor};
use super::{check_row, Resize, ResizeConfig, TensorDtype, STAGE};
use crate::vision::decode::{HEIGHT_COLUMN, WIDTH_COLUMN};

/// What [`compare_on_gpu`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuResizeCheck {
    pub images: usize,
    /// Largest |GPU − [`reference_tensor`]| over all tensor values (0 when the kernels are
    /// right: they do the reference's integer arithmetic).
    pub max_diff_vs_reference: f32,
    /// Largest |GPU − CPU `resize` stage (fast_image_resize)| over all tensor values.
    pub max_diff_vs_cpu_stage: f32,
    /// Images per second through the stage's `process_batch`, host copies included.
    pub gpu_images_per_s: f64,
    pub cpu_images_per_s: f64,
}

/// Timed runs after the warm-up one.
const TIMED_RUNS: usize = 5;

/// Runs the `resize` stage on GPU `ordinal` and on the CPU over one batch of `images` (RGB8
/// pixels, width, height; all valid) and compares their tensors with each other and with
/// [`reference_tensor`].
pub fn compare_on_gpu(
    config: &ResizeConfig,
    images: &[(Vec<u8>, u32, u32)],
    ordinal: usize,
) -> DataflowResult<GpuResizeCheck> {
    if images.is_empty() {
        return Err(DataflowError::Config(format!(
            "{STAGE}: no images to compare"
        )));
    }
    for (i, (pixels, w, h)) in images.iter().enumerate() {
        check_row(pixels, *w, *h)
            .map_err(|e| DataflowError::Config(format!("{STAGE}: image {i}: {e}")))?;
    }
    let mut cpu = Resize::new(config.clone())?;
    let mut gpu = Resize::on_gpu(config.clone(), ordinal)?;
    let batch = image_batch(config, images)?;
    let reference = reference_tensor(config, images)?;
    let (gpu_values, gpu_images_per_s) = timed(&mut gpu, config, &batch)?;
    let (cpu_values, cpu_images_per_s) = timed(&mut cpu, config, &batch)?;
    Ok(GpuResizeCheck {
        images: images.len(),
        max_diff_vs_reference: max_diff(&gpu_values, &reference)?,
        max_diff_vs_cpu_stage: max_diff(&gpu_values, &cpu_values)?,
        gpu_images_per_s,
        cpu_images_per_s,
    })
}

/// A batch as `decode` would give it: the pixel column, `width` and `height`.
pub(super) fn image_batch(
    config: &ResizeConfig,
    images: &[(Vec<u8>, u32, u32)],
) -> DataflowResult<RecordBatch> {
    let pixels: Vec<&[u8]> = images.iter().map(|i| i.0.as_slice()).collect();
    let widths = UInt32Array::from_iter_values(images.iter().map(|i| i.1));
    let heights = UInt32Array::from_iter_values(images.iter().map(|i| i.2));
    Ok(RecordBatch::try_from_iter(vec![
        (
            config.input.as_str(),
            Arc::new(BinaryArray::from(pixels)) as ArrayRef,
        ),
        (WIDTH_COLUMN, Arc::new(widths) as ArrayRef),
        (HEIGHT_COLUMN, Arc::new(heights) as ArrayRef),
    ])?)
}

/// The stage's tensor for `batch` (as f32) and its images per second over [`TIMED_RUNS`] runs.
pub(super) fn timed(
    stage: &mut Resize,
    config: &ResizeConfig,
    batch: &RecordBatch,
) -> DataflowResult<(Vec<f32>, f64)> {
    let out = stage.process_batch(batch)?;
    if let Some(dead) = out.rejected.first() {
        return Err(err(format!("a row was rejected: {}", dead.reason)));
    }
    let column = out
        .records
        .column_by_name(&config.output)
        .ok_or_else(|| err(format!("no `{}` column in the output", config.output)))?;
    let values = match config.dtype {
        TensorDtype::F32 => tensor_values::<Float32Type>(column.as_ref())?.to_vec(),
        TensorDtype::U8 => tensor_values::<UInt8Type>(column.as_ref())?
            .iter()
            .map(|&p| f32::from(p))
            .collect(),
    };
    let start = Instant::now();
    for _ in 0..TIMED_RUNS {
        stage.process_batch(batch)?;
    }
    let seconds = start.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    Ok((values, (TIMED_RUNS * batch.num_rows()) as f64 / seconds))
}

pub(super) fn max_diff(a: &[f32], b: &[f32]) -> DataflowResult<f32> {
    if a.len() != b.len() {
        return Err(err(format!(
            "tensors of {} and {} values cannot be compared",
            a.len(),
            b.len()
        )));
    }
    Ok(a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max))
}
