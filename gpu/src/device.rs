//! What the CUDA executors (riffle-operators' dense and resize host code) need of a GPU, as the
//! [`GpuDevice`] trait: buffers, copies to and from the host, launches of NVRTC kernels and
//! cuBLAS's Sgemm, all in order on one stream. Their host code is written once over it.
//! [`CudaDevice`] maps it onto cudarc; in tests `emulated::Emulated` (feature `emulator`) runs
//! the same host code on the CPU kernel emulator.
//!
//! cudarc panics when the CUDA driver or NVRTC library is missing: [`check_gpu`] (which asks
//! [`crate::discover`]) and [`Kernels::compile`] (which asks for NVRTC) come before any other
//! cudarc call, and [`CudaDevice::open`] checks the GPU again.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{GpuError, GpuResult};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

/// An element type of device buffers, one the kernels' pointers point to: `f32`, `i32`, `i64`
/// or `u8`. (With the `emulator` feature, also one the kernel emulator holds.)
pub trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Emulable {}

impl Elem for f32 {}
impl Elem for i32 {}
impl Elem for i64 {}
impl Elem for u8 {}

#[cfg(feature = "emulator")]
pub use crate::emulator::Elem as Emulable;

/// Without the `emulator` feature, nothing: with it, the kernel emulator's element trait.
#[cfg(not(feature = "emulator"))]
pub trait Emulable {}
#[cfg(not(feature = "emulator"))]
impl<T> Emulable for T {}

/// What the executors need of a GPU: memory, copies to and from the host, launches of the
/// kernels it was built with and cuBLAS's Sgemm, all in order on one stream. [`CudaDevice`] is
/// a real GPU; the tests implement it with the CPU kernel emulator.
pub trait GpuDevice {
    /// A buffer of `T`s in the device's memory.
    type Buf<T>;

    /// A buffer of `n` zeros.
    fn alloc_zeros<T: Elem>(&self, n: usize) -> GpuResult<Self::Buf<T>>;
    /// A new buffer holding `values`.
    fn upload<T: Elem>(&self, values: &[T]) -> GpuResult<Self::Buf<T>>;
    /// Copies `values` to the start of `buf` (after the work queued before); an error if `buf`
    /// holds fewer.
    fn upload_into<T: Elem>(&self, values: &[T], buf: &mut Self::Buf<T>) -> GpuResult<()>;
    /// The first `n` values of `buf`, once the work queued before has run; an error if `buf`
    /// holds fewer.
    fn download<T: Elem>(&self, buf: &Self::Buf<T>, n: usize) -> GpuResult<Vec<T>>;
    /// How many values `buf` holds.
    fn buf_len<T: Elem>(&self, buf: &Self::Buf<T>) -> usize;
    /// Waits for all the work queued so far.
    fn synchronize(&self) -> GpuResult<()>;

    /// Queues kernel `name` (one of those the device was built with) over `cfg`'s grid, `args`
    /// in the order of its parameters.
    ///
    /// # Safety
    /// The kernel must access only the buffers passed, within their lengths: the element count
    /// it is given (against which every kernel checks its thread index) must fit the buffers,
    /// and any indices or offsets it follows must be in range.
    unsafe fn launch(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        args: &[Arg<'_, Self>],
    ) -> GpuResult<()>;

    /// Queues cuBLAS's Sgemm (column-major): `c = alpha·op(a)·op(b) + beta·c` as `cfg` says.
    ///
    /// # Safety
    /// `cfg`'s dimensions and leading dimensions must describe the buffers.
    unsafe fn gemm(
        &self,
        cfg: GemmConfig<f32>,
        a: &Self::Buf<f32>,
        b: &Self::Buf<f32>,
        c: &mut Self::Buf<f32>,
    ) -> GpuResult<()>;
}

/// A kernel argument: a buffer (passed as its device pointer) or an `int`.
pub enum Arg<'a, D: GpuDevice + ?Sized> {
    F32(&'a D::Buf<f32>),
    I32(&'a D::Buf<i32>),
    I64(&'a D::Buf<i64>),
    U8(&'a D::Buf<u8>),
    Int(i32),
}

/// The kernels of one executor: their NVRTC source, the names of their entry points, and the
/// stage that reports their errors.
pub struct Kernels {
    pub stage: &'static str,
    pub source: &'static str,
    pub names: &'static [&'static str],
}

/// [`Kernels`] compiled to PTX, ready to load on any number of GPUs.
pub struct CompiledKernels {
    stage: &'static str,
    names: &'static [&'static str],
    ptx: Ptx,
}

fn cuda(stage: &str, e: impl std::fmt::Debug) -> GpuError {
    GpuError::cuda(stage, format!("CUDA: {e:?}"))
}

/// Fails, with [`GpuError::Unusable`] naming `stage` and the device, unless GPU `ordinal` is usable.
/// Ask before any cudarc call: cudarc panics without the driver library.
pub fn check_gpu(stage: &str, ordinal: usize) -> GpuResult<()> {
    match crate::discover() {
        Ok(gpus) if ordinal < gpus.len() => Ok(()),
        Ok(gpus) => Err(GpuError::Unusable(format!(
            "{stage}: device `cuda:{ordinal}`: this machine has {} GPU(s)",
            gpus.len()
        ))),
        Err(why) => Err(GpuError::Unusable(format!(
            "{stage}: device `cuda:{ordinal}`: no CUDA device is usable here ({why})"
        ))),
    }
}

impl Kernels {
    /// Compiles the kernels with NVRTC, for GPU `ordinal` (named in the error when NVRTC is
    /// missing).
    pub fn compile(&self, ordinal: usize) -> GpuResult<CompiledKernels> {
        // Nor does cudarc survive a missing NVRTC: ask before compiling.
        // SAFETY: only tries to dlopen the NVRTC library by its usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(GpuError::Unusable(format!(
                "{stage}: device `cuda:{ordinal}`: the NVRTC library (libnvrtc.so), needed to \
                 compile the {stage} kernels, is not installed",
                stage = self.stage
            )));
        }
        let ptx = cudarc::nvrtc::compile_ptx(self.source).map_err(|e| cuda(self.stage, e))?;
        Ok(CompiledKernels {
            stage: self.stage,
            names: self.names,
            ptx,
        })
    }
}

/// Which stream a [`CudaDevice`] queues its work on.
pub enum Stream {
    /// The context's default stream.
    Default,
    /// A stream of its own: work of devices sharing the GPU then overlaps instead of queueing.
    Own,
}

/// One GPU through cudarc: a stream, the compiled kernels and optionally a cuBLAS handle.
pub struct CudaDevice {
    /// Names the errors.
    stage: &'static str,
    stream: Arc<CudaStream>,
    /// `None` unless [`CudaDevice::with_blas`] set it up.
    blas: Option<CudaBlas>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl CudaDevice {
    /// Opens GPU `ordinal` (after asking [`crate::discover`]: cudarc panics without
    /// CUDA) and loads `kernels` on it.
    pub fn open(
        ordinal: usize,
        kernels: &CompiledKernels,
        stream: Stream,
    ) -> GpuResult<CudaDevice> {
        let stage = kernels.stage;
        check_gpu(stage, ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda(stage, e))?;
        let stream = match stream {
            Stream::Default => ctx.default_stream(),
            Stream::Own => ctx.new_stream().map_err(|e| cuda(stage, e))?,
        };
        let module = ctx
            .load_module(kernels.ptx.clone())
            .map_err(|e| cuda(stage, e))?;
        let mut functions = HashMap::new();
        for &name in kernels.names {
            let function = module.load_function(name).map_err(|e| cuda(stage, e))?;
            functions.insert(name, function);
        }
        Ok(CudaDevice {
            stage,
            stream,
            blas: None,
            functions,
        })
    }

    /// The device with a cuBLAS handle on its stream, for [`GpuDevice::gemm`].
    pub fn with_blas(mut self) -> GpuResult<CudaDevice> {
        self.blas = Some(CudaBlas::new(self.stream.clone()).map_err(|e| self.cuda(e))?);
        Ok(self)
    }

    fn cuda(&self, e: impl std::fmt::Debug) -> GpuError {
        cuda(self.stage, e)
    }

    fn err(&self, message: String) -> GpuError {
        GpuError::cuda(self.stage, message)
    }
}

impl GpuDevice for CudaDevice {
    type Buf<T> = CudaSlice<T>;

    fn alloc_zeros<T: Elem>(&self, n: usize) -> GpuResult<CudaSlice<T>> {
        self.stream.alloc_zeros::<T>(n).map_err(|e| self.cuda(e))
    }

    fn upload<T: Elem>(&self, values: &[T]) -> GpuResult<CudaSlice<T>> {
        self.stream.clone_htod(values).map_err(|e| self.cuda(e))
    }

    fn upload_into<T: Elem>(&self, values: &[T], buf: &mut CudaSlice<T>) -> GpuResult<()> {
        // cudarc asserts this; an error instead.
        if values.len() > buf.len() {
            return Err(self.err(format!(
                "{} values do not fit a buffer of {}",
                values.len(),
                buf.len()
            )));
        }
        self.stream
            .memcpy_htod(values, buf)
            .map_err(|e| self.cuda(e))
    }

    fn download<T: Elem>(&self, buf: &CudaSlice<T>, n: usize) -> GpuResult<Vec<T>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let view = buf
            .try_slice(..n)
            .ok_or_else(|| self.err(format!("{n} values asked of a buffer of {}", buf.len())))?;
        self.stream.clone_dtoh(&view).map_err(|e| self.cuda(e))
    }

    fn buf_len<T: Elem>(&self, buf: &CudaSlice<T>) -> usize {
        buf.len()
    }

    fn synchronize(&self) -> GpuResult<()> {
        self.stream.synchronize().map_err(|e| self.cuda(e))
    }

    unsafe fn launch(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        args: &[Arg<'_, Self>],
    ) -> GpuResult<()> {
        let function = self
            .functions
            .get(name)
            .ok_or_else(|| self.err(format!("kernel {name} missing")))?;
        let mut b = self.stream.launch_builder(function);
        // The scalars are pushed by reference into `args`, which outlives the launch. Buffers
        // the kernel writes are pushed as read-only too: every buffer of a device lives on its
        // one stream, which orders the work, so cudarc's cross-stream events are not needed.
        for a in args {
            match a {
                Arg::F32(s) => b.arg(*s),
                Arg::I32(s) => b.arg(*s),
                Arg::I64(s) => b.arg(*s),
                Arg::U8(s) => b.arg(*s),
                Arg::Int(v) => b.arg(v),
            };
        }
        // SAFETY: the caller guarantees that the kernel stays within the buffers passed.
        unsafe { b.launch(cfg) }.map_err(|e| self.cuda(e))?;
        Ok(())
    }

    unsafe fn gemm(
        &self,
        cfg: GemmConfig<f32>,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> GpuResult<()> {
        let blas = self
            .blas
            .as_ref()
            .ok_or_else(|| self.err("cuBLAS is not set up on this GPU".into()))?;
        // SAFETY: the caller guarantees that `cfg` describes the buffers.
        unsafe { blas.gemm(cfg, a, b, c) }.map_err(|e| self.cuda(e))
    }
}
