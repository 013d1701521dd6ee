//! One run per output: an exclusive lock on the checkpoint directory and on every file the
//! sinks write, held for the whole run.
//!
//! Two clusters resuming from the same checkpoint into the same results file would both write
//! them: results lost, duplicated and interleaved mid-line. The locks are `flock`s (released by
//! the kernel when the last descriptor closes, so a `kill -9` never leaves a stale one), on
//! `riffle.lock` inside the checkpoint directory and on a hidden `.<name>.lock` beside each
//! output file. A supervisor passes its descriptors down to its processes, so the locks last
//! until the last process of the cluster has exited.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::Pipeline;

/// Why the run could not take its locks.
#[derive(Debug, Error)]
pub enum LockError {
    #[error(
        "{what} {guarded} is in use by another riffle run ({holder}lock {path}): stop it first, \
         or give this run another output or checkpoint directory (--output, --checkpoint-dir)",
        guarded = .guarded.display(),
        path = .path.display(),
        holder = .pid.map(|p| format!("pid {p}, ")).unwrap_or_default()
    )]
    Held {
        /// What the lock guards: "checkpoint directory" or "output file".
        what: &'static str,
        guarded: PathBuf,
        path: PathBuf,
        pid: Option<u32>,
    },
    #[error("cannot lock {path}: {cause}", path = .path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// The locks of one run; dropping it releases them (unless descriptors were passed on).
#[derive(Debug)]
pub struct RunLock {
    files: Vec<(PathBuf, File)>,
}

impl RunLock {
    /// Takes the locks of `pipeline`'s checkpoint directory and output files, failing at once
    /// if another run holds any of them.
    pub fn acquire(pipeline: &Pipeline) -> Result<RunLock, LockError> {
        let mut lock = RunLock { files: Vec::new() };
        for guard in guards(pipeline) {
            lock.take(guard)?;
        }
        Ok(lock)
    }

    /// The lock files, in the order taken.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// The descriptors, for a supervisor to leave open in its children.
    #[cfg(unix)]
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.files.iter().map(|(_, f)| f.as_raw_fd()).collect()
    }

    fn take(&mut self, guard: Guard) -> Result<(), LockError> {
        let path = guard.lock;
        let io = |cause| LockError::Io {
            path: path.clone(),
            cause,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let pid = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse().ok());
                return Err(LockError::Held {
                    what: guard.what,
                    guarded: guard.guarded,
                    path,
                    pid,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        // The holder's pid, for the message a second run prints.
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(io)?;
        self.files.push((path, file));
        Ok(())
    }
}

/// A lock file and what it guards.
struct Guard {
    what: &'static str,
    guarded: PathBuf,
    lock: PathBuf,
}

/// The lock files of `pipeline`: one in the checkpoint directory, one beside each output file.
pub fn lock_paths(pipeline: &Pipeline) -> Vec<PathBuf> {
    guards(pipeline).into_iter().map(|g| g.lock).collect()
}

fn guards(pipeline: &Pipeline) -> Vec<Guard> {
    let mut guards: Vec<Guard> = Vec::new();
    // An object store's prefix has its lease instead (riffle_dataflow::checkpoint::lease).
    if let Some(dir) = pipeline
        .runtime
        .checkpoint
        .as_ref()
        .and_then(|c| c.dir.as_ref())
    {
        guards.push(Guard {
            what: "checkpoint directory",
            guarded: dir.clone(),
            lock: dir.join("riffle.lock"),
        });
    }
    for output in pipeline
        .spec
        .sink
        .value
        .kind()
        .outputs()
        .into_iter()
        .chain(pipeline.dead_letter_config.kind().outputs())
    {
        let name = output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let lock = output.with_file_name(format!(".{name}.lock"));
        if guards.iter().all(|g| g.lock != lock) {
            guards.push(Guard {
                what: "output file",
                guarded: output.to_path_buf(),
                lock,
            });
        }
    }
    guards
}
