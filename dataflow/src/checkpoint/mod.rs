//! Checkpoints: where every source stood when an epoch was complete at the sink.
//!
//! One file (or object) per epoch, `epoch-<NNNNNNNNNNNN>.ckpt`: a JSON body and a CRC-32
//! trailer line. In a local directory a file is written to a temporary name, fsynced, renamed
//! into place and the directory fsynced, so a crash leaves either the whole checkpoint or none.
//! On an object store ([`riffle_storage::Location`], `s3://bucket/prefix`) the object is
//! written with a conditional put: it appears whole or not at all and never replaces another.
//! Either way a partial or corrupt checkpoint (a torn write on a shared filesystem, a bad disk,
//! an upload cut short by hand) fails its checksum and the previous one is used.
//!
//! - [`lease`]: one cluster per object-store prefix.
//! - [`generation`]: run generations that grow whatever the clock does.
//! - [`writer`]: an object store's writes on a thread of their own, so a slow store delays
//!   checkpoints instead of the results.

pub mod generation;
pub mod lease;
#[cfg(test)]
mod tests;
pub mod writer;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

use riffle_storage::StorageError;
use serde::{Deserialize, Serialize};

/// An object store's folder, as [`CheckpointStore::on`] takes it.
pub use riffle_storage::{Location, StoreOptions};

use crate::error::{DataflowError, DataflowResult};
use crate::Epoch;

/// Everything needed to resume after `epoch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The last epoch whose results all reached the sink.
    pub epoch: Epoch,
    /// Workers of the run that wrote it (a restart may use another number).
    pub workers: usize,
    /// Per source (its `checkpoint_id`, e.g. `log:cameras`): partition → next offset to read.
    pub sources: BTreeMap<String, BTreeMap<i32, i64>>,
    /// Operator state by operator name, serialised by the operator.
    #[serde(default)]
    pub state: BTreeMap<String, String>,
}

const TRAILER: &str = "\n#crc32:";

/// Where the checkpoints are.
#[derive(Clone, Debug)]
enum Backend {
    Dir(PathBuf),
    Object(Location),
}

/// A directory (local, or any shared path for many hosts) or an object-store prefix of
/// checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    backend: Backend,
    keep: usize,
    /// How long each write took (pruning included), in microseconds, shared by the store's
    /// clones: the run's last line about checkpoints gives their p50/p99
    /// (`docs/benchmarks/checkpoints.md`). A histogram, so a long run's memory stays bounded.
    write_times: Arc<Mutex<Option<Histogram<u64>>>>,
}

/// Checkpoint writes of a run: how many and how long they took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WriteTimes {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// A store's failure as the runtime's error (its message names the URL and the operation).
pub(crate) fn store_error(context: &str, e: StorageError) -> DataflowError {
    DataflowError::io(context, std::io::Error::other(e))
}

impl CheckpointStore {
    /// Opens (creating) `dir`, keeping the newest `keep` checkpoints (at least 2, so a corrupt
    /// newest one always has a predecessor).
    pub fn open(dir: &Path, keep: usize) -> DataflowResult<Self> {
        fs::create_dir_all(dir).map_err(|e| {
            DataflowError::io(
                format!("creating checkpoint directory {}", dir.display()),
                e,
            )
        })?;
        Ok(CheckpointStore {
            backend: Backend::Dir(dir.to_path_buf()),
            keep: keep.max(2),
            write_times: Arc::default(),
        })
    }

    /// Checkpoints as objects under `location` (an object store's prefix), keeping the newest
    /// `keep` (at least 2).
    pub fn on(location: Location, keep: usize) -> Self {
        CheckpointStore {
            backend: Backend::Object(location),
            keep: keep.max(2),
            write_times: Arc::default(),
        }
    }

    /// The local directory, if that is where the checkpoints are.
    pub fn dir(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Dir(dir) => Some(dir),
            Backend::Object(_) => None,
        }
    }

    /// The object-store prefix, if that is where the checkpoints are.
    pub fn location(&self) -> Option<&Location> {
        match &self.backend {
            Backend::Dir(_) => None,
            Backend::Object(at) => Some(at),
        }
    }

    /// The directory's path or the prefix's URL, for messages.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Dir(dir) => dir.display().to_string(),
            Backend::Object(at) => at.url().to_string(),
        }
    }

    fn name_of(epoch: Epoch) -> String {
        format!("epoch-{epoch:012}.ckpt")
    }

    /// The full path or URL of `epoch`'s checkpoint.
    fn where_of(&self, epoch: Epoch) -> String {
        match &self.backend {
            Backend::Dir(dir) => dir.join(Self::name_of(epoch)).display().to_string(),
            Backend::Object(at) => format!("{}/{}", at.url(), Self::name_of(epoch)),
        }
    }

    /// Writes `checkpoint` atomically and prunes old ones; returns where it went.
    pub fn write(&self, checkpoint: &Checkpoint) -> DataflowResult<String> {
        let started = Instant::now();
        let written = self.write_untimed(checkpoint);
        if written.is_ok() {
            if let Ok(mut times) = self.write_times.lock() {
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                if times.is_none() {
                    *times = Histogram::new(3).ok();
                }
                if let Some(h) = times.as_mut() {
                    h.saturating_record(micros.max(1));
                }
            }
        }
        written
    }

    /// The successful writes so far (`None` before the first).
    pub fn write_times(&self) -> Option<WriteTimes> {
        let times = self.write_times.lock().ok()?;
        let h = times.as_ref().filter(|h| !h.is_empty())?;
        let at = |micros: u64| Duration::from_micros(micros);
        Some(WriteTimes {
            count: usize::try_from(h.len()).unwrap_or(usize::MAX),
            p50: at(h.value_at_quantile(0.5)),
            p99: at(h.value_at_quantile(0.99)),
            max: at(h.max()),
        })
    }

    fn write_untimed(&self, checkpoint: &Checkpoint) -> DataflowResult<String> {
        let text = encode(checkpoint)?;
        match &self.backend {
            Backend::Dir(dir) => {
                let path = write_file(dir, &Self::name_of(checkpoint.epoch), &text)?;
                self.prune()?;
                Ok(path.display().to_string())
            }
            Backend::Object(at) => {
                let name = Self::name_of(checkpoint.epoch);
                let bytes = text.into_bytes();
                let written = at
                    .put_new(&name, bytes.clone())
                    .map_err(|e| store_error("writing a checkpoint", e))?;
                if !written {
                    // Ours, when an earlier try's answer was lost; anything else is another
                    // writer's, and never overwritten.
                    let there = at
                        .get(&name)
                        .map_err(|e| store_error("reading back a checkpoint", e))?;
                    if there.as_deref() != Some(&bytes[..]) {
                        return Err(DataflowError::Config(format!(
                            "checkpoint {}/{name} exists with other content: another run \
                             writes checkpoints to this prefix",
                            at.url()
                        )));
                    }
                }
                // The checkpoint is written: an old one left behind is only clutter.
                if let Err(e) = self.prune() {
                    tracing::warn!("pruning old checkpoints: {e}");
                }
                Ok(format!("{}/{name}", at.url()))
            }
        }
    }

    /// Epochs of the checkpoints present, oldest first (unchecked).
    fn epochs(&self) -> DataflowResult<Vec<Epoch>> {
        let parse = |name: &str| -> Option<Epoch> {
            name.strip_prefix("epoch-")?
                .strip_suffix(".ckpt")?
                .parse()
                .ok()
        };
        let mut epochs: Vec<Epoch> = match &self.backend {
            Backend::Dir(dir) => fs::read_dir(dir)
                .map_err(|e| DataflowError::io(format!("listing {}", dir.display()), e))?
                .filter_map(|e| e.ok())
                .filter_map(|e| parse(&e.file_name().to_string_lossy()))
                .collect(),
            Backend::Object(at) => at
                .list("epoch-")
                .map_err(|e| store_error("listing checkpoints", e))?
                .iter()
                .filter_map(|(name, _)| parse(name))
                .collect(),
        };
        epochs.sort_unstable();
        Ok(epochs)
    }

    fn remove(&self, epoch: Epoch, what: &str) -> DataflowResult<()> {
        match &self.backend {
            Backend::Dir(dir) => {
                let path = dir.join(Self::name_of(epoch));
                fs::remove_file(&path)
                    .map_err(|e| DataflowError::io(format!("{what} {}", path.display()), e))
            }
            Backend::Object(at) => at
                .delete(&Self::name_of(epoch))
                .map_err(|e| store_error(what, e)),
        }
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`excess` is at most the number of epochs"
    )]
    fn prune(&self) -> DataflowResult<()> {
        let epochs = self.epochs()?;
        let excess = epochs.len().saturating_sub(self.keep);
        for epoch in &epochs[..excess] {
            self.remove(*epoch, "pruning")?;
        }
        Ok(())
    }

    /// The checkpoint of `epoch`, if it is present and intact.
    pub fn at(&self, epoch: Epoch) -> DataflowResult<Option<Checkpoint>> {
        let Some(text) = self.read_text(epoch)? else {
            return Ok(None);
        };
        text.and_then(|text| decode(&text, epoch))
            .map(Some)
            .map_err(|why| {
                DataflowError::Config(format!(
                    "checkpoint {} is unusable: {why}",
                    self.where_of(epoch)
                ))
            })
    }

    /// The text of `epoch`'s checkpoint (`None`: absent), or why it is unreadable (a local
    /// file's I/O error, text that is not UTF-8): [`Self::latest`] skips those.
    fn read_text(&self, epoch: Epoch) -> DataflowResult<Option<Result<String, String>>> {
        match &self.backend {
            Backend::Dir(dir) => {
                let path = dir.join(Self::name_of(epoch));
                if !path.exists() {
                    return Ok(None);
                }
                Ok(Some(fs::read_to_string(&path).map_err(|e| e.to_string())))
            }
            // A store that fails is an error, never a reason to skip a good checkpoint.
            Backend::Object(at) => Ok(at
                .get(&Self::name_of(epoch))
                .map_err(|e| store_error("reading a checkpoint", e))?
                .map(|bytes| String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string()))),
        }
    }

    /// Removes the checkpoints of epochs after `epoch` (all of them for `None`): written for
    /// transactions that never committed, they must not be resumed from, nor push the one that
    /// matches the output out of the `keep` newest.
    pub fn discard_after(&self, epoch: Option<Epoch>) -> DataflowResult<usize> {
        let mut removed = 0;
        for e in self.epochs()? {
            if epoch.is_none_or(|keep| e > keep) {
                self.remove(e, "removing")?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The newest checkpoint that is complete and intact; corrupt ones are skipped with a
    /// warning.
    pub fn latest(&self) -> DataflowResult<Option<Checkpoint>> {
        for epoch in self.epochs()?.into_iter().rev() {
            let found = match self.read_text(epoch)? {
                // Pruned (or discarded) since the listing.
                None => continue,
                Some(text) => text.and_then(|text| decode(&text, epoch)),
            };
            match found {
                Ok(checkpoint) => return Ok(Some(checkpoint)),
                Err(why) => {
                    tracing::warn!("skipping checkpoint {}: {why}", self.where_of(epoch))
                }
            }
        }
        Ok(None)
    }
}

/// The checkpoint's text: its JSON body and the CRC-32 trailer.
fn encode(checkpoint: &Checkpoint) -> DataflowResult<String> {
    let body = serde_json::to_string(checkpoint)
        .map_err(|e| DataflowError::Config(format!("encoding checkpoint: {e}")))?;
    Ok(format!(
        "{body}{TRAILER}{:08x}\n",
        crc32fast::hash(body.as_bytes())
    ))
}

/// Writes `text` to `dir/name` through a synced temporary file and a synced rename.
fn write_file(dir: &Path, name: &str, text: &str) -> DataflowResult<PathBuf> {
    let path = dir.join(name);
    let tmp = path.with_extension("ckpt.tmp");
    let io = |what: &str, p: &Path, e| DataflowError::io(format!("{what} {}", p.display()), e);
    let mut file = File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
    file.write_all(text.as_bytes())
        .map_err(|e| io("writing", &tmp, e))?;
    file.sync_all().map_err(|e| io("syncing", &tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| io("renaming", &tmp, e))?;
    // The rename itself must survive a crash.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing", dir, e))?;
    Ok(path)
}

/// The checkpoint in `text`, checked against its checksum and its name's epoch.
fn decode(text: &str, epoch: Epoch) -> Result<Checkpoint, String> {
    let (body, trailer) = text
        .rsplit_once(TRAILER)
        .ok_or("no checksum trailer (partial write)")?;
    let expected = u32::from_str_radix(trailer.trim(), 16).map_err(|_| "unreadable checksum")?;
    if crc32fast::hash(body.as_bytes()) != expected {
        return Err("checksum mismatch (corrupt)".into());
    }
    let checkpoint: Checkpoint =
        serde_json::from_str(body).map_err(|e| format!("unreadable body: {e}"))?;
    // A file copied or renamed by hand would resume from another epoch than its name says.
    if checkpoint.epoch != epoch {
        return Err(format!(
            "its body is epoch {}, its name epoch {epoch}",
            checkpoint.epoch
        ));
    }
    Ok(checkpoint)
}
