//! Riffle's GPUs, apart from the stages that use them.
//!
//! - [`discover`] the process's GPUs through the CUDA driver (loaded at run time, so the same
//!   binary runs on machines without CUDA), and place workers on them ([`gpu_for_worker`],
//!   [`resolve`] for a stage's `device:` key, [`DeviceSpec`]).
//! - [`GpuDevice`]: what the CUDA executors need of a GPU (buffers, copies, kernel launches,
//!   cuBLAS's Sgemm on one stream), with [`CudaDevice`] mapping it onto cudarc.
//! - [`kernels`]: the CUDA kernels, `.cu` files under `gpu/kernels/` compiled by NVRTC.
//! - With the `emulator` feature (tests only): `emulator`, which runs those kernels on the
//!   CPU with g++, and `emulated::Emulated`, a [`GpuDevice`] over it.
//!
//! Errors are [`GpuError`]; nothing here depends on the dataflow engine.

// No panic on data or configuration in library code (its unit tests may unwrap); every index
// or slice left says why it is in bounds.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

mod device;
mod discovery;
#[cfg(feature = "emulator")]
pub mod emulated;
#[cfg(feature = "emulator")]
pub mod emulator;
mod error;
pub mod kernels;
mod spec;

pub use device::{check_gpu, Arg, CompiledKernels, CudaDevice, Elem, GpuDevice, Kernels, Stream};
pub use discovery::{discover, expect_nvrtc_where_asked, gpu_for_worker, resolve, GpuInfo};
pub use error::{GpuError, GpuResult};
pub use spec::DeviceSpec;
