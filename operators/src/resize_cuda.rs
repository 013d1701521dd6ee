//! The `resize` stage on a CUDA GPU.
//!
//! Two NVRTC kernels redo fast_image_resize's bilinear convolution of RGB8 images with its own
//! integer arithmetic: the same taps ([`Taps::bilinear`]), the same fixed-point weights and
//! rounding, the same pass order (vertical first for u8, each pass rounding to u8). The second
//! kernel then maps each pixel through the CPU stage's normalisation table and writes the
//! tensor in its layout, so the GPU path gives the CPU stage's values exactly, not
//! approximately. [`resize_rgb8`] is the kernels' arithmetic on the host: the unit tests hold it
//! to fast_image_resize, and [`compare_on_gpu`] (`riffle gpu-check`) holds the kernels to it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::types::{Float32Type, UInt8Type};
use arrow_array::{ArrayRef, BinaryArray, RecordBatch, UInt32Array};
use cudarc::driver::LaunchConfig;
use riffle_dataflow::stage::Stage;
use riffle_dataflow::tensor::tensor_values;
use riffle_dataflow::{DataflowError, DataflowResult};

use crate::cuda_device::{check_gpu, Arg, CudaDevice, Device, Elem, Kernels, Stream};
use crate::decode::{HEIGHT_COLUMN, WIDTH_COLUMN};
use crate::resize::{check_row, Layout, Lut, Resize, ResizeConfig, TensorDtype, Values};

const STAGE: &str = "resize";

fn err(message: impl Into<String>) -> DataflowError {
    DataflowError::stage(STAGE, message.into())
}

/// fast_image_resize's `FilterType::Bilinear` (a triangle of support 1).
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// fast_image_resize's fixed point for u8 images (`Normalizer16`): 8 bits of result and 2 of
/// headroom in an i32 sum, weights stored as i16.
const PRECISION_BITS: u32 = 32 - 8 - 2;
const MAX_COEFFS_PRECISION: u32 = 16 - 1;

/// One axis's convolution taps from a source size to a target size, as fast_image_resize
/// computes them for `ResizeAlg::Convolution(FilterType::Bilinear)` on u8 images.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taps {
    /// Per output index, its first source index.
    pub starts: Vec<i32>,
    /// Per output index, how many source indices it reads (at most `window`).
    pub counts: Vec<i32>,
    /// Per output index, `window` weights scaled by `2^precision` (unused ones zero).
    pub weights: Vec<i32>,
    pub window: usize,
    pub precision: u32,
}

impl Taps {
    /// The taps resizing `in_size` pixels to `out_size` (empty when either is zero).
    pub fn bilinear(in_size: u32, out_size: u32) -> Taps {
        let (coeffs, lib_window, bounds) = coefficients(in_size, out_size);
        let precision = precision_of(&coeffs);
        let scale = (1i64 << precision) as f64;
        let window = bounds
            .iter()
            .map(|&(_, n)| n as usize)
            .max()
            .unwrap_or(0)
            .max(1);
        let mut taps = Taps {
            starts: Vec::with_capacity(bounds.len()),
            counts: Vec::with_capacity(bounds.len()),
            weights: Vec::with_capacity(bounds.len() * window),
            window,
            precision,
        };
        for (chunk, &(start, size)) in coeffs.chunks_exact(lib_window.max(1)).zip(&bounds) {
            taps.starts.push(start as i32);
            taps.counts.push(size as i32);
            // `as i16` as the library does: it saturates, though normalised weights never reach it.
            let fixed = chunk.iter().take(size as usize);
            let fixed = fixed.map(|&v| i32::from((v * scale).round() as i16));
            taps.weights.extend(fixed);
            let padding = window - size as usize;
            taps.weights.extend(std::iter::repeat_n(0, padding));
        }
        taps
    }

    /// Number of output indices.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Output value `out` from source values `src(i)`: the kernels' exact integer arithmetic.
    fn convolve(&self, out: usize, src: impl Fn(usize) -> u8) -> u8 {
        let start = self.starts[out] as usize;
        let count = self.counts[out] as usize;
        let weights = &self.weights[out * self.window..][..count];
        // Half of the last step: round half up, as fast_image_resize does.
        let mut ss: i32 = 1 << (self.precision - 1);
        for (j, &w) in weights.iter().enumerate() {
            ss = ss.wrapping_add(i32::from(src(start + j)).wrapping_mul(w));
        }
        (ss >> self.precision).clamp(0, 255) as u8
    }

    /// Appends `starts`, `counts`, `weights` (the kernels' layout) to `out`; returns the offset.
    fn append_to(&self, out: &mut Vec<i32>) -> usize {
        let offset = out.len();
        out.extend_from_slice(&self.starts);
        out.extend_from_slice(&self.counts);
        out.extend_from_slice(&self.weights);
        offset
    }
}

/// fast_image_resize's `precompute_coefficients` for no crop box and an adaptive kernel size
/// (which `ResizeAlg::Convolution` uses): the f64 weights (`window` per output index, normalised
/// to sum 1), `window`, and per output index its (first source index, count). The same f64
/// operations in the same order, so the weights are bit for bit the library's.
fn coefficients(in_size: u32, out_size: u32) -> (Vec<f64>, usize, Vec<(u32, u32)>) {
    if in_size == 0 || out_size == 0 {
        return (Vec::new(), 0, Vec::new());
    }
    let scale = in_size as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    // The bilinear support is 1.
    let filter_radius = filter_scale;
    let window = filter_radius.ceil() as usize * 2 + 1;
    let recip_filter_scale = 1.0 / filter_scale;

    let mut coeffs: Vec<f64> = Vec::with_capacity(window * out_size as usize);
    let mut bounds = Vec::with_capacity(out_size as usize);
    for out_x in 0..out_size {
        let in_center = (out_x as f64 + 0.5) * scale;
        let x_min = (in_center - filter_radius).floor().max(0.) as u32;
        let x_max = (in_center + filter_radius).ceil().min(in_size as f64) as u32;
        let cur_index = coeffs.len();
        let mut ww = 0.0;
        let center = in_center - 0.5;
        let mut bound_start = x_min;
        let mut bound_end = x_max;
        for x in x_min..x_max {
            let w = triangle((x as f64 - center) * recip_filter_scale);
            if x == bound_start && w == 0. {
                bound_start += 1;
            } else {
                coeffs.push(w);
                ww += w;
            }
        }
        for &c in coeffs.iter().rev() {
            if bound_end <= bound_start || c != 0. {
                break;
            }
            bound_end -= 1;
        }
        if ww != 0.0 {
            coeffs[cur_index..].iter_mut().for_each(|w| *w /= ww);
        }
        coeffs.resize(cur_index + window, 0.);
        bounds.push((bound_start, bound_end - bound_start));
    }
    (coeffs, window, bounds)
}

/// `Normalizer16`'s precision: the most fractional bits that keep the largest weight in i16.
fn precision_of(coeffs: &[f64]) -> u32 {
    let max_weight = coeffs.iter().copied().fold(0.0, f64::max);
    let mut precision = 0;
    for cur in 0..PRECISION_BITS {
        precision = cur;
        let next = (max_weight * (1i64 << (cur + 1)) as f64).round() as i64;
        if next >= 1 << MAX_COEFFS_PRECISION {
            break;
        }
    }
    // At least 1 so that the rounding term `1 << (precision - 1)` exists (the library needs 4).
    precision.max(1)
}

/// Both passes on one image with the taps of its size: the kernels' arithmetic on the host.
fn apply(rows: &Taps, cols: &Taps, pixels: &[u8], src_w: usize) -> Vec<u8> {
    let row_len = src_w * 3;
    let (dst_h, dst_w) = (rows.len(), cols.len());
    // fast_image_resize's u8 order: vertical first, at full source width.
    let mut tmp = vec![0u8; dst_h * row_len];
    for (y, tmp_row) in tmp.chunks_exact_mut(row_len.max(1)).enumerate() {
        for (xc, v) in tmp_row.iter_mut().enumerate() {
            *v = rows.convolve(y, |i| pixels[i * row_len + xc]);
        }
    }
    let mut out = vec![0u8; dst_h * dst_w * 3];
    for (i, v) in out.iter_mut().enumerate() {
        let (c, x, y) = (i % 3, i / 3 % dst_w, i / 3 / dst_w);
        *v = cols.convolve(x, |j| tmp[y * row_len + j * 3 + c]);
    }
    out
}

/// Resizes one RGB8 image (`src_w * src_h * 3` bytes) to `dst_w x dst_h` RGB8 with the GPU
/// kernels' arithmetic, which is fast_image_resize's for `FilterType::Bilinear` convolution.
pub fn resize_rgb8(
    pixels: &[u8],
    src_w: u32,
    src_h: u32,
    dst_w: u32,
    dst_h: u32,
) -> DataflowResult<Vec<u8>> {
    check_row(pixels, src_w, src_h).map_err(err)?;
    if dst_w == 0 || dst_h == 0 {
        return Err(err(format!("target size {dst_w}x{dst_h} must be non-zero")));
    }
    let rows = Taps::bilinear(src_h, dst_h);
    let cols = Taps::bilinear(src_w, dst_w);
    Ok(apply(&rows, &cols, pixels, src_w as usize))
}

/// The tensor values the `resize` stage should produce for `images` (all valid), computed with
/// [`resize_rgb8`]; u8 tensors come back as their pixel values in f32.
pub fn reference_tensor(
    config: &ResizeConfig,
    images: &[(Vec<u8>, u32, u32)],
) -> DataflowResult<Vec<f32>> {
    let stage = Resize::new(config.clone())?;
    let mut values = Values::with_capacity(config.dtype, 0);
    for (i, (pixels, w, h)) in images.iter().enumerate() {
        let rgb = resize_rgb8(pixels, *w, *h, config.width, config.height)
            .map_err(|e| err(format!("image {i}: {e}")))?;
        values.push(&rgb, config.layout, stage.lut());
    }
    Ok(as_f32(values))
}

fn as_f32(values: Values) -> Vec<f32> {
    match values {
        Values::F32(v) => v,
        Values::U8(v) => v.into_iter().map(f32::from).collect(),
    }
}

const KERNELS: &str = r#"
// fast_image_resize's u8 fixed point: sum from half a step, shift, clamp.
__device__ __forceinline__ unsigned char clip8(int ss, int precision) {
    int v = ss >> precision;
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Per image: source byte offset, source width, temp byte offset, then for the rows and the
// columns axis: taps offset, window, precision. Taps of an axis of n outputs: n starts,
// n counts, n * window weights.
#define META 9

// Vertical pass (first, as fast_image_resize does for u8): dst_h rows at full source width.
extern "C" __global__ void resize_vertical(const unsigned char* src, unsigned char* tmp,
                                           const long long* meta, const int* taps,
                                           int dst_h, int image_base) {
    const long long* m = meta + (long long)(image_base + blockIdx.y) * META;
    long long row_len = m[1] * 3;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= dst_h * row_len) return;
    int y = (int)(t / row_len);
    long long xc = t % row_len;
    const int* axis = taps + m[3];
    int window = (int)m[4], precision = (int)m[5];
    int start = axis[y], count = axis[dst_h + y];
    const int* w = axis + 2 * (long long)dst_h + (long long)y * window;
    const unsigned char* p = src + m[0] + start * row_len + xc;
    int ss = 1 << (precision - 1);
    for (int j = 0; j < count; ++j) ss += (int)p[j * row_len] * w[j];
    tmp[m[2] + t] = clip8(ss, precision);
}

// Horizontal pass of output element t of one image, t counted in the output layout so that
// neighbouring threads write neighbouring elements. Returns the pixel value, sets *c.
__device__ __forceinline__ unsigned char horizontal(const unsigned char* tmp, const long long* m,
                                                    const int* taps, int dst_w, int dst_h,
                                                    int nchw, int t, int* c) {
    int x, y;
    if (nchw) {
        int plane = dst_w * dst_h;
        *c = t / plane;
        int r = t % plane;
        y = r / dst_w;
        x = r % dst_w;
    } else {
        *c = t % 3;
        int px = t / 3;
        y = px / dst_w;
        x = px % dst_w;
    }
    long long row_len = m[1] * 3;
    const int* axis = taps + m[6];
    int window = (int)m[7], precision = (int)m[8];
    int start = axis[x], count = axis[dst_w + x];
    const int* w = axis + 2 * (long long)dst_w + (long long)x * window;
    const unsigned char* p = tmp + m[2] + y * row_len + start * 3 + *c;
    int ss = 1 << (precision - 1);
    for (int j = 0; j < count; ++j) ss += (int)p[j * 3] * w[j];
    return clip8(ss, precision);
}

extern "C" __global__ void resize_horizontal_f32(const unsigned char* tmp, float* out,
                                                 const long long* meta, const int* taps,
                                                 const float* lut, int dst_w, int dst_h,
                                                 int nchw, int image_base) {
    int image = image_base + blockIdx.y;
    int per_image = dst_w * dst_h * 3;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= per_image) return;
    int c;
    unsigned char p = horizontal(tmp, meta + (long long)image * META, taps, dst_w, dst_h, nchw,
                                 (int)t, &c);
    out[(long long)image * per_image + t] = lut[c * 256 + p];
}

extern "C" __global__ void resize_horizontal_u8(const unsigned char* tmp, unsigned char* out,
                                                const long long* meta, const int* taps,
                                                int dst_w, int dst_h, int nchw, int image_base) {
    int image = image_base + blockIdx.y;
    int per_image = dst_w * dst_h * 3;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= per_image) return;
    int c;
    out[(long long)image * per_image + t] =
        horizontal(tmp, meta + (long long)image * META, taps, dst_w, dst_h, nchw, (int)t, &c);
}
"#;

/// The kernels of [`KERNELS`], by name.
const KERNEL_NAMES: [&str; 3] = [
    "resize_vertical",
    "resize_horizontal_f32",
    "resize_horizontal_u8",
];

/// The stage's kernels, compiled and loaded on its GPU.
const KERNEL_SET: Kernels = Kernels {
    stage: STAGE,
    source: KERNELS,
    names: &KERNEL_NAMES,
};

/// Values per image in the kernels' `meta` array.
const META: usize = 9;
const BLOCK: u32 = 256;
/// Most images one launch covers (its grid's y dimension).
const MAX_GRID_Y: usize = 65_535;
/// Source sizes whose taps stay on the GPU; past this the cache starts over, so a stream of
/// ever-new sizes cannot grow it without bound.
const MAX_CACHED_SIZES: usize = 512;

/// Where one axis's taps lie in the uploaded taps array.
#[derive(Clone, Copy)]
struct Placed {
    offset: i64,
    window: i64,
    precision: i64,
}

/// A device buffer grown to the largest batch seen, then reused.
struct Scratch<D: Device, T>(Option<D::Buf<T>>);

impl<D: Device, T: Elem> Scratch<D, T> {
    fn at_least(&mut self, device: &D, len: usize) -> DataflowResult<&mut D::Buf<T>> {
        let len = len.max(1);
        if self.0.as_ref().is_none_or(|s| device.buf_len(s) < len) {
            // Free the old buffer before allocating its successor.
            self.0 = None;
            self.0 = Some(device.alloc_zeros::<T>(len)?);
        }
        self.0
            .as_mut()
            .ok_or_else(|| err("GPU scratch buffer missing"))
    }
}

/// The resize kernels loaded on one GPU (by default through cudarc; the tests emulate one),
/// with the taps uploaded so far and reusable buffers.
pub(crate) struct CudaResize<D: Device = CudaDevice> {
    device: D,
    lut: D::Buf<f32>,
    layout: Layout,
    dtype: TensorDtype,
    host: Packer,
    /// The GPU copies of the packer's arrays, and the kernels' other buffers.
    taps: Scratch<D, i32>,
    pixels: Scratch<D, u8>,
    tmp: Scratch<D, u8>,
    meta: Scratch<D, i64>,
    out_f32: Scratch<D, f32>,
    out_u8: Scratch<D, u8>,
    /// Most images per launch: [`MAX_GRID_Y`] (the tests lower it, to have launches with
    /// `image_base` > 0 without 65536 images).
    max_grid_y: usize,
}

impl CudaResize {
    /// Compiles the kernels on GPU `ordinal`. `config` and `lut` are the ones [`Resize::new`]
    /// checked and built.
    pub(crate) fn new(config: &ResizeConfig, lut: &Lut, ordinal: usize) -> DataflowResult<Self> {
        // cudarc panics without the driver library or NVRTC: these ask for them first.
        check_gpu(STAGE, ordinal)?;
        let kernels = KERNEL_SET.compile(ordinal)?;
        // Its own stream: workers sharing the GPU then overlap instead of queueing.
        let device = CudaDevice::open(ordinal, &kernels, Stream::Own)?;
        CudaResize::on(device, config, lut)
    }
}

impl<D: Device> CudaResize<D> {
    /// The stage's GPU side on `device`, which has the kernels of [`KERNELS`] loaded.
    fn on(device: D, config: &ResizeConfig, lut: &Lut) -> DataflowResult<Self> {
        let flat_lut: Vec<f32> = lut.iter().flatten().copied().collect();
        Ok(CudaResize {
            lut: device.upload(&flat_lut)?,
            device,
            layout: config.layout,
            dtype: config.dtype,
            host: Packer::new(config.width, config.height),
            taps: Scratch(None),
            pixels: Scratch(None),
            tmp: Scratch(None),
            meta: Scratch(None),
            out_f32: Scratch(None),
            out_u8: Scratch(None),
            max_grid_y: MAX_GRID_Y,
        })
    }

    /// Resizes `images` (each passed [`check_row`]) into the batch's tensor values: one upload
    /// of the pixels, two launches, one download.
    pub(crate) fn run(&mut self, images: &[(&[u8], u32, u32)]) -> DataflowResult<Values> {
        if images.is_empty() {
            return Ok(Values::with_capacity(self.dtype, 0));
        }
        let packed = self.host.pack(images)?;
        let host = &self.host;
        let per_image = 3 * host.dst_w as usize * host.dst_h as usize;
        let device = &self.device;
        if packed.taps_changed || self.taps.0.is_none() {
            let taps = self.taps.at_least(device, host.taps.len())?;
            device.upload_into(&host.taps, taps)?;
        }
        let taps = &*self.taps.at_least(device, host.taps.len())?;
        let pixels = self.pixels.at_least(device, host.pixels.len())?;
        device.upload_into(&host.pixels, pixels)?;
        let meta = self.meta.at_least(device, host.meta.len())?;
        device.upload_into(&host.meta, meta)?;
        let (pixels, meta) = (&*pixels, &*meta);
        let tmp = &*self.tmp.at_least(device, packed.tmp_len)?;

        let blocks = |n: usize| {
            u32::try_from(n.div_ceil(BLOCK as usize)).map_err(|_| {
                err(format!(
                    "{n} values in one image is too many for one launch"
                ))
            })
        };
        let (vertical_blocks, horizontal_blocks) =
            (blocks(packed.max_vertical)?, blocks(per_image)?);
        let as_i32 = |v: usize| {
            i32::try_from(v).map_err(|_| err(format!("{v} does not fit a kernel's int")))
        };
        let (dst_w, dst_h) = (as_i32(host.dst_w as usize)?, as_i32(host.dst_h as usize)?);
        let nchw = i32::from(self.layout == Layout::Nchw);
        let total = images.len() * per_image;
        // Launches of `max_grid_y` images at most: (the first image, their count).
        let max_grid_y = self.max_grid_y.clamp(1, MAX_GRID_Y);
        let launches = (0..images.len())
            .step_by(max_grid_y)
            .map(|base| Ok((as_i32(base)?, (images.len() - base).min(max_grid_y))))
            .collect::<DataflowResult<Vec<_>>>()?;
        let grid = |x: u32, images: usize| LaunchConfig {
            grid_dim: (x, images as u32, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };

        for &(image_base, chunk) in &launches {
            let args = [
                Arg::U8(pixels),
                Arg::U8(tmp),
                Arg::I64(meta),
                Arg::I32(taps),
                Arg::Int(dst_h),
                Arg::Int(image_base),
            ];
            // SAFETY: the kernel reads `meta` entries `image_base..image_base + chunk` (all
            // written above) and through them in-bounds pixels, taps and temp rows: every
            // offset and size there was computed from the buffers just uploaded or sized.
            unsafe { device.launch("resize_vertical", grid(vertical_blocks, chunk), &args) }?;
        }

        let values = match self.dtype {
            TensorDtype::F32 => {
                let out = &*self.out_f32.at_least(device, total)?;
                for &(image_base, chunk) in &launches {
                    let args = [
                        Arg::U8(tmp),
                        Arg::F32(out),
                        Arg::I64(meta),
                        Arg::I32(taps),
                        Arg::F32(&self.lut),
                        Arg::Int(dst_w),
                        Arg::Int(dst_h),
                        Arg::Int(nchw),
                        Arg::Int(image_base),
                    ];
                    let cfg = grid(horizontal_blocks, chunk);
                    // SAFETY: as for the vertical pass; `out` holds `images * per_image`
                    // values and `lut` 3 * 256.
                    unsafe { device.launch("resize_horizontal_f32", cfg, &args) }?;
                }
                Values::F32(device.download(out, total)?)
            }
            TensorDtype::U8 => {
                let out = &*self.out_u8.at_least(device, total)?;
                for &(image_base, chunk) in &launches {
                    let args = [
                        Arg::U8(tmp),
                        Arg::U8(out),
                        Arg::I64(meta),
                        Arg::I32(taps),
                        Arg::Int(dst_w),
                        Arg::Int(dst_h),
                        Arg::Int(nchw),
                        Arg::Int(image_base),
                    ];
                    let cfg = grid(horizontal_blocks, chunk);
                    // SAFETY: as for the vertical pass; `out` holds `images * per_image` bytes.
                    unsafe { device.launch("resize_horizontal_u8", cfg, &args) }?;
                }
                Values::U8(device.download(out, total)?)
            }
        };
        // The staging buffers are rewritten by the next batch: let every copy finish.
        device.synchronize()?;
        Ok(values)
    }
}

/// The host side of a batch: the arrays the kernels read, rebuilt per batch in reused
/// buffers, and the taps of every source size seen so far.
struct Packer {
    dst_w: u32,
    dst_h: u32,
    /// Taps of each source height (rows axis) and width (columns axis): each depends on one
    /// source dimension only, so sizes sharing a width share its column taps.
    rows: HashMap<u32, Placed>,
    cols: HashMap<u32, Placed>,
    /// Every cached axis's taps, back to back.
    taps: Vec<i32>,
    /// The batch's pixels back to back.
    pixels: Vec<u8>,
    /// [`META`] values per image (see the kernels).
    meta: Vec<i64>,
}

/// What [`Packer::pack`] says about the batch it packed.
struct Packed {
    /// Bytes of the vertical pass's output, all images.
    tmp_len: usize,
    /// Largest vertical-pass output of one image.
    max_vertical: usize,
    /// Whether `taps` changed (and must be uploaded again).
    taps_changed: bool,
}

impl Packer {
    fn new(dst_w: u32, dst_h: u32) -> Packer {
        Packer {
            dst_w,
            dst_h,
            rows: HashMap::new(),
            cols: HashMap::new(),
            taps: Vec::new(),
            pixels: Vec::new(),
            meta: Vec::new(),
        }
    }

    fn pack(&mut self, images: &[(&[u8], u32, u32)]) -> DataflowResult<Packed> {
        let mut taps_changed = false;
        if self.rows.len() + self.cols.len() > MAX_CACHED_SIZES {
            self.rows.clear();
            self.cols.clear();
            self.taps.clear();
            taps_changed = true;
        }
        let taps_before = self.taps.len();
        self.pixels.clear();
        self.meta.clear();
        let (mut tmp_len, mut max_vertical) = (0usize, 0usize);
        for &(pixels, w, h) in images {
            check_row(pixels, w, h).map_err(err)?;
            let rows = place(&mut self.rows, &mut self.taps, h, self.dst_h);
            let cols = place(&mut self.cols, &mut self.taps, w, self.dst_w);
            let entry: [i64; META] = [
                self.pixels.len() as i64,
                i64::from(w),
                tmp_len as i64,
                rows.offset,
                rows.window,
                rows.precision,
                cols.offset,
                cols.window,
                cols.precision,
            ];
            self.meta.extend(entry);
            self.pixels.extend_from_slice(pixels);
            let vertical = self.dst_h as usize * w as usize * 3;
            tmp_len += vertical;
            max_vertical = max_vertical.max(vertical);
        }
        Ok(Packed {
            tmp_len,
            max_vertical,
            taps_changed: taps_changed || self.taps.len() != taps_before,
        })
    }
}

/// The cached taps of one axis for source size `size`, computing and appending them if new.
fn place(cache: &mut HashMap<u32, Placed>, all: &mut Vec<i32>, size: u32, target: u32) -> Placed {
    *cache.entry(size).or_insert_with(|| {
        let taps = Taps::bilinear(size, target);
        Placed {
            offset: taps.append_to(all) as i64,
            window: taps.window as i64,
            precision: i64::from(taps.precision),
        }
    })
}

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
fn image_batch(
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
fn timed(
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

fn max_diff(a: &[f32], b: &[f32]) -> DataflowResult<f32> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Decode, DecodeConfig};
    use crate::model::Device;
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt32Type;
    use arrow_array::Array;
    use std::path::Path;

    fn config(width: u32, height: u32, layout: Layout, dtype: TensorDtype) -> ResizeConfig {
        let f32_only = |v: [f32; 3]| (dtype == TensorDtype::F32).then_some(v);
        ResizeConfig {
            input: "pixels".to_string(),
            output: "tensor".to_string(),
            width,
            height,
            layout,
            dtype,
            mean: f32_only([0.485, 0.456, 0.406]),
            std: f32_only([0.229, 0.224, 0.225]),
            keep_input: false,
            device: Device::Cpu,
        }
    }

    /// The CPU stage's tensor (as f32) for `images`.
    fn cpu_stage(config: &ResizeConfig, images: &[(Vec<u8>, u32, u32)]) -> Vec<f32> {
        let mut stage = Resize::new(config.clone()).unwrap();
        let batch = image_batch(config, images).unwrap();
        let (values, _) = timed_once(&mut stage, config, &batch);
        values
    }

    fn timed_once(
        stage: &mut Resize,
        config: &ResizeConfig,
        batch: &RecordBatch,
    ) -> (Vec<f32>, usize) {
        let out = stage.process_batch(batch).unwrap();
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
        let column = out.records.column_by_name(&config.output).unwrap();
        let values = match config.dtype {
            TensorDtype::F32 => tensor_values::<Float32Type>(column.as_ref())
                .unwrap()
                .to_vec(),
            TensorDtype::U8 => tensor_values::<UInt8Type>(column.as_ref())
                .unwrap()
                .iter()
                .map(|&p| f32::from(p))
                .collect(),
        };
        (values, out.records.num_rows())
    }

    /// Deterministic noise with some smooth structure, so both edges and gradients are hit.
    fn synthetic(w: u32, h: u32, seed: u32) -> (Vec<u8>, u32, u32) {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        let mut px = Vec::with_capacity(w as usize * h as usize * 3);
        for y in 0..h {
            for x in 0..w {
                for c in 0..3u32 {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let smooth = (x * 7 + y * 3 + c * 50) % 256;
                    let v = if (x + y + c) % 5 == 0 {
                        state >> 24
                    } else {
                        smooth
                    };
                    px.push(v as u8);
                }
            }
        }
        (px, w, h)
    }

    /// Decoded bundled frames (640x272 JPEGs), a spread of the sequence.
    fn frames() -> Vec<(Vec<u8>, u32, u32)> {
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/frames/bikes");
        let shared = Path::new("/work/shared/assets/frames/bikes");
        let dir = if local.exists() {
            local
        } else {
            shared.to_path_buf()
        };
        let jpegs: Vec<Vec<u8>> = [0, 61, 125, 190, 249]
            .iter()
            .map(|i| std::fs::read(dir.join(format!("{i:04}.jpg"))).unwrap())
            .collect();
        let batch = RecordBatch::try_from_iter(vec![(
            "bytes",
            Arc::new(BinaryArray::from_iter_values(jpegs.iter())) as ArrayRef,
        )])
        .unwrap();
        let out = Decode::new(DecodeConfig::default())
            .process_batch(&batch)
            .unwrap();
        assert!(out.rejected.is_empty());
        let pixels = out
            .records
            .column_by_name("pixels")
            .unwrap()
            .as_binary::<i32>();
        let size = |name: &str| {
            out.records
                .column_by_name(name)
                .unwrap()
                .as_primitive::<UInt32Type>()
                .clone()
        };
        let (widths, heights) = (size(WIDTH_COLUMN), size(HEIGHT_COLUMN));
        (0..pixels.len())
            .map(|i| (pixels.value(i).to_vec(), widths.value(i), heights.value(i)))
            .collect()
    }

    /// Largest difference between the reference and the CPU stage, in tensor units.
    fn reference_vs_stage(config: &ResizeConfig, images: &[(Vec<u8>, u32, u32)]) -> f32 {
        let reference = reference_tensor(config, images).unwrap();
        let stage = cpu_stage(config, images);
        max_diff(&reference, &stage).unwrap()
    }

    #[test]
    fn taps_of_a_halving_match_the_hand_computed_ones() {
        // 4 → 2: support 2 source pixels around centres 1.0 and 3.0; weights 0.25, 0.75,
        // 0.75 (and mirrored) over 1.75, in the largest precision that keeps 0.43 in i16.
        let taps = Taps::bilinear(4, 2);
        assert_eq!(taps.starts, [0, 1]);
        assert_eq!(taps.counts, [3, 3]);
        assert_eq!(taps.precision, 16);
        let unit = f64::from(1 << 16);
        let w = |v: f64| (v / 1.75 * unit).round() as i32;
        assert_eq!(
            taps.weights,
            [w(0.75), w(0.75), w(0.25), w(0.25), w(0.75), w(0.75)]
        );
        // The same size is the identity.
        let same = Taps::bilinear(5, 5);
        assert_eq!(same.starts, [0, 1, 2, 3, 4]);
        assert_eq!(same.counts, [1; 5]);
        assert!(same.weights.iter().all(|&w| w == 1 << same.precision));
        assert!(Taps::bilinear(0, 3).is_empty());
    }

    #[test]
    fn reference_matches_fast_image_resize_on_frames() {
        let frames = frames();
        assert_eq!((frames[0].1, frames[0].2), (640, 272));
        let cases = [
            config(224, 224, Layout::Nchw, TensorDtype::F32),
            config(320, 180, Layout::Nhwc, TensorDtype::F32),
            config(97, 61, Layout::Nchw, TensorDtype::U8),
            config(1000, 400, Layout::Nhwc, TensorDtype::U8),
        ];
        for c in &cases {
            let diff = reference_vs_stage(c, &frames);
            // Exact: same taps, same fixed point, same pass order as fast_image_resize.
            assert_eq!(
                diff, 0.0,
                "{}x{} {:?} {:?}",
                c.width, c.height, c.layout, c.dtype
            );
        }
    }

    /// (source, target): down, up, mixed per axis, one axis unchanged, odd and tiny sizes.
    const SYNTHETIC_SIZES: [((u32, u32), (u32, u32)); 12] = [
        ((1, 1), (3, 5)),
        ((2, 2), (1, 1)),
        ((7, 3), (2, 9)),
        ((17, 13), (4, 4)),
        ((33, 31), (64, 62)),
        ((3, 200), (7, 7)),
        ((199, 2), (33, 1)),
        ((64, 48), (64, 17)),
        ((50, 40), (13, 40)),
        ((31, 31), (31, 31)),
        ((1280, 3), (5, 3)),
        ((101, 77), (224, 224)),
    ];

    #[test]
    fn reference_matches_fast_image_resize_on_synthetic_sizes() {
        let sizes = SYNTHETIC_SIZES;
        for (i, ((sw, sh), (dw, dh))) in sizes.into_iter().enumerate() {
            let images = vec![
                synthetic(sw, sh, i as u32),
                synthetic(sw, sh, 100 + i as u32),
            ];
            for layout in [Layout::Nchw, Layout::Nhwc] {
                for dtype in [TensorDtype::F32, TensorDtype::U8] {
                    let c = config(dw, dh, layout, dtype);
                    let diff = reference_vs_stage(&c, &images);
                    assert_eq!(diff, 0.0, "{sw}x{sh} -> {dw}x{dh} {layout:?} {dtype:?}");
                }
            }
        }
        // Rows of different sizes in one batch.
        let mixed = vec![
            synthetic(40, 30, 1),
            synthetic(9, 70, 2),
            synthetic(300, 5, 3),
        ];
        let c = config(16, 12, Layout::Nchw, TensorDtype::F32);
        assert_eq!(reference_vs_stage(&c, &mixed), 0.0);
    }

    #[test]
    fn resize_rgb8_checks_its_input() {
        assert!(resize_rgb8(&[0; 5], 1, 2, 3, 3).is_err());
        assert!(resize_rgb8(&[0; 6], 1, 2, 0, 3).is_err());
        assert_eq!(resize_rgb8(&[9; 6], 1, 2, 2, 1).unwrap(), [9; 6]);
    }

    #[test]
    fn on_gpu_fails_cleanly_without_that_gpu() {
        // No machine has GPU usize::MAX; without CUDA at all this must not panic either.
        let c = config(8, 8, Layout::Nchw, TensorDtype::F32);
        match Resize::on_gpu(c.clone(), usize::MAX) {
            Err(DataflowError::Config(msg)) => assert!(msg.contains("cuda:"), "{msg}"),
            Err(other) => panic!("expected a config error, got {other}"),
            Ok(_) => panic!("a stage on a GPU that does not exist"),
        }
        assert!(matches!(
            compare_on_gpu(&c, &[synthetic(4, 4, 0)], usize::MAX),
            Err(DataflowError::Config(_))
        ));
        assert!(matches!(
            compare_on_gpu(&c, &[(vec![1, 2], 4, 4)], 0),
            Err(DataflowError::Config(_))
        ));
    }

    #[test]
    fn packer_lays_images_back_to_back_and_keeps_taps() {
        let images = [synthetic(5, 4, 1), synthetic(7, 4, 2), synthetic(5, 4, 3)];
        let refs: Vec<(&[u8], u32, u32)> =
            images.iter().map(|i| (i.0.as_slice(), i.1, i.2)).collect();
        let mut packer = Packer::new(3, 2);
        let packed = packer.pack(&refs).unwrap();
        assert!(packed.taps_changed);
        assert_eq!(packed.tmp_len, 2 * 3 * (5 + 7 + 5));
        assert_eq!(packed.max_vertical, 2 * 3 * 7);
        assert_eq!(packer.pixels.len(), 3 * (20 + 28 + 20));
        let meta: Vec<&[i64]> = packer.meta.chunks(META).collect();
        // Source and temp offsets, widths; one height and two widths: three cached axes.
        assert_eq!(
            meta.iter().map(|m| [m[0], m[1], m[2]]).collect::<Vec<_>>(),
            [[0, 5, 0], [60, 7, 30], [144, 5, 72]]
        );
        assert_eq!(meta[0][3..], meta[2][3..]);
        assert_eq!(meta[0][3..6], meta[1][3..6]);
        assert_eq!((packer.rows.len(), packer.cols.len()), (1, 2));
        // The same sizes again: nothing new to upload.
        assert!(!packer.pack(&refs).unwrap().taps_changed);
        assert!(packer.pack(&[(&[0u8; 5], 1, 1)]).is_err());
    }

    /// NVRTC needs no GPU: wherever its library is installed, the kernels must compile.
    #[test]
    fn kernels_compile_where_nvrtc_is_present() {
        // SAFETY: only tries to dlopen the NVRTC library by its usual names.
        crate::gpu::expect_nvrtc_where_asked();
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            // Without NVRTC the GPU stage must refuse to build, with a reason, not panic.
            let c = config(8, 8, Layout::Nchw, TensorDtype::F32);
            match Resize::on_gpu(c, 0) {
                Err(DataflowError::Config(msg)) => {
                    assert!(msg.contains("cuda:0") || msg.contains("NVRTC"), "{msg}")
                }
                Err(other) => panic!("expected a config error, got {other}"),
                Ok(_) => panic!("a GPU resize stage without NVRTC"),
            }
            return;
        }
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).unwrap().to_src();
        for name in KERNEL_NAMES {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
        }
    }

    /// Where no GPU is usable, checks that the stage says why instead.
    #[test]
    fn gpu_matches_the_reference_when_a_gpu_is_present() {
        if let Err(why) = crate::gpu::discover() {
            let c = config(8, 8, Layout::Nchw, TensorDtype::F32);
            match Resize::on_gpu(c, 0) {
                Err(DataflowError::Config(msg)) => assert!(msg.contains(&why), "{msg}"),
                Err(other) => panic!("expected a config error, got {other}"),
                Ok(_) => panic!("a GPU resize stage without a GPU"),
            }
            return;
        }
        let mut images = frames();
        images.extend([synthetic(33, 31, 7), synthetic(3, 200, 8)]);
        for (layout, dtype) in [
            (Layout::Nchw, TensorDtype::F32),
            (Layout::Nhwc, TensorDtype::U8),
        ] {
            let c = config(224, 160, layout, dtype);
            let check = compare_on_gpu(&c, &images, 0).unwrap();
            assert_eq!(check.max_diff_vs_reference, 0.0, "{check:?}");
            assert_eq!(check.max_diff_vs_cpu_stage, 0.0, "{check:?}");
        }
        // Bad rows still go to the dead letters, with the same schema out.
        let c = config(16, 16, Layout::Nchw, TensorDtype::F32);
        let good = synthetic(20, 10, 1);
        let rows = vec![
            (vec![1, 2, 3], 4, 2),
            good.clone(),
            (Vec::new(), 0, 0),
            good,
        ];
        let batch = image_batch(&c, &rows).unwrap();
        let mut gpu = Resize::on_gpu(c.clone(), 0).unwrap();
        let mut cpu = Resize::new(c).unwrap();
        let (g, c) = (
            gpu.process_batch(&batch).unwrap(),
            cpu.process_batch(&batch).unwrap(),
        );
        assert_eq!(g.records.schema(), c.records.schema());
        assert_eq!(g.records.num_rows(), 2);
        let reasons = |o: &riffle_dataflow::StageOutput| -> Vec<String> {
            o.rejected.iter().map(|d| d.reason.clone()).collect()
        };
        assert_eq!(reasons(&g), reasons(&c));
        assert_eq!(g.records.column(2).to_data(), c.records.column(2).to_data());
    }

    // The kernels executed on the CPU (crate::kernel_emulation): `KERNELS` compiled by g++ and
    // launched by `CudaResize` itself on an emulated `Device` (`crate::cuda_device::emulated`),
    // compared with `reference_tensor` (exactly).

    use crate::cuda_device::emulated::Emulated;
    use crate::kernel_emulation::Emulator;

    /// `CudaResize::new` on an emulated GPU, with the `Resize` stage's table as
    /// `Resize::on_gpu` passes it, and at most `max_grid_y` images per launch. New buffers are
    /// poisoned: they stand for what an earlier batch left in a reused buffer.
    fn emulated_resize<'e>(
        emulator: &'e Emulator,
        config: &ResizeConfig,
        max_grid_y: usize,
    ) -> CudaResize<Emulated<'e>> {
        let stage = Resize::new(config.clone()).unwrap();
        let device = Emulated::new(emulator, STAGE).poisoned();
        let mut resize = CudaResize::on(device, config, stage.lut()).unwrap();
        resize.max_grid_y = max_grid_y;
        resize
    }

    /// The emulated kernels' tensor for `images` against [`reference_tensor`]: `Err` says
    /// where they first differ.
    fn emulated_vs_reference(
        resize: &mut CudaResize<Emulated>,
        config: &ResizeConfig,
        images: &[(Vec<u8>, u32, u32)],
    ) -> Result<(), String> {
        let what = format!(
            "{}x{} {:?} {:?}, {} image(s), {} per launch",
            config.width,
            config.height,
            config.layout,
            config.dtype,
            images.len(),
            resize.max_grid_y
        );
        let refs: Vec<(&[u8], u32, u32)> =
            images.iter().map(|i| (i.0.as_slice(), i.1, i.2)).collect();
        let got = as_f32(resize.run(&refs).map_err(|e| format!("{what}: {e}"))?);
        let expected = reference_tensor(config, images).unwrap();
        if got.len() != expected.len() {
            return Err(format!(
                "{what}: {} values, expected {}",
                got.len(),
                expected.len()
            ));
        }
        // Exact: the kernels do the reference's integer arithmetic and table look-up.
        match got.iter().zip(&expected).position(|(g, e)| g != e) {
            None => Ok(()),
            Some(i) => {
                let per_image = 3 * config.width as usize * config.height as usize;
                Err(format!(
                    "{what}: image {}, element {} is {}, expected {}",
                    i / per_image,
                    i % per_image,
                    got[i],
                    expected[i]
                ))
            }
        }
    }

    fn emulated_check(
        emulator: &Emulator,
        config: &ResizeConfig,
        images: &[(Vec<u8>, u32, u32)],
        max_grid_y: usize,
    ) -> Result<(), String> {
        let mut resize = emulated_resize(emulator, config, max_grid_y);
        emulated_vs_reference(&mut resize, config, images)
    }

    const LAYOUTS_AND_DTYPES: [(Layout, TensorDtype); 4] = [
        (Layout::Nchw, TensorDtype::F32),
        (Layout::Nhwc, TensorDtype::F32),
        (Layout::Nchw, TensorDtype::U8),
        (Layout::Nhwc, TensorDtype::U8),
    ];

    #[test]
    fn emulated_kernels_match_the_reference_on_frames() {
        let emulator = Emulator::shared(KERNELS, &KERNEL_NAMES);
        let frames = frames();
        let cases = [
            config(224, 224, Layout::Nchw, TensorDtype::F32),
            config(320, 180, Layout::Nhwc, TensorDtype::F32),
            config(97, 61, Layout::Nchw, TensorDtype::U8),
            config(1000, 400, Layout::Nhwc, TensorDtype::U8),
            config(224, 160, Layout::Nhwc, TensorDtype::F32),
            config(224, 160, Layout::Nchw, TensorDtype::U8),
        ];
        for c in &cases {
            emulated_check(&emulator, c, &frames, MAX_GRID_Y).unwrap();
        }
        // One image per launch: every launch but the first has `image_base` > 0.
        let c = config(61, 97, Layout::Nchw, TensorDtype::F32);
        emulated_check(&emulator, &c, &frames, 1).unwrap();
    }

    #[test]
    fn emulated_kernels_match_the_reference_on_synthetic_sizes() {
        let emulator = Emulator::shared(KERNELS, &KERNEL_NAMES);
        let sizes = SYNTHETIC_SIZES;
        for (i, ((sw, sh), (dw, dh))) in sizes.into_iter().enumerate() {
            let images = vec![
                synthetic(sw, sh, i as u32),
                synthetic(sw, sh, 100 + i as u32),
            ];
            for (k, (layout, dtype)) in LAYOUTS_AND_DTYPES.into_iter().enumerate() {
                let c = config(dw, dh, layout, dtype);
                // Half the cases one image per launch.
                let per_launch = if (i + k) % 2 == 0 { MAX_GRID_Y } else { 1 };
                emulated_check(&emulator, &c, &images, per_launch).unwrap();
            }
        }
        // Sizes mixed in one batch (per-image offsets and taps), in launches of 2 images.
        let mixed = vec![
            synthetic(40, 30, 1),
            synthetic(9, 70, 2),
            synthetic(300, 5, 3),
            synthetic(40, 7, 4),
            synthetic(1, 1, 5),
        ];
        for (layout, dtype) in LAYOUTS_AND_DTYPES {
            for per_launch in [MAX_GRID_Y, 2] {
                let c = config(16, 12, layout, dtype);
                emulated_check(&emulator, &c, &mixed, per_launch).unwrap();
            }
        }
    }

    /// One stage over successive batches: buffers grown then reused with stale contents,
    /// taps cached, appended to, and dropped when [`MAX_CACHED_SIZES`] is passed.
    #[test]
    fn emulated_kernels_match_the_reference_batch_after_batch() {
        let emulator = Emulator::shared(KERNELS, &KERNEL_NAMES);
        let first = vec![
            synthetic(64, 48, 1),
            synthetic(33, 31, 2),
            synthetic(64, 48, 3),
        ];
        // More than MAX_CACHED_SIZES source widths and heights: the next batch starts over.
        let many: Vec<(Vec<u8>, u32, u32)> = (1..=260u32)
            .map(|k| synthetic(k, 1, k))
            .chain((2..=260u32).map(|k| synthetic(1, k, k)))
            .collect();
        let batches = [
            first.clone(),
            vec![synthetic(5, 4, 4)],
            vec![synthetic(33, 31, 5), synthetic(70, 9, 6)],
            many,
            first,
            vec![synthetic(200, 150, 7)],
        ];
        for (layout, dtype) in LAYOUTS_AND_DTYPES {
            let c = config(24, 18, layout, dtype);
            let mut resize = emulated_resize(&emulator, &c, MAX_GRID_Y);
            for (i, batch) in batches.iter().enumerate() {
                emulated_vs_reference(&mut resize, &c, batch)
                    .unwrap_or_else(|e| panic!("batch {i}: {e}"));
            }
            assert!(resize.host.rows.len() + resize.host.cols.len() <= MAX_CACHED_SIZES);
        }
    }

    /// Each test above fails for a wrong index, stride or bound: every mutant of `KERNELS`
    /// below makes some case differ from the reference or fault (each change is caught by the
    /// cases of the dtype given with it; changes to different horizontal kernels share one
    /// compile, as a case launches only one of them).
    #[test]
    fn emulated_tests_catch_broken_resize_kernels() {
        let images = vec![
            synthetic(17, 13, 1),
            synthetic(7, 3, 2),
            synthetic(33, 31, 3),
        ];
        let mutants: [&[(&str, &str, TensorDtype)]; 3] = [
            // The vertical pass stepping by a pixel instead of a row.
            &[(
                "ss += (int)p[j * row_len] * w[j];",
                "ss += (int)p[j * 3] * w[j];",
                TensorDtype::U8,
            )],
            // The channel's table ignored; the launch's first image taken as the batch's.
            &[
                ("lut[c * 256 + p]", "lut[p]", TensorDtype::F32),
                (
                    "out[(long long)image * per_image + t] =\n        horizontal(",
                    "out[(long long)blockIdx.y * per_image + t] =\n        horizontal(",
                    TensorDtype::U8,
                ),
            ],
            // Threads past an image's rows writing into the next image's.
            &[(
                "if (t >= dst_h * row_len) return;",
                "if (t >= dst_h * row_len + 3) return;",
                TensorDtype::F32,
            )],
        ];
        for mutations in mutants {
            let mut source = KERNELS.to_string();
            for (from, to, _) in mutations {
                assert_eq!(
                    source.matches(from).count(),
                    1,
                    "`{from}` not in KERNELS once"
                );
                source = source.replace(from, to);
            }
            let mutant = Emulator::new(&source, &KERNEL_NAMES);
            for (from, to, dtype) in mutations {
                let caught = [Layout::Nchw, Layout::Nhwc].into_iter().any(|layout| {
                    let c = config(9, 7, layout, *dtype);
                    emulated_check(&mutant, &c, &images, 2).is_err()
                });
                assert!(caught, "replacing `{from}` by `{to}` went unnoticed");
            }
        }
    }
}
