//! Runs the CUDA kernels on the CPU, for tests on machines without a GPU.
//!
//! The kernel source given to NVRTC is compiled as C++ by `g++`, after a shim that makes the
//! CUDA keywords empty and declares the built-ins (`blockIdx`, `threadIdx`, `blockDim`,
//! `gridDim`), then linked with a small driver: it reads the buffers and the queued launches
//! from a file, runs every thread of every block one after the other, setting the built-ins
//! before each call, and writes the buffers back. (`libloading` is not a dependency of this
//! crate, so the kernels run in a child process rather than a loaded library.)
//!
//! What it checks besides the values:
//! - each pushed argument against the kernel's parameter list, the way `cuLaunchKernel` reads
//!   them: the count, and per parameter the type (a pushed `i64` for an `int` would be a bug);
//! - the launch configuration against CUDA's limits (no empty grid, at most 1024 threads per
//!   block, grid y and z at most 65535);
//! - memory: with AddressSanitizer (and UBSan, so a signed `int` index overflow is an error)
//!   when g++'s sanitizer libraries are installed, else guard bytes around every buffer
//!   catch writes out of bounds;
//! - order: the launches run twice, blocks and threads forwards and backwards, on copies of
//!   the buffers; results that differ mean threads depend on each other (a race on a GPU).
//!
//! Kernels that use shared memory, barriers, warp intrinsics or atomics cannot be run one
//! thread at a time; [`Emulator::new`] refuses them. None of Riffle's kernels use any.
//!
//! What it cannot show: the GPU's own floating point. NVRTC contracts `a * b + c` into fused
//! multiply-adds by default and CUDA's `expf` is within 2 ulp of glibc's, so float kernels
//! agree with a GPU to rounding, not bit for bit (here `-ffp-contract=off`: no fusing).
//! Integer types have the same widths (LP64) on both. The grids, arguments and buffers are the
//! executors' own: their host code (dense and resize, in riffle-operators) is written over
//! [`crate::GpuDevice`] and runs on this emulator through [`crate::emulated::Emulated`];
//! `riffle gpu-check` remains the check on real hardware.
//!
//! Test-only: built with the `emulator` feature, which only dev-dependencies enable. The C++
//! shim and driver are `shim.h` and `driver.cpp` beside this file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};

mod memory;
#[cfg(test)]
mod tests;

pub use memory::{Arg, Buf, Elem, LaunchArgs, Memory};

/// What needs threads of a block to run together.
const UNSUPPORTED: &[&str] = &[
    "__shared__",
    "__syncthreads",
    "__syncwarp",
    "__shfl",
    "__ballot",
    "__any_sync",
    "__all_sync",
    "atomic",
    "cooperative_groups",
    "warpSize",
];

/// Prepended to the kernel source.
const SHIM: &str = include_str!("shim.h");

/// Appended after the kernel source and the generated dispatcher's declaration.
const DRIVER: &str = include_str!("driver.cpp");

/// Sanitizers: memory errors and undefined behaviour (a signed index overflowing, say) stop
/// the run. Tried first; without g++'s sanitizer libraries the guard bytes remain.
const SANITIZE: &[&str] = &[
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
];

/// A kernel source compiled for the CPU; removes its files when dropped.
pub struct Emulator {
    dir: PathBuf,
    exe: PathBuf,
    runs: AtomicUsize,
}

impl Emulator {
    /// Compiles `source` (the string given to NVRTC) with a driver for the `kernels` named.
    /// Panics when g++ is missing or the source does not compile as C++.
    pub fn new(source: &str, kernels: &[&str]) -> Emulator {
        Emulator::try_new(source, kernels).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Emulator::new`], compiled once per test process for each source and kernel list
    /// however many tests ask (a compile takes seconds); the files are removed at exit.
    pub fn shared(source: &str, kernels: &[&str]) -> Arc<Emulator> {
        /// By source and kernel names.
        type Slots = HashMap<(String, Vec<String>), Arc<OnceLock<Arc<Emulator>>>>;
        static SHARED: OnceLock<Mutex<Slots>> = OnceLock::new();
        let key = (
            source.to_string(),
            kernels.iter().map(|k| k.to_string()).collect(),
        );
        let slot = SHARED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .clone();
        // Compiled outside the map's lock: other sources compile meanwhile.
        slot.get_or_init(|| {
            let emulator = Arc::new(Emulator::new(source, kernels));
            remove_at_exit(emulator.dir.clone());
            emulator
        })
        .clone()
    }

    pub fn try_new(source: &str, kernels: &[&str]) -> Result<Emulator, String> {
        Emulator::build(source, kernels, true)
    }

    /// `sanitize`: try AddressSanitizer and UBSan first (else guard bytes only).
    fn build(source: &str, kernels: &[&str], sanitize: bool) -> Result<Emulator, String> {
        if let Some(what) = UNSUPPORTED.iter().find(|w| source.contains(*w)) {
            return Err(format!(
                "the kernels use `{what}`: threads that share memory or synchronise cannot be \
                 run one after the other, so these kernels cannot be emulated"
            ));
        }
        for k in kernels {
            let ident = !k.is_empty()
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !k.starts_with(|c: char| c.is_ascii_digit());
            if !ident {
                return Err(format!("`{k}` is not a kernel name"));
            }
        }
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "riffle-kernel-emulation-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // From here on, dropping `emulator` removes the directory.
        let emulator = Emulator {
            exe: dir.join("emulator"),
            dir,
            runs: AtomicUsize::new(0),
        };
        let cpp = emulator.dir.join("emulator.cpp");
        let mut text = String::from(SHIM);
        text.push_str("#line 1 \"kernels.cu\"\n");
        text.push_str(source);
        text.push_str("\n#line 1 \"emulation_driver.cpp\"\n");
        text.push_str(DRIVER);
        text.push_str(
            "\nvoid riffle_dispatch(const riffle::Launch& l, std::vector<riffle::Buffer>& bufs, \
             bool backwards) {\n",
        );
        for k in kernels {
            text.push_str(&format!(
                "    if (l.kernel == \"{k}\") return riffle::run({k}, l, bufs, backwards);\n"
            ));
        }
        text.push_str("    riffle::fail(\"no kernel `\" + l.kernel + \"` was compiled\");\n}\n");
        std::fs::write(&cpp, text).map_err(|e| format!("writing {}: {e}", cpp.display()))?;
        if sanitize {
            let sanitized = emulator.compile(&cpp, SANITIZE)?;
            let why_not = if sanitized.status.success() {
                // Built, but the sanitizers may still fail to start (a memory limit, say).
                match emulator.starts() {
                    Ok(()) => return Ok(emulator),
                    Err(why) => why,
                }
            } else {
                String::from_utf8_lossy(&sanitized.stderr).into_owned()
            };
            let why = format!(
                "kernel emulation: AddressSanitizer/UBSan unusable here, so reads out of bounds \
                 go unnoticed (guard bytes still catch writes); g++'s libasan and libubsan \
                 are needed:\n{why_not}"
            );
            // Where tests rely on the sanitizers (scripts/test.sh sets this), running without
            // them is a failure, not a line on stderr.
            if std::env::var("RIFFLE_EXPECT_SANITIZERS").is_ok_and(|v| v == "1") {
                return Err(format!("RIFFLE_EXPECT_SANITIZERS=1: {why}"));
            }
            eprintln!("{why}");
        }
        let plain = emulator.compile(&cpp, &[])?;
        if !plain.status.success() {
            return Err(format!(
                "g++ cannot compile the kernels as C++:\n{}",
                String::from_utf8_lossy(&plain.stderr)
            ));
        }
        emulator.starts()?;
        Ok(emulator)
    }

    /// Whether the driver runs: without arguments it must only print its usage.
    fn starts(&self) -> Result<(), String> {
        let out = Command::new(&self.exe)
            .output()
            .map_err(|e| format!("running {}: {e}", self.exe.display()))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(3) && stderr.starts_with("kernel emulation: usage") {
            Ok(())
        } else {
            Err(format!(
                "the emulator does not start ({}):\n{stderr}",
                out.status
            ))
        }
    }

    fn compile(&self, cpp: &Path, extra: &[&str]) -> Result<std::process::Output, String> {
        Command::new("g++")
            .args(["-std=c++17", "-O1", "-g", "-ffp-contract=off", "-w"])
            .args(extra)
            .arg(cpp)
            .arg("-o")
            .arg(&self.exe)
            .output()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    "g++ is not installed: the kernel emulation tests compile the CUDA kernels \
                     with it. Install g++ (e.g. `apt-get install g++`)."
                        .to_string()
                } else {
                    format!("running g++: {e}")
                }
            })
    }
}

/// Directories of [`Emulator::shared`] emulators, never dropped.
static AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn remove_shared_dirs() {
    if let Ok(dirs) = AT_EXIT.lock() {
        for dir in dirs.iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn remove_at_exit(dir: PathBuf) {
    static REGISTER: Once = Once::new();
    // SAFETY: C's atexit with a function that takes no arguments and does not unwind (the
    // removal ignores errors and a poisoned lock is skipped).
    REGISTER.call_once(|| unsafe {
        atexit(remove_shared_dirs);
    });
    AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()).push(dir);
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
