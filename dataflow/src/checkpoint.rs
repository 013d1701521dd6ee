//! Checkpoints: where every source stood when an epoch was complete at the sink.
//!
//! One file per epoch, `epoch-<NNNNNNNNNNNN>.ckpt`: a JSON body and a CRC-32 trailer line.
//! Files are written to a temporary name, fsynced, renamed into place and the directory fsynced,
//! so a crash leaves either the whole checkpoint or none; a partial or corrupt file (a torn
//! write on a shared filesystem, a bad disk) fails its checksum and the previous one is used.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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

/// A directory of checkpoints (local, or any shared path for many hosts).
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep: usize,
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
            dir: dir.to_path_buf(),
            keep: keep.max(2),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, epoch: Epoch) -> PathBuf {
        self.dir.join(format!("epoch-{epoch:012}.ckpt"))
    }

    /// Writes `checkpoint` atomically and prunes old ones.
    pub fn write(&self, checkpoint: &Checkpoint) -> DataflowResult<PathBuf> {
        let body = serde_json::to_string(checkpoint)
            .map_err(|e| DataflowError::Config(format!("encoding checkpoint: {e}")))?;
        let text = format!("{body}{TRAILER}{:08x}\n", crc32fast::hash(body.as_bytes()));
        let path = self.path_of(checkpoint.epoch);
        let tmp = path.with_extension("ckpt.tmp");
        let io = |what: &str, p: &Path, e| DataflowError::io(format!("{what} {}", p.display()), e);
        let mut file = File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
        file.write_all(text.as_bytes())
            .map_err(|e| io("writing", &tmp, e))?;
        file.sync_all().map_err(|e| io("syncing", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| io("renaming", &tmp, e))?;
        // The rename itself must survive a crash.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("syncing", &self.dir, e))?;
        self.prune()?;
        Ok(path)
    }

    /// Epochs of the checkpoint files present, oldest first (unchecked).
    fn epochs(&self) -> DataflowResult<Vec<Epoch>> {
        let entries = fs::read_dir(&self.dir)
            .map_err(|e| DataflowError::io(format!("listing {}", self.dir.display()), e))?;
        let mut epochs: Vec<Epoch> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("epoch-")?
                    .strip_suffix(".ckpt")?
                    .parse()
                    .ok()
            })
            .collect();
        epochs.sort_unstable();
        Ok(epochs)
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`excess` is at most the number of epochs"
    )]
    fn prune(&self) -> DataflowResult<()> {
        let epochs = self.epochs()?;
        let excess = epochs.len().saturating_sub(self.keep);
        for epoch in &epochs[..excess] {
            let path = self.path_of(*epoch);
            fs::remove_file(&path)
                .map_err(|e| DataflowError::io(format!("pruning {}", path.display()), e))?;
        }
        Ok(())
    }

    /// The checkpoint of `epoch`, if its file is present and intact.
    pub fn at(&self, epoch: Epoch) -> DataflowResult<Option<Checkpoint>> {
        let path = self.path_of(epoch);
        if !path.exists() {
            return Ok(None);
        }
        read(&path, epoch).map(Some).map_err(|why| {
            DataflowError::Config(format!("checkpoint {} is unusable: {why}", path.display()))
        })
    }

    /// Removes the checkpoints of epochs after `epoch` (all of them for `None`): written for
    /// transactions that never committed, they must not be resumed from, nor push the one that
    /// matches the output out of the `keep` newest.
    pub fn discard_after(&self, epoch: Option<Epoch>) -> DataflowResult<usize> {
        let mut removed = 0;
        for e in self.epochs()? {
            if epoch.is_none_or(|keep| e > keep) {
                let path = self.path_of(e);
                fs::remove_file(&path).map_err(|err| {
                    DataflowError::io(format!("removing {}", path.display()), err)
                })?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The newest checkpoint that is complete and intact; corrupt ones are skipped with a
    /// warning.
    pub fn latest(&self) -> DataflowResult<Option<Checkpoint>> {
        for epoch in self.epochs()?.into_iter().rev() {
            let path = self.path_of(epoch);
            match read(&path, epoch) {
                Ok(checkpoint) => return Ok(Some(checkpoint)),
                Err(why) => tracing::warn!("skipping checkpoint {}: {why}", path.display()),
            }
        }
        Ok(None)
    }
}

fn read(path: &Path, epoch: Epoch) -> Result<Checkpoint, String> {
    let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(epoch: Epoch, offset: i64) -> Checkpoint {
        Checkpoint {
            epoch,
            workers: 2,
            sources: BTreeMap::from([(
                "log:t".to_string(),
                BTreeMap::from([(0, offset), (1, offset + 1)]),
            )]),
            state: BTreeMap::new(),
        }
    }

    #[test]
    fn newest_intact_checkpoint_wins_and_old_ones_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        assert_eq!(store.latest().unwrap(), None);
        for e in 1..=5 {
            store.write(&checkpoint(e, e as i64 * 10)).unwrap();
        }
        assert_eq!(store.latest().unwrap(), Some(checkpoint(5, 50)));
        assert_eq!(store.epochs().unwrap(), vec![3, 4, 5], "pruned to 3");
        assert!(!dir.path().join("epoch-000000000005.ckpt.tmp").exists());
    }

    #[test]
    fn a_given_epoch_is_found_and_newer_ones_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        for e in 1..=3 {
            store.write(&checkpoint(e, e as i64 * 10)).unwrap();
        }
        assert_eq!(store.at(2).unwrap(), Some(checkpoint(2, 20)));
        assert_eq!(store.at(7).unwrap(), None);
        assert_eq!(store.discard_after(Some(1)).unwrap(), 2);
        assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
        assert_eq!(store.discard_after(None).unwrap(), 1);
        assert_eq!(store.latest().unwrap(), None);
    }

    #[test]
    fn corrupt_or_partial_newest_checkpoint_falls_back_to_the_previous() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 5).unwrap();
        store.write(&checkpoint(1, 10)).unwrap();
        let newest = store.write(&checkpoint(2, 20)).unwrap();
        // A flipped digit in the body: the checksum catches it.
        let text = fs::read_to_string(&newest).unwrap().replace("20", "21");
        fs::write(&newest, text).unwrap();
        assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
        // A torn write: no trailer.
        let text = fs::read_to_string(&newest).unwrap();
        fs::write(&newest, &text[..text.len() / 2]).unwrap();
        assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
        // An empty file.
        fs::write(&newest, "").unwrap();
        assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    }
}
