//! What the CUDA executors (`dense_cuda`, `resize_cuda`) need of a GPU, as the `Device` trait:
//! buffers, copies to and from the host, launches of NVRTC kernels and cuBLAS's Sgemm, all in
//! order on one stream. Their host code is written once over it. `CudaDevice` maps it onto
//! cudarc; in tests `emulated::Emulated` runs the same host code on the CPU kernel emulator
//! (`crate::kernel_emulation`).
//!
//! cudarc panics when the CUDA driver or NVRTC library is missing: [`check_gpu`] (which asks
//! [`crate::gpu::discover`]) and [`Kernels::compile`] (which asks for NVRTC) come before any
//! other cudarc call, and [`CudaDevice::open`] checks the GPU again.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use riffle_dataflow::{DataflowError, DataflowResult};

/// An element type of device buffers, one the kernels' pointers point to: `f32`, `i32`, `i64`
/// or `u8`. (In tests, also one the kernel emulator holds.)
pub(crate) trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Emulable {}

impl Elem for f32 {}
impl Elem for i32 {}
impl Elem for i64 {}
impl Elem for u8 {}

#[cfg(test)]
use crate::kernel_emulation::Elem as Emulable;

/// Outside tests, nothing: there it is the kernel emulator's element trait.
#[cfg(not(test))]
pub(crate) trait Emulable {}
#[cfg(not(test))]
impl<T> Emulable for T {}

/// What the executors need of a GPU: memory, copies to and from the host, launches of the
/// kernels it was built with and cuBLAS's Sgemm, all in order on one stream. [`CudaDevice`] is
/// a real GPU; the tests implement it with the CPU kernel emulator.
pub(crate) trait Device {
    /// A buffer of `T`s in the device's memory.
    type Buf<T>;

    /// A buffer of `n` zeros.
    fn alloc_zeros<T: Elem>(&self, n: usize) -> DataflowResult<Self::Buf<T>>;
    /// A new buffer holding `values`.
    fn upload<T: Elem>(&self, values: &[T]) -> DataflowResult<Self::Buf<T>>;
    /// Copies `values` to the start of `buf` (after the work queued before); an error if `buf`
    /// holds fewer.
    fn upload_into<T: Elem>(&self, values: &[T], buf: &mut Self::Buf<T>) -> DataflowResult<()>;
    /// The first `n` values of `buf`, once the work queued before has run; an error if `buf`
    /// holds fewer.
    fn download<T: Elem>(&self, buf: &Self::Buf<T>, n: usize) -> DataflowResult<Vec<T>>;
    /// How many values `buf` holds.
    fn buf_len<T: Elem>(&self, buf: &Self::Buf<T>) -> usize;
    /// Waits for all the work queued so far.
    fn synchronize(&self) -> DataflowResult<()>;

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
    ) -> DataflowResult<()>;

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
    ) -> DataflowResult<()>;
}

/// A kernel argument: a buffer (passed as its device pointer) or an `int`.
pub(crate) enum Arg<'a, D: Device + ?Sized> {
    F32(&'a D::Buf<f32>),
    I32(&'a D::Buf<i32>),
    I64(&'a D::Buf<i64>),
    U8(&'a D::Buf<u8>),
    Int(i32),
}

/// The kernels of one executor: their NVRTC source, the names of their entry points, and the
/// stage that reports their errors.
pub(crate) struct Kernels {
    pub(crate) stage: &'static str,
    pub(crate) source: &'static str,
    pub(crate) names: &'static [&'static str],
}

/// [`Kernels`] compiled to PTX, ready to load on any number of GPUs.
pub(crate) struct CompiledKernels {
    stage: &'static str,
    names: &'static [&'static str],
    ptx: Ptx,
}

fn cuda(stage: &str, e: impl std::fmt::Debug) -> DataflowError {
    DataflowError::stage(stage, format!("CUDA: {e:?}"))
}

/// Fails, with a config error naming `stage` and the device, unless GPU `ordinal` is usable.
/// Ask before any cudarc call: cudarc panics without the driver library.
pub(crate) fn check_gpu(stage: &str, ordinal: usize) -> DataflowResult<()> {
    match crate::gpu::discover() {
        Ok(gpus) if ordinal < gpus.len() => Ok(()),
        Ok(gpus) => Err(DataflowError::Config(format!(
            "{stage}: device `cuda:{ordinal}`: this machine has {} GPU(s)",
            gpus.len()
        ))),
        Err(why) => Err(DataflowError::Config(format!(
            "{stage}: device `cuda:{ordinal}`: no CUDA device is usable here ({why})"
        ))),
    }
}

impl Kernels {
    /// Compiles the kernels with NVRTC, for GPU `ordinal` (named in the error when NVRTC is
    /// missing).
    pub(crate) fn compile(&self, ordinal: usize) -> DataflowResult<CompiledKernels> {
        // Nor does cudarc survive a missing NVRTC: ask before compiling.
        // SAFETY: only tries to dlopen the NVRTC library by its usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(DataflowError::Config(format!(
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
pub(crate) enum Stream {
    /// The context's default stream.
    Default,
    /// A stream of its own: work of devices sharing the GPU then overlaps instead of queueing.
    Own,
}

/// One GPU through cudarc: a stream, the compiled kernels and optionally a cuBLAS handle.
pub(crate) struct CudaDevice {
    /// Names the errors.
    stage: &'static str,
    stream: Arc<CudaStream>,
    /// `None` unless [`CudaDevice::with_blas`] set it up.
    blas: Option<CudaBlas>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl CudaDevice {
    /// Opens GPU `ordinal` (after asking [`crate::gpu::discover`]: cudarc panics without
    /// CUDA) and loads `kernels` on it.
    pub(crate) fn open(
        ordinal: usize,
        kernels: &CompiledKernels,
        stream: Stream,
    ) -> DataflowResult<CudaDevice> {
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

    /// The device with a cuBLAS handle on its stream, for [`Device::gemm`].
    pub(crate) fn with_blas(mut self) -> DataflowResult<CudaDevice> {
        self.blas = Some(CudaBlas::new(self.stream.clone()).map_err(|e| self.cuda(e))?);
        Ok(self)
    }

    fn cuda(&self, e: impl std::fmt::Debug) -> DataflowError {
        cuda(self.stage, e)
    }

    fn err(&self, message: String) -> DataflowError {
        DataflowError::stage(self.stage, message)
    }
}

impl Device for CudaDevice {
    type Buf<T> = CudaSlice<T>;

    fn alloc_zeros<T: Elem>(&self, n: usize) -> DataflowResult<CudaSlice<T>> {
        self.stream.alloc_zeros::<T>(n).map_err(|e| self.cuda(e))
    }

    fn upload<T: Elem>(&self, values: &[T]) -> DataflowResult<CudaSlice<T>> {
        self.stream.clone_htod(values).map_err(|e| self.cuda(e))
    }

    fn upload_into<T: Elem>(&self, values: &[T], buf: &mut CudaSlice<T>) -> DataflowResult<()> {
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

    fn download<T: Elem>(&self, buf: &CudaSlice<T>, n: usize) -> DataflowResult<Vec<T>> {
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

    fn synchronize(&self) -> DataflowResult<()> {
        self.stream.synchronize().map_err(|e| self.cuda(e))
    }

    unsafe fn launch(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        args: &[Arg<'_, Self>],
    ) -> DataflowResult<()> {
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
    ) -> DataflowResult<()> {
        let blas = self
            .blas
            .as_ref()
            .ok_or_else(|| self.err("cuBLAS is not set up on this GPU".into()))?;
        // SAFETY: the caller guarantees that `cfg` describes the buffers.
        unsafe { blas.gemm(cfg, a, b, c) }.map_err(|e| self.cuda(e))
    }
}

/// The [`Device`] of the tests: the kernels run on the CPU by [`crate::kernel_emulation`],
/// cuBLAS's part on the host by its definition.
#[cfg(test)]
pub(crate) mod emulated {
    use std::sync::{Mutex, MutexGuard};

    use cudarc::cublas::sys::cublasOperation_t;

    use super::*;
    use crate::kernel_emulation::{self, Emulator};

    /// A GPU emulated on the CPU: launches queue on its stream and run when a copy needs their
    /// results, as with cudarc's synchronous copies.
    pub(crate) struct Emulated<'e> {
        stage: &'static str,
        memory: Mutex<kernel_emulation::Device<'e>>,
        /// Whether new buffers hold a pattern of 0xa5 bytes instead of zeros.
        poison: bool,
    }

    impl<'e> Emulated<'e> {
        /// A device running `emulator`'s kernels; its errors name `stage`.
        pub(crate) fn new(emulator: &'e Emulator, stage: &'static str) -> Emulated<'e> {
            Emulated {
                stage,
                memory: Mutex::new(kernel_emulation::Device::new(emulator)),
                poison: false,
            }
        }

        /// The device with new buffers filled with 0xa5 bytes, not zeros: they stand for what
        /// an earlier use left in a reused buffer, which no output may show.
        pub(crate) fn poisoned(mut self) -> Emulated<'e> {
            self.poison = true;
            self
        }

        fn memory(&self) -> MutexGuard<'_, kernel_emulation::Device<'e>> {
            self.memory.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn err(&self, message: String) -> DataflowError {
            DataflowError::stage(self.stage, format!("emulated CUDA: {message}"))
        }

        /// The queued launches run, as a copy on the stream would wait for them.
        fn synchronized(&self) -> DataflowResult<MutexGuard<'_, kernel_emulation::Device<'e>>> {
            let mut memory = self.memory();
            memory.synchronize().map_err(|e| self.err(e))?;
            Ok(memory)
        }
    }

    impl Device for Emulated<'_> {
        /// The emulator checks element types at launches and copies.
        type Buf<T> = kernel_emulation::Buf;

        fn alloc_zeros<T: Elem>(&self, n: usize) -> DataflowResult<kernel_emulation::Buf> {
            let byte = if self.poison { 0xa5 } else { 0 };
            let value = T::get(&vec![byte; std::mem::size_of::<T>()]);
            Ok(self.memory().alloc_filled(n, value))
        }

        fn upload<T: Elem>(&self, values: &[T]) -> DataflowResult<kernel_emulation::Buf> {
            Ok(self.memory().htod(values))
        }

        fn upload_into<T: Elem>(
            &self,
            values: &[T],
            buf: &mut kernel_emulation::Buf,
        ) -> DataflowResult<()> {
            let mut memory = self.synchronized()?;
            let len = memory.len(*buf);
            if values.len() > len {
                return Err(self.err(format!(
                    "{} values do not fit a buffer of {len}",
                    values.len()
                )));
            }
            memory.memcpy_htod(values, *buf);
            Ok(())
        }

        fn download<T: Elem>(
            &self,
            buf: &kernel_emulation::Buf,
            n: usize,
        ) -> DataflowResult<Vec<T>> {
            let mut values = self.synchronized()?.dtoh(*buf);
            if n > values.len() {
                return Err(self.err(format!("{n} values asked of a buffer of {}", values.len())));
            }
            values.truncate(n);
            Ok(values)
        }

        fn buf_len<T: Elem>(&self, buf: &kernel_emulation::Buf) -> usize {
            self.memory().len(*buf)
        }

        fn synchronize(&self) -> DataflowResult<()> {
            self.synchronized().map(drop)
        }

        unsafe fn launch(
            &self,
            name: &'static str,
            cfg: LaunchConfig,
            args: &[Arg<'_, Self>],
        ) -> DataflowResult<()> {
            let mut memory = self.memory();
            let mut b = memory.launch_builder(name);
            for a in args {
                match a {
                    Arg::F32(buf) | Arg::I32(buf) | Arg::I64(buf) | Arg::U8(buf) => b.arg(*buf),
                    Arg::Int(v) => b.arg(v),
                };
            }
            b.launch(cfg);
            Ok(())
        }

        /// cuBLAS by its definition, on the host, after the launches queued before.
        unsafe fn gemm(
            &self,
            cfg: GemmConfig<f32>,
            a: &kernel_emulation::Buf,
            b: &kernel_emulation::Buf,
            c: &mut kernel_emulation::Buf,
        ) -> DataflowResult<()> {
            let mut memory = self.synchronized()?;
            let (a, b) = (memory.dtoh::<f32>(*a), memory.dtoh::<f32>(*b));
            let mut out = memory.dtoh::<f32>(*c);
            sgemm_reference(&cfg, &a, &b, &mut out);
            memory.memcpy_htod(&out, *c);
            Ok(())
        }
    }

    /// cublasSgemm's definition, column-major: C = alpha·op(A)·op(B) + beta·C (C not read
    /// when beta is 0, as cuBLAS says).
    pub(crate) fn sgemm_reference(cfg: &GemmConfig<f32>, a: &[f32], b: &[f32], c: &mut [f32]) {
        let transposed = |t: cublasOperation_t| t == cublasOperation_t::CUBLAS_OP_T;
        let (m, n, k) = (cfg.m as usize, cfg.n as usize, cfg.k as usize);
        let (lda, ldb, ldc) = (cfg.lda as usize, cfg.ldb as usize, cfg.ldc as usize);
        let op_a = |i: usize, p: usize| {
            if transposed(cfg.transa) {
                a[p + i * lda]
            } else {
                a[i + p * lda]
            }
        };
        let op_b = |p: usize, j: usize| {
            if transposed(cfg.transb) {
                b[j + p * ldb]
            } else {
                b[p + j * ldb]
            }
        };
        for j in 0..n {
            for i in 0..m {
                let acc: f32 = (0..k).map(|p| op_a(i, p) * op_b(p, j)).sum();
                let old = if cfg.beta == 0.0 {
                    0.0
                } else {
                    cfg.beta * c[i + j * ldc]
                };
                c[i + j * ldc] = cfg.alpha * acc + old;
            }
        }
    }
}
