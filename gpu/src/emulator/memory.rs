//! The emulated GPU's memory and stream: buffers on the host, launches queued and run by the
//! compiled driver in a child process.

use std::process::Command;
use std::sync::atomic::Ordering;

use cudarc::driver::LaunchConfig;

use super::Emulator;

/// An element type of device buffers and kernel scalars.
pub trait Elem: Copy {
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
            #[allow(clippy::indexing_slicing, reason = "scalars are at most 8 bytes")]
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

/// A buffer in an emulated [`Memory`]'s memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf(usize);

/// A kernel argument: a buffer (passed as its device pointer) or a scalar.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
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
/// by [`Memory::synchronize`].
pub struct Memory<'e> {
    emulator: &'e Emulator,
    buffers: Vec<Stored>,
    queue: Vec<Queued>,
    /// Whether launches also run backwards to look for order dependence (on by default).
    pub check_order: bool,
}

impl<'e> Memory<'e> {
    pub fn new(emulator: &'e Emulator) -> Memory<'e> {
        Memory {
            emulator,
            buffers: Vec::new(),
            queue: Vec::new(),
            check_order: true,
        }
    }

    /// A new buffer holding `values`.
    pub fn htod<T: Elem>(&mut self, values: &[T]) -> Buf {
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
    pub fn alloc_filled<T: Elem>(&mut self, n: usize, value: T) -> Buf {
        self.htod(&vec![value; n])
    }

    /// Copies `values` to the start of `dst` (which must hold at least as many).
    #[allow(
        clippy::indexing_slicing,
        reason = "a `Buf` is an index this memory handed out, and the values were checked to fit it"
    )]
    pub fn memcpy_htod<T: Elem>(&mut self, values: &[T], dst: Buf) {
        let stored = self.stored(dst, T::TAG);
        let len = stored.bytes.len() / stored.size;
        assert!(values.len() <= len, "{} values into {len}", values.len());
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(values));
        for v in values {
            v.put(&mut bytes);
        }
        self.buffers[dst.0].bytes[..bytes.len()].copy_from_slice(&bytes);
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "a `Buf` is an index this memory handed out"
    )]
    pub fn len(&self, b: Buf) -> usize {
        let stored = &self.buffers[b.0];
        stored.bytes.len() / stored.size
    }

    /// The values of `b` (after [`Memory::synchronize`]).
    pub fn dtoh<T: Elem>(&self, b: Buf) -> Vec<T> {
        let stored = self.stored(b, T::TAG);
        stored.bytes.chunks_exact(stored.size).map(T::get).collect()
    }

    /// The buffer `b` for a copy, which the stream would order after the queued launches:
    /// those must have run ([`Memory::synchronize`]).
    #[allow(
        clippy::indexing_slicing,
        reason = "a `Buf` is an index this memory handed out"
    )]
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
    pub fn launch_builder(&mut self, kernel: &str) -> LaunchArgs<'_, 'e> {
        LaunchArgs {
            device: self,
            kernel: kernel.to_string(),
            args: Vec::new(),
        }
    }

    /// Runs the queued launches in order.
    pub fn synchronize(&mut self) -> Result<(), String> {
        let queue = std::mem::take(&mut self.queue);
        if queue.is_empty() {
            return Ok(());
        }
        let mut input = Vec::new();
        // Counts and indices go to the driver as u32: more than 4 G of anything is a bug here.
        let u32_le = |v: usize, out: &mut Vec<u8>| -> Result<(), String> {
            let v = u32::try_from(v).map_err(|_| format!("{v} does not fit the driver's u32"))?;
            out.extend_from_slice(&v.to_le_bytes());
            Ok(())
        };
        input.extend_from_slice(&0x3145_4b52u32.to_le_bytes());
        u32_le(self.buffers.len(), &mut input)?;
        for b in &self.buffers {
            input.push(b.tag);
            input.extend_from_slice(&((b.bytes.len() / b.size) as u64).to_le_bytes());
            input.extend_from_slice(&b.bytes);
        }
        u32_le(queue.len(), &mut input)?;
        for q in &queue {
            u32_le(q.kernel.len(), &mut input)?;
            input.extend_from_slice(q.kernel.as_bytes());
            let (g, b) = (q.cfg.grid_dim, q.cfg.block_dim);
            for v in [g.0, g.1, g.2, b.0, b.1, b.2, q.cfg.shared_mem_bytes] {
                input.extend_from_slice(&v.to_le_bytes());
            }
            u32_le(q.args.len(), &mut input)?;
            for a in &q.args {
                match a {
                    Arg::Buf(b) => {
                        input.push(0);
                        u32_le(b.0, &mut input)?;
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
pub struct LaunchArgs<'d, 'e> {
    device: &'d mut Memory<'e>,
    kernel: String,
    args: Vec<Arg>,
}

impl LaunchArgs<'_, '_> {
    pub fn arg(&mut self, a: impl Into<Arg>) -> &mut Self {
        self.args.push(a.into());
        self
    }

    /// Queues the launch (run by [`Memory::synchronize`]).
    pub fn launch(&mut self, cfg: LaunchConfig) {
        self.device.queue.push(Queued {
            kernel: self.kernel.clone(),
            cfg,
            args: std::mem::take(&mut self.args),
        });
    }
}
