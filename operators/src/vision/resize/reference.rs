//! The GPU resize's arithmetic on the host: fast_image_resize's bilinear taps, fixed-point
//! weights and rounding, pass by pass. The unit tests hold it to fast_image_resize, and
//! [`super::check::compare_on_gpu`] (`riffle gpu-check`) holds the kernels to it.

use riffle_dataflow::{DataflowError, DataflowResult};

use super::{check_row, Resize, ResizeConfig, Values, STAGE};

pub(super) fn err(message: impl Into<String>) -> DataflowError {
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
    #[allow(
        clippy::indexing_slicing,
        reason = "`out` < self.len() (`apply` loops over the output size), and `bilinear` gives \
                  each output index `window` weights and a count of at most `window`"
    )]
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
    pub(super) fn append_to(&self, out: &mut Vec<i32>) -> usize {
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
            coeffs.iter_mut().skip(cur_index).for_each(|w| *w /= ww);
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
#[allow(
    clippy::indexing_slicing,
    reason = "`resize_rgb8` checked that `pixels` holds src_w·src_h·3 bytes and built the taps \
              for those sizes, so a tap reads a source row < src_h or a column < src_w; `tmp` \
              holds dst_h rows of `row_len` bytes"
)]
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

pub(super) fn as_f32(values: Values) -> Vec<f32> {
    match values {
        Values::F32(v) => v,
        Values::U8(v) => v.into_iter().map(f32::from).collect(),
    }
}
