//! The `resize` stage on a CUDA GPU.
//!
//! Two NVRTC kernels (`gpu/kernels/resize.cu` in riffle-gpu) redo fast_image_resize's bilinear
//! convolution of RGB8 images with its own integer arithmetic: the same taps
//! ([`super::reference::Taps::bilinear`]), the same fixed-point weights and rounding, the same
//! pass order (vertical first for u8, each pass rounding to u8). The second kernel then maps each
//! pixel through the CPU stage's normalisation table and writes the tensor in its layout, so the
//! GPU path gives the CPU stage's values exactly, not approximately.
//! [`super::reference::resize_rgb8`] is the kernels' arithmetic on the host.

use std::collections::HashMap;

use cudarc::driver::LaunchConfig;
use riffle_dataflow::DataflowResult;
use riffle_gpu::{check_gpu, Arg, CudaDevice, Elem, GpuDevice, Kernels, Stream};

use super::reference::{err, Taps};
use super::{check_row, Layout, Lut, ResizeConfig, TensorDtype, Values, STAGE};
use crate::gpu_error;

/// The stage's kernels (`gpu/kernels/resize.cu`), compiled and loaded on its GPU.
const KERNEL_SET: Kernels = riffle_gpu::kernels::RESIZE;

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
struct Scratch<D: GpuDevice, T>(Option<D::Buf<T>>);

impl<D: GpuDevice, T: Elem> Scratch<D, T> {
    fn at_least(&mut self, device: &D, len: usize) -> DataflowResult<&mut D::Buf<T>> {
        let len = len.max(1);
        if self.0.as_ref().is_none_or(|s| device.buf_len(s) < len) {
            // Free the old buffer before allocating its successor.
            self.0 = None;
            self.0 = Some(device.alloc_zeros::<T>(len).map_err(gpu_error)?);
        }
        self.0
            .as_mut()
            .ok_or_else(|| err("GPU scratch buffer missing"))
    }

    /// `values` copied into the buffer, grown to hold them first.
    fn upload(&mut self, device: &D, values: &[T]) -> DataflowResult<&D::Buf<T>> {
        let buf = self.at_least(device, values.len())?;
        device.upload_into(values, buf).map_err(gpu_error)?;
        Ok(buf)
    }
}

/// The resize kernels loaded on one GPU (by default through cudarc; the tests emulate one),
/// with the taps uploaded so far and reusable buffers.
pub(crate) struct CudaResize<D: GpuDevice = CudaDevice> {
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
        check_gpu(STAGE, ordinal).map_err(gpu_error)?;
        let kernels = KERNEL_SET.compile(ordinal).map_err(gpu_error)?;
        // Its own stream: workers sharing the GPU then overlap instead of queueing.
        let device = CudaDevice::open(ordinal, &kernels, Stream::Own).map_err(gpu_error)?;
        CudaResize::on(device, config, lut)
    }
}

impl<D: GpuDevice> CudaResize<D> {
    /// The stage's GPU side on `device`, which has the kernels of [`KERNEL_SET`] loaded.
    fn on(device: D, config: &ResizeConfig, lut: &Lut) -> DataflowResult<Self> {
        let flat_lut: Vec<f32> = lut.iter().flatten().copied().collect();
        Ok(CudaResize {
            lut: device.upload(&flat_lut).map_err(gpu_error)?,
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
        let device = &self.device;
        let taps = if packed.taps_changed || self.taps.0.is_none() {
            self.taps.upload(device, &host.taps)?
        } else {
            &*self.taps.at_least(device, host.taps.len())?
        };
        let pixels = self.pixels.upload(device, &host.pixels)?;
        let meta = self.meta.upload(device, &host.meta)?;
        let tmp = &*self.tmp.at_least(device, packed.tmp_len)?;
        let batch = Batch {
            device,
            pixels,
            tmp,
            meta,
            taps,
            plan: Plan::new(host, &packed, images.len(), self.layout, self.max_grid_y)?,
        };
        batch.vertical()?;

        let total = images.len() * batch.plan.per_image;
        let values = match self.dtype {
            TensorDtype::F32 => {
                let out = &*self.out_f32.at_least(device, total)?;
                batch.horizontal_f32(out, &self.lut)?;
                Values::F32(device.download(out, total).map_err(gpu_error)?)
            }
            TensorDtype::U8 => {
                let out = &*self.out_u8.at_least(device, total)?;
                batch.horizontal_u8(out)?;
                Values::U8(device.download(out, total).map_err(gpu_error)?)
            }
        };
        // The staging buffers are rewritten by the next batch: let every copy finish.
        device.synchronize().map_err(gpu_error)?;
        Ok(values)
    }
}

/// How one batch's kernels are launched: their grids and `int` arguments.
struct Plan {
    /// Values of one output image.
    per_image: usize,
    vertical_blocks: u32,
    horizontal_blocks: u32,
    dst_w: i32,
    dst_h: i32,
    nchw: i32,
    /// Launches of `max_grid_y` images at most: (the first image, their count).
    launches: Vec<(i32, usize)>,
}

impl Plan {
    fn new(
        host: &Packer,
        packed: &Packed,
        images: usize,
        layout: Layout,
        max_grid_y: usize,
    ) -> DataflowResult<Plan> {
        let per_image = 3 * host.dst_w as usize * host.dst_h as usize;
        let blocks = |n: usize| {
            u32::try_from(n.div_ceil(BLOCK as usize)).map_err(|_| {
                err(format!(
                    "{n} values in one image is too many for one launch"
                ))
            })
        };
        let (vertical_blocks, horizontal_blocks) =
            (blocks(packed.max_vertical)?, blocks(per_image)?);
        let (dst_w, dst_h) = (as_i32(host.dst_w as usize)?, as_i32(host.dst_h as usize)?);
        let max_grid_y = max_grid_y.clamp(1, MAX_GRID_Y);
        let launches = (0..images)
            .step_by(max_grid_y)
            .map(|base| Ok((as_i32(base)?, (images - base).min(max_grid_y))))
            .collect::<DataflowResult<Vec<_>>>()?;
        Ok(Plan {
            per_image,
            vertical_blocks,
            horizontal_blocks,
            dst_w,
            dst_h,
            nchw: i32::from(layout == Layout::Nchw),
            launches,
        })
    }
}

/// `v` as a kernel's `int` argument.
fn as_i32(v: usize) -> DataflowResult<i32> {
    i32::try_from(v).map_err(|_| err(format!("{v} does not fit a kernel's int")))
}

/// The grid of a launch over `images` images, `x` blocks each.
fn grid(x: u32, images: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, images as u32, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One batch on the device: its buffers, uploaded or sized, and its launch plan.
struct Batch<'a, D: GpuDevice> {
    device: &'a D,
    pixels: &'a D::Buf<u8>,
    tmp: &'a D::Buf<u8>,
    meta: &'a D::Buf<i64>,
    taps: &'a D::Buf<i32>,
    plan: Plan,
}

impl<D: GpuDevice> Batch<'_, D> {
    /// The vertical pass: each image's pixels into its rows of `tmp`.
    fn vertical(&self) -> DataflowResult<()> {
        let plan = &self.plan;
        for &(image_base, chunk) in &plan.launches {
            let args = [
                Arg::U8(self.pixels),
                Arg::U8(self.tmp),
                Arg::I64(self.meta),
                Arg::I32(self.taps),
                Arg::Int(plan.dst_h),
                Arg::Int(image_base),
            ];
            let cfg = grid(plan.vertical_blocks, chunk);
            // SAFETY: the kernel reads `meta` entries `image_base..image_base + chunk` (all
            // written above) and through them in-bounds pixels, taps and temp rows: every
            // offset and size there was computed from the buffers just uploaded or sized.
            unsafe { self.device.launch("resize_vertical", cfg, &args) }.map_err(gpu_error)?;
        }
        Ok(())
    }

    /// The horizontal pass into float values, normalised through `lut`.
    fn horizontal_f32(&self, out: &D::Buf<f32>, lut: &D::Buf<f32>) -> DataflowResult<()> {
        let plan = &self.plan;
        for &(image_base, chunk) in &plan.launches {
            let args = [
                Arg::U8(self.tmp),
                Arg::F32(out),
                Arg::I64(self.meta),
                Arg::I32(self.taps),
                Arg::F32(lut),
                Arg::Int(plan.dst_w),
                Arg::Int(plan.dst_h),
                Arg::Int(plan.nchw),
                Arg::Int(image_base),
            ];
            let cfg = grid(plan.horizontal_blocks, chunk);
            // SAFETY: as for the vertical pass; `out` holds `images * per_image` values and
            // `lut` 3 * 256.
            unsafe { self.device.launch("resize_horizontal_f32", cfg, &args) }
                .map_err(gpu_error)?;
        }
        Ok(())
    }

    /// The horizontal pass into bytes.
    fn horizontal_u8(&self, out: &D::Buf<u8>) -> DataflowResult<()> {
        let plan = &self.plan;
        for &(image_base, chunk) in &plan.launches {
            let args = [
                Arg::U8(self.tmp),
                Arg::U8(out),
                Arg::I64(self.meta),
                Arg::I32(self.taps),
                Arg::Int(plan.dst_w),
                Arg::Int(plan.dst_h),
                Arg::Int(plan.nchw),
                Arg::Int(image_base),
            ];
            let cfg = grid(plan.horizontal_blocks, chunk);
            // SAFETY: as for the vertical pass; `out` holds `images * per_image` bytes.
            unsafe { self.device.launch("resize_horizontal_u8", cfg, &args) }.map_err(gpu_error)?;
        }
        Ok(())
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

#[cfg(test)]
mod tests;
