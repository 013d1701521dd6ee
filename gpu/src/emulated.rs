//! The [`GpuDevice`] of the tests: the kernels run on the CPU by [`crate::emulator`], cuBLAS's
//! part on the host by its definition.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::GemmConfig;
use cudarc::driver::LaunchConfig;

use crate::device::{Arg, Elem, GpuDevice};
use crate::emulator::{self, Emulator};
use crate::error::{GpuError, GpuResult};

/// The most values one emulated buffer holds: as a GPU's memory is finite, a larger
/// allocation is an out-of-memory error (and a test gone wrong cannot take the host's memory).
pub const MAX_BUFFER_VALUES: usize = 1 << 28;

/// A GPU emulated on the CPU: launches queue on its stream and run when a copy needs their
/// results, as with cudarc's synchronous copies.
pub struct Emulated<'e> {
    stage: &'static str,
    memory: Mutex<emulator::Memory<'e>>,
    /// Whether new buffers hold a pattern of 0xa5 bytes instead of zeros.
    poison: bool,
    /// Kernel launches and Sgemm calls queued so far.
    launches: AtomicUsize,
}

impl<'e> Emulated<'e> {
    /// A device running `emulator`'s kernels; its errors name `stage`.
    pub fn new(emulator: &'e Emulator, stage: &'static str) -> Emulated<'e> {
        Emulated {
            stage,
            memory: Mutex::new(emulator::Memory::new(emulator)),
            poison: false,
            launches: AtomicUsize::new(0),
        }
    }

    /// How many kernel launches and Sgemm calls were queued on this device: tests of
    /// refusals check that none was.
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }

    /// The device with new buffers filled with 0xa5 bytes, not zeros: they stand for what
    /// an earlier use left in a reused buffer, which no output may show.
    pub fn poisoned(mut self) -> Emulated<'e> {
        self.poison = true;
        self
    }

    fn memory(&self) -> MutexGuard<'_, emulator::Memory<'e>> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn err(&self, message: String) -> GpuError {
        GpuError::cuda(self.stage, format!("emulated CUDA: {message}"))
    }

    /// The queued launches run, as a copy on the stream would wait for them.
    fn synchronized(&self) -> GpuResult<MutexGuard<'_, emulator::Memory<'e>>> {
        let mut memory = self.memory();
        memory.synchronize().map_err(|e| self.err(e))?;
        Ok(memory)
    }
}

impl GpuDevice for Emulated<'_> {
    /// The emulator checks element types at launches and copies.
    type Buf<T> = emulator::Buf;

    fn alloc_zeros<T: Elem>(&self, n: usize) -> GpuResult<emulator::Buf> {
        if n > MAX_BUFFER_VALUES {
            return Err(self.err(format!(
                "out of memory: a buffer of {n} values asked for (at most {MAX_BUFFER_VALUES})"
            )));
        }
        let byte = if self.poison { 0xa5 } else { 0 };
        let value = T::get(&vec![byte; std::mem::size_of::<T>()]);
        Ok(self.memory().alloc_filled(n, value))
    }

    fn upload<T: Elem>(&self, values: &[T]) -> GpuResult<emulator::Buf> {
        Ok(self.memory().htod(values))
    }

    fn upload_into<T: Elem>(&self, values: &[T], buf: &mut emulator::Buf) -> GpuResult<()> {
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

    fn download<T: Elem>(&self, buf: &emulator::Buf, n: usize) -> GpuResult<Vec<T>> {
        let mut values = self.synchronized()?.dtoh(*buf);
        if n > values.len() {
            return Err(self.err(format!("{n} values asked of a buffer of {}", values.len())));
        }
        values.truncate(n);
        Ok(values)
    }

    fn buf_len<T: Elem>(&self, buf: &emulator::Buf) -> usize {
        self.memory().len(*buf)
    }

    fn synchronize(&self) -> GpuResult<()> {
        self.synchronized().map(drop)
    }

    unsafe fn launch(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        args: &[Arg<'_, Self>],
    ) -> GpuResult<()> {
        self.launches.fetch_add(1, Ordering::Relaxed);
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
        a: &emulator::Buf,
        b: &emulator::Buf,
        c: &mut emulator::Buf,
    ) -> GpuResult<()> {
        self.launches.fetch_add(1, Ordering::Relaxed);
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
#[allow(
    clippy::indexing_slicing,
    reason = "as with cuBLAS, the dimensions must fit the slices; this test reference stops where a GPU would read out of bounds"
)]
pub fn sgemm_reference(cfg: &GemmConfig<f32>, a: &[f32], b: &[f32], c: &mut [f32]) {
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
