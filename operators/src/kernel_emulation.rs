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
//! executors' own: their host code (dense and resize) is written over
//! `crate::cuda_device::Device` and runs on this emulator through
//! `crate::cuda_device::emulated::Emulated`; `riffle gpu-check` remains the check on real
//! hardware.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};

use cudarc::driver::LaunchConfig;

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
const SHIM: &str = r#"
#include <math.h>
#include <cmath>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__
#define __launch_bounds__(...)
struct dim3 { unsigned int x, y, z; };
typedef dim3 uint3;
static uint3 blockIdx, threadIdx;
static dim3 blockDim, gridDim;
extern "C" void riffle_set_index(unsigned bx, unsigned by, unsigned bz, unsigned tx, unsigned ty,
                                 unsigned tz) {
    blockIdx = {bx, by, bz};
    threadIdx = {tx, ty, tz};
}
using std::max;
using std::min;
"#;

/// Appended after the kernel source and the generated dispatcher's declaration.
const DRIVER: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
static const bool riffle_asan = true;
#else
static const bool riffle_asan = false;
#endif

// Named when a sanitizer stops the run: which launch and thread it was in.
static const char* riffle_running = "no kernel";

static void riffle_on_death() {
    fprintf(stderr, "kernel emulation: stopped in %s, block (%u, %u, %u) thread (%u, %u, %u)\n",
            riffle_running, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
            threadIdx.z);
}

namespace riffle {

[[noreturn]] void fail(const std::string& message) {
    fprintf(stderr, "kernel emulation: %s\n", message.c_str());
    exit(3);
}

template <typename T> struct Tag { static const int value = -1; };
template <> struct Tag<float> { static const int value = 0; };
template <> struct Tag<int> { static const int value = 1; };
template <> struct Tag<long long> { static const int value = 2; };
template <> struct Tag<unsigned char> { static const int value = 3; };
template <> struct Tag<unsigned int> { static const int value = 4; };

std::string tag_name(int tag) {
    switch (tag) {
        case 0: return "float (f32)";
        case 1: return "int (i32)";
        case 2: return "long long (i64)";
        case 3: return "unsigned char (u8)";
        case 4: return "unsigned int (u32)";
    }
    return "an unknown type";
}

size_t tag_size(int tag) {
    switch (tag) {
        case 0: case 1: case 4: return 4;
        case 2: return 8;
        case 3: return 1;
    }
    fail("unknown element type " + std::to_string(tag));
}

const size_t GUARD = 4096;
const unsigned char CANARY = 0xA5;

struct Buffer {
    int tag;
    size_t n;
    size_t bytes;
    unsigned char* base;
    unsigned char* data;
};

// Under AddressSanitizer each buffer is its own allocation of exactly its size, so any access
// outside it is reported; otherwise guard bytes around it catch writes.
Buffer alloc(int tag, size_t n) {
    Buffer b{tag, n, n * tag_size(tag), nullptr, nullptr};
    if (riffle_asan) {
        b.base = static_cast<unsigned char*>(malloc(b.bytes));
        b.data = b.base;
    } else {
        b.base = static_cast<unsigned char*>(malloc(b.bytes + 2 * GUARD));
        b.data = b.base + GUARD;
        memset(b.base, CANARY, GUARD);
        memset(b.data + b.bytes, CANARY, GUARD);
    }
    if (!b.base && b.bytes) fail("out of memory");
    return b;
}

void check_guards(const std::vector<Buffer>& bufs, const std::string& kernel) {
    if (riffle_asan) return;
    for (size_t i = 0; i < bufs.size(); ++i) {
        const Buffer& b = bufs[i];
        for (size_t k = 0; k < GUARD; ++k) {
            if (b.base[k] != CANARY || b.data[b.bytes + k] != CANARY) {
                fail(kernel + " wrote outside buffer " + std::to_string(i) + " (" +
                     std::to_string(b.n) + " elements)");
            }
        }
    }
}

struct Arg {
    int kind;  // 0: a buffer, 1: a scalar
    int tag;
    size_t buf;
    unsigned long long raw;
};

struct Launch {
    std::string kernel;
    unsigned grid[3], block[3], shared;
    std::vector<Arg> args;
};

struct Reader {
    const std::vector<unsigned char>& bytes;
    size_t at;
    void take(void* out, size_t n) {
        if (at + n > bytes.size()) fail("truncated input");
        memcpy(out, bytes.data() + at, n);
        at += n;
    }
    unsigned u8() { unsigned char v; take(&v, 1); return v; }
    unsigned u32() { unsigned v; take(&v, 4); return v; }
    unsigned long long u64() { unsigned long long v; take(&v, 8); return v; }
};

template <typename P>
P take_arg(const Launch& l, size_t i, std::vector<Buffer>& bufs) {
    const Arg& a = l.args[i];
    std::string where = l.kernel + ": parameter " + std::to_string(i);
    using T = typename std::remove_cv<P>::type;
    if constexpr (std::is_pointer<T>::value) {
        using E = typename std::remove_cv<typename std::remove_pointer<T>::type>::type;
        static_assert(Tag<E>::value >= 0, "a kernel parameter points to an unknown type");
        if (a.kind != 0) {
            fail(where + " is a pointer to " + tag_name(Tag<E>::value) + ", but a scalar " +
                 tag_name(a.tag) + " was pushed");
        }
        if (a.buf >= bufs.size()) fail(where + ": no buffer " + std::to_string(a.buf));
        const Buffer& b = bufs[a.buf];
        if (b.tag != Tag<E>::value) {
            fail(where + " points to " + tag_name(Tag<E>::value) + ", but the buffer holds " +
                 tag_name(b.tag));
        }
        return reinterpret_cast<P>(b.data);
    } else {
        static_assert(Tag<T>::value >= 0, "a kernel parameter has an unknown type");
        if (a.kind != 1) {
            fail(where + " is " + tag_name(Tag<T>::value) + ", but a buffer was pushed");
        }
        if (a.tag != Tag<T>::value) {
            fail(where + " is " + tag_name(Tag<T>::value) + " (" + std::to_string(sizeof(T)) +
                 " bytes), but " + tag_name(a.tag) + " (" + std::to_string(tag_size(a.tag)) +
                 " bytes) was pushed");
        }
        T v;
        memcpy(&v, &a.raw, sizeof(T));
        return v;
    }
}

template <typename... P, size_t... I>
std::tuple<P...> take_args(const Launch& l, std::vector<Buffer>& bufs, std::index_sequence<I...>) {
    return std::tuple<P...>(take_arg<P>(l, I, bufs)...);
}

void check_config(const Launch& l) {
    const unsigned* g = l.grid;
    const unsigned* b = l.block;
    std::string dims = " (grid " + std::to_string(g[0]) + "x" + std::to_string(g[1]) + "x" +
                       std::to_string(g[2]) + ", block " + std::to_string(b[0]) + "x" +
                       std::to_string(b[1]) + "x" + std::to_string(b[2]) + ")";
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2]) {
        fail(l.kernel + ": an empty launch is an error on a GPU" + dims);
    }
    if (g[0] > 2147483647u || g[1] > 65535u || g[2] > 65535u) {
        fail(l.kernel + ": the grid exceeds CUDA's limits" + dims);
    }
    if (b[0] > 1024u || b[1] > 1024u || b[2] > 64u ||
        (unsigned long long)b[0] * b[1] * b[2] > 1024ull) {
        fail(l.kernel + ": the block exceeds CUDA's limits" + dims);
    }
    if (l.shared) fail(l.kernel + ": dynamic shared memory is not emulated");
}

template <typename... P>
void run(void (*kernel)(P...), const Launch& l, std::vector<Buffer>& bufs, bool backwards) {
    if (l.args.size() != sizeof...(P)) {
        fail(l.kernel + " takes " + std::to_string(sizeof...(P)) + " parameters, but " +
             std::to_string(l.args.size()) + " were pushed");
    }
    check_config(l);
    std::tuple<P...> args = take_args<P...>(l, bufs, std::index_sequence_for<P...>{});
    riffle_running = l.kernel.c_str();
    gridDim = {l.grid[0], l.grid[1], l.grid[2]};
    blockDim = {l.block[0], l.block[1], l.block[2]};
    unsigned long long blocks = (unsigned long long)l.grid[0] * l.grid[1] * l.grid[2];
    unsigned long long threads = (unsigned long long)l.block[0] * l.block[1] * l.block[2];
    for (unsigned long long bi = 0; bi < blocks; ++bi) {
        unsigned long long b = backwards ? blocks - 1 - bi : bi;
        unsigned bx = b % l.grid[0], by = b / l.grid[0] % l.grid[1];
        unsigned bz = b / l.grid[0] / l.grid[1];
        for (unsigned long long ti = 0; ti < threads; ++ti) {
            unsigned long long t = backwards ? threads - 1 - ti : ti;
            unsigned tx = t % l.block[0], ty = t / l.block[0] % l.block[1];
            unsigned tz = t / l.block[0] / l.block[1];
            riffle_set_index(bx, by, bz, tx, ty, tz);
            std::apply(kernel, args);
        }
    }
}

}  // namespace riffle

void riffle_dispatch(const riffle::Launch& l, std::vector<riffle::Buffer>& bufs, bool backwards);

int main(int argc, char** argv) {
    using namespace riffle;
    if (argc != 3) fail("usage: emulator INPUT OUTPUT");
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_set_death_callback(riffle_on_death);
#endif
    std::vector<unsigned char> bytes;
    {
        FILE* f = fopen(argv[1], "rb");
        if (!f) fail(std::string("cannot open ") + argv[1]);
        unsigned char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) bytes.insert(bytes.end(), chunk, chunk + n);
        fclose(f);
    }
    Reader r{bytes, 0};
    if (r.u32() != 0x31454b52u) fail("bad input");
    unsigned nbuf = r.u32();
    std::vector<Buffer> forwards, backwards;
    for (unsigned i = 0; i < nbuf; ++i) {
        int tag = (int)r.u8();
        size_t n = (size_t)r.u64();
        Buffer a = alloc(tag, n), b = alloc(tag, n);
        r.take(a.data, a.bytes);
        memcpy(b.data, a.data, a.bytes);
        forwards.push_back(a);
        backwards.push_back(b);
    }
    unsigned nlaunch = r.u32();
    std::vector<Launch> launches(nlaunch);
    for (Launch& l : launches) {
        unsigned len = r.u32();
        l.kernel.resize(len);
        r.take(&l.kernel[0], len);
        for (unsigned& v : l.grid) v = r.u32();
        for (unsigned& v : l.block) v = r.u32();
        l.shared = r.u32();
        unsigned nargs = r.u32();
        for (unsigned k = 0; k < nargs; ++k) {
            Arg a{(int)r.u8(), 0, 0, 0};
            if (a.kind == 0) a.buf = r.u32(); else { a.tag = (int)r.u8(); a.raw = r.u64(); }
            l.args.push_back(a);
        }
    }
    bool check_order = r.u8() != 0;
    for (const Launch& l : launches) {
        riffle_dispatch(l, forwards, false);
        check_guards(forwards, l.kernel);
    }
    if (check_order) {
        for (const Launch& l : launches) {
            riffle_dispatch(l, backwards, true);
            check_guards(backwards, l.kernel);
        }
        for (unsigned i = 0; i < nbuf; ++i) {
            const Buffer& a = forwards[i];
            const Buffer& b = backwards[i];
            if (memcmp(a.data, b.data, a.bytes) != 0) {
                size_t at = 0;
                while (a.data[at] == b.data[at]) ++at;
                fail("buffer " + std::to_string(i) + " differs at element " +
                     std::to_string(at / tag_size(a.tag)) +
                     " between threads run forwards and backwards: threads depend on each "
                     "other's order (a race on a GPU)");
            }
        }
    }
    FILE* out = fopen(argv[2], "wb");
    if (!out) fail(std::string("cannot write ") + argv[2]);
    for (const Buffer& b : forwards) {
        if (fwrite(b.data, 1, b.bytes, out) != b.bytes) fail("short write");
    }
    if (fclose(out) != 0) fail("short write");
    for (unsigned i = 0; i < nbuf; ++i) {
        free(forwards[i].base);
        free(backwards[i].base);
    }
    return 0;
}
"#;

/// Sanitizers: memory errors and undefined behaviour (a signed index overflowing, say) stop
/// the run. Tried first; without g++'s sanitizer libraries the guard bytes remain.
const SANITIZE: &[&str] = &[
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
];

/// A kernel source compiled for the CPU; removes its files when dropped.
pub(crate) struct Emulator {
    dir: PathBuf,
    exe: PathBuf,
    runs: AtomicUsize,
}

impl Emulator {
    /// Compiles `source` (the string given to NVRTC) with a driver for the `kernels` named.
    /// Panics when g++ is missing or the source does not compile as C++.
    pub(crate) fn new(source: &str, kernels: &[&str]) -> Emulator {
        Emulator::try_new(source, kernels).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Emulator::new`], compiled once per test process for each source and kernel list
    /// however many tests ask (a compile takes seconds); the files are removed at exit.
    pub(crate) fn shared(source: &str, kernels: &[&str]) -> Arc<Emulator> {
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

    pub(crate) fn try_new(source: &str, kernels: &[&str]) -> Result<Emulator, String> {
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
            eprintln!(
                "kernel emulation: AddressSanitizer/UBSan unusable here, so reads out of bounds \
                 go unnoticed (guard bytes still catch writes); g++'s libasan and libubsan \
                 are needed:\n{why_not}"
            );
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

/// An element type of device buffers and kernel scalars.
pub(crate) trait Elem: Copy {
    /// The driver's type tag (see `Tag` in the C++ driver).
    const TAG: u8;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! elem {
    ($t:ty, $tag:expr) => {
        impl Elem for $t {
            const TAG: u8 = $tag;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }

        /// Scalars by reference, as cudarc's `arg` takes them.
        impl From<&$t> for Arg {
            fn from(v: &$t) -> Arg {
                let mut raw = [0u8; 8];
                let mut bytes = Vec::new();
                v.put(&mut bytes);
                raw[..bytes.len()].copy_from_slice(&bytes);
                Arg::Scalar {
                    tag: <$t as Elem>::TAG,
                    raw: u64::from_le_bytes(raw),
                }
            }
        }
    };
}

elem!(f32, 0);
elem!(i32, 1);
elem!(i64, 2);
elem!(u8, 3);
elem!(u32, 4);

/// A buffer in an emulated [`Device`]'s memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Buf(usize);

/// A kernel argument: a buffer (passed as its device pointer) or a scalar.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    Buf(Buf),
    Scalar { tag: u8, raw: u64 },
}

impl From<Buf> for Arg {
    fn from(b: Buf) -> Arg {
        Arg::Buf(b)
    }
}

impl From<&Buf> for Arg {
    fn from(b: &Buf) -> Arg {
        Arg::Buf(*b)
    }
}

struct Stored {
    tag: u8,
    size: usize,
    bytes: Vec<u8>,
}

struct Queued {
    kernel: String,
    cfg: LaunchConfig,
    args: Vec<Arg>,
}

/// A GPU's memory and stream, emulated: buffers live on the host; launches are queued and run
/// by [`Device::synchronize`].
pub(crate) struct Device<'e> {
    emulator: &'e Emulator,
    buffers: Vec<Stored>,
    queue: Vec<Queued>,
    /// Whether launches also run backwards to look for order dependence (on by default).
    pub(crate) check_order: bool,
}

impl<'e> Device<'e> {
    pub(crate) fn new(emulator: &'e Emulator) -> Device<'e> {
        Device {
            emulator,
            buffers: Vec::new(),
            queue: Vec::new(),
            check_order: true,
        }
    }

    /// A new buffer holding `values`.
    pub(crate) fn htod<T: Elem>(&mut self, values: &[T]) -> Buf {
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(values));
        for v in values {
            v.put(&mut bytes);
        }
        self.buffers.push(Stored {
            tag: T::TAG,
            size: std::mem::size_of::<T>(),
            bytes,
        });
        Buf(self.buffers.len() - 1)
    }

    /// A new buffer of `n` copies of `value` (zeros for `alloc_zeros`; anything else to stand
    /// for what an earlier use left in a reused buffer).
    pub(crate) fn alloc_filled<T: Elem>(&mut self, n: usize, value: T) -> Buf {
        self.htod(&vec![value; n])
    }

    /// Copies `values` to the start of `dst` (which must hold at least as many).
    pub(crate) fn memcpy_htod<T: Elem>(&mut self, values: &[T], dst: Buf) {
        let stored = self.stored(dst, T::TAG);
        let len = stored.bytes.len() / stored.size;
        assert!(values.len() <= len, "{} values into {len}", values.len());
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(values));
        for v in values {
            v.put(&mut bytes);
        }
        self.buffers[dst.0].bytes[..bytes.len()].copy_from_slice(&bytes);
    }

    pub(crate) fn len(&self, b: Buf) -> usize {
        let stored = &self.buffers[b.0];
        stored.bytes.len() / stored.size
    }

    /// The values of `b` (after [`Device::synchronize`]).
    pub(crate) fn dtoh<T: Elem>(&self, b: Buf) -> Vec<T> {
        let stored = self.stored(b, T::TAG);
        stored.bytes.chunks_exact(stored.size).map(T::get).collect()
    }

    /// The buffer `b` for a copy, which the stream would order after the queued launches:
    /// those must have run ([`Device::synchronize`]).
    fn stored(&self, b: Buf, tag: u8) -> &Stored {
        assert!(
            self.queue.is_empty(),
            "synchronize before copying buffers: launches are queued"
        );
        let stored = &self.buffers[b.0];
        assert_eq!(stored.tag, tag, "buffer {} holds another type", b.0);
        stored
    }

    /// Starts a launch of `kernel`, arguments pushed as with cudarc's `launch_builder`.
    pub(crate) fn launch_builder(&mut self, kernel: &str) -> LaunchArgs<'_, 'e> {
        LaunchArgs {
            device: self,
            kernel: kernel.to_string(),
            args: Vec::new(),
        }
    }

    /// Runs the queued launches in order.
    pub(crate) fn synchronize(&mut self) -> Result<(), String> {
        let queue = std::mem::take(&mut self.queue);
        if queue.is_empty() {
            return Ok(());
        }
        let mut input = Vec::new();
        let u32_le = |v: usize, out: &mut Vec<u8>| {
            let v = u32::try_from(v).expect("fits in u32");
            out.extend_from_slice(&v.to_le_bytes());
        };
        input.extend_from_slice(&0x3145_4b52u32.to_le_bytes());
        u32_le(self.buffers.len(), &mut input);
        for b in &self.buffers {
            input.push(b.tag);
            input.extend_from_slice(&((b.bytes.len() / b.size) as u64).to_le_bytes());
            input.extend_from_slice(&b.bytes);
        }
        u32_le(queue.len(), &mut input);
        for q in &queue {
            u32_le(q.kernel.len(), &mut input);
            input.extend_from_slice(q.kernel.as_bytes());
            let (g, b) = (q.cfg.grid_dim, q.cfg.block_dim);
            for v in [g.0, g.1, g.2, b.0, b.1, b.2, q.cfg.shared_mem_bytes] {
                input.extend_from_slice(&v.to_le_bytes());
            }
            u32_le(q.args.len(), &mut input);
            for a in &q.args {
                match a {
                    Arg::Buf(b) => {
                        input.push(0);
                        u32_le(b.0, &mut input);
                    }
                    Arg::Scalar { tag, raw } => {
                        input.push(1);
                        input.push(*tag);
                        input.extend_from_slice(&raw.to_le_bytes());
                    }
                }
            }
        }
        input.push(u8::from(self.check_order));
        let run = self.emulator.runs.fetch_add(1, Ordering::Relaxed);
        let (in_path, out_path) = (
            self.emulator.dir.join(format!("in-{run}.bin")),
            self.emulator.dir.join(format!("out-{run}.bin")),
        );
        std::fs::write(&in_path, &input).map_err(|e| format!("writing launches: {e}"))?;
        let result = Command::new(&self.emulator.exe)
            // The driver exits on the first error without freeing; leaks are not the point.
            .env("ASAN_OPTIONS", "detect_leaks=0")
            .arg(&in_path)
            .arg(&out_path)
            .output()
            .map_err(|e| format!("running the emulator: {e}"));
        let _ = std::fs::remove_file(&in_path);
        let result = result?;
        if !result.status.success() {
            let _ = std::fs::remove_file(&out_path);
            let names: Vec<&str> = queue.iter().map(|q| q.kernel.as_str()).collect();
            return Err(format!(
                "emulated launches {names:?} failed ({}):\n{}",
                result.status,
                String::from_utf8_lossy(&result.stderr)
            ));
        }
        let output = std::fs::read(&out_path).map_err(|e| format!("reading results: {e}"))?;
        let _ = std::fs::remove_file(&out_path);
        let mut at = 0;
        for b in &mut self.buffers {
            let n = b.bytes.len();
            b.bytes.copy_from_slice(
                output
                    .get(at..at + n)
                    .ok_or_else(|| "the emulator wrote too little".to_string())?,
            );
            at += n;
        }
        Ok(())
    }
}

/// One launch's arguments, pushed in order.
pub(crate) struct LaunchArgs<'d, 'e> {
    device: &'d mut Device<'e>,
    kernel: String,
    args: Vec<Arg>,
}

impl LaunchArgs<'_, '_> {
    pub(crate) fn arg(&mut self, a: impl Into<Arg>) -> &mut Self {
        self.args.push(a.into());
        self
    }

    /// Queues the launch (run by [`Device::synchronize`]).
    pub(crate) fn launch(&mut self, cfg: LaunchConfig) {
        self.device.queue.push(Queued {
            kernel: self.kernel.clone(),
            cfg,
            args: std::mem::take(&mut self.args),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Toy kernels exercising what the emulator promises.
    const TOYS: &str = r#"
extern "C" __global__ void ids(unsigned int* out, int width) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    int n = gridDim.x * blockDim.x;
    int m = gridDim.y * blockDim.y;
    out[(z * m + y) * n + x] = (unsigned)(x + 1000 * y + 1000000 * z) + 0 * width;
}
extern "C" __global__ void overrun(float* out, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t > n) return;
    out[t] = 1.0f;
}
extern "C" __global__ void racy(int* out) {
    out[0] = (int)threadIdx.x;
}
extern "C" __global__ void wide(const long long* in, long long* out, long long k) {
    out[threadIdx.x] = in[threadIdx.x] * k;
}
"#;

    fn toys() -> Arc<Emulator> {
        Emulator::shared(TOYS, &["ids", "overrun", "racy", "wide"])
    }

    fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: 0,
        }
    }

    #[test]
    fn every_thread_of_every_block_runs_once_with_its_indices() {
        let emu = toys();
        let mut dev = Device::new(&emu);
        let (grid, block) = ((3, 2, 2), (4, 3, 2));
        let (n, m, l) = (12usize, 6usize, 4usize);
        let out = dev.alloc_filled(n * m * l, u32::MAX);
        dev.launch_builder("ids")
            .arg(out)
            .arg(&0i32)
            .launch(cfg(grid, block));
        dev.synchronize().unwrap();
        let got = dev.dtoh::<u32>(out);
        for z in 0..l {
            for y in 0..m {
                for x in 0..n {
                    let want = (x + 1000 * y + 1_000_000 * z) as u32;
                    assert_eq!(got[(z * m + y) * n + x], want, "({x}, {y}, {z})");
                }
            }
        }
        // 64-bit scalars and buffers pass through whole.
        let input = dev.htod(&[1i64 << 40, -3, 7]);
        let wide = dev.alloc_filled(3, 0i64);
        dev.launch_builder("wide")
            .arg(input)
            .arg(wide)
            .arg(&(1i64 << 20))
            .launch(cfg((1, 1, 1), (3, 1, 1)));
        dev.synchronize().unwrap();
        assert_eq!(dev.dtoh::<i64>(wide), [1 << 60, -3 << 20, 7 << 20]);
    }

    #[test]
    fn bad_launches_are_errors() {
        let emu = toys();
        let mut dev = Device::new(&emu);
        let out = dev.alloc_filled(10, 0f32);
        let ints = dev.alloc_filled(10, 0i32);
        // Out of bounds by one (`t > n` instead of `t >= n`): AddressSanitizer or the guards.
        dev.launch_builder("overrun")
            .arg(out)
            .arg(&10i32)
            .launch(LaunchConfig::for_num_elems(11));
        let e = dev.synchronize().unwrap_err();
        assert!(
            e.contains("heap-buffer-overflow") || e.contains("wrote outside buffer"),
            "{e}"
        );
        let mut fails = |push: &dyn Fn(&mut Device), expected: &str| {
            push(&mut dev);
            let e = dev.synchronize().expect_err(expected);
            assert!(e.contains(expected), "expected `{expected}` in: {e}");
        };
        // Every thread writing one element.
        fails(
            &|d| {
                d.launch_builder("racy")
                    .arg(ints)
                    .launch(cfg((1, 1, 1), (8, 1, 1)))
            },
            "forwards and backwards",
        );
        // A scalar of the wrong width, a buffer of the wrong type, a missing argument.
        fails(
            &|d| {
                d.launch_builder("overrun")
                    .arg(out)
                    .arg(&10i64)
                    .launch(cfg((1, 1, 1), (1, 1, 1)))
            },
            "parameter 1 is int (i32) (4 bytes), but long long (i64) (8 bytes) was pushed",
        );
        fails(
            &|d| {
                d.launch_builder("overrun")
                    .arg(ints)
                    .arg(&10i32)
                    .launch(cfg((1, 1, 1), (1, 1, 1)))
            },
            "points to float (f32), but the buffer holds int (i32)",
        );
        fails(
            &|d| {
                d.launch_builder("overrun")
                    .arg(out)
                    .launch(cfg((1, 1, 1), (1, 1, 1)))
            },
            "takes 2 parameters, but 1 were pushed",
        );
        // CUDA's launch limits.
        for (grid, block, expected) in [
            ((0, 1, 1), (1, 1, 1), "an empty launch"),
            ((1, 1, 1), (0, 1, 1), "an empty launch"),
            ((1, 65_536, 1), (1, 1, 1), "the grid exceeds"),
            ((1, 1, 1), (1025, 1, 1), "the block exceeds"),
            ((1, 1, 1), (64, 32, 1), "the block exceeds"),
        ] {
            fails(
                &|d| {
                    d.launch_builder("overrun")
                        .arg(out)
                        .arg(&0i32)
                        .launch(cfg(grid, block))
                },
                expected,
            );
        }
        // The device still works after failed launches.
        dev.launch_builder("overrun")
            .arg(out)
            .arg(&8i32)
            .launch(cfg((1, 1, 1), (9, 1, 1)));
        dev.synchronize().unwrap();
        assert_eq!(
            dev.dtoh::<f32>(out)[..],
            [1.0; 9].iter().chain(&[0.0]).copied().collect::<Vec<_>>()[..]
        );
    }

    #[test]
    fn guard_bytes_catch_writes_out_of_bounds_without_sanitizers() {
        let emu = Emulator::build(TOYS, &["overrun"], false).unwrap();
        let mut dev = Device::new(&emu);
        let out = dev.alloc_filled(10, 0f32);
        dev.launch_builder("overrun")
            .arg(out)
            .arg(&10i32)
            .launch(LaunchConfig::for_num_elems(11));
        let e = dev.synchronize().unwrap_err();
        assert!(
            e.contains("overrun wrote outside buffer 0 (10 elements)"),
            "{e}"
        );
    }

    #[test]
    fn kernels_needing_threads_together_are_refused() {
        let src = "extern \"C\" __global__ void k(float* x) { __shared__ float s[32]; }";
        let e = Emulator::try_new(src, &["k"]).err().unwrap();
        assert!(e.contains("__shared__"), "{e}");
    }
}
