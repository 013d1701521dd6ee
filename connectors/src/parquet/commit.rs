//! Publishing staged files when their epochs' checkpoint is written, and voiding those of
//! crashed runs. Neither needs a record of its own: the staged names say the generation and
//! last epoch, and publishing is a rename, so a commit repeated after a crash finds what is
//! left to do.

use std::path::{Path, PathBuf};

use riffle_dataflow::sink::Committer;
use riffle_dataflow::{DataflowResult, Epoch};
use riffle_storage::Location;

use super::layout::{staged_generation, Staged, OPEN_SUFFIX, STAGING};
use super::ParquetSinkError;

/// The non-transactional committer of a Parquet sink.
pub struct ParquetCommitter {
    root: Location,
    /// The root as a local folder, to remove the empty folders renames leave there.
    local: Option<PathBuf>,
}

impl ParquetCommitter {
    pub fn new(root: Location, local: Option<PathBuf>) -> Self {
        ParquetCommitter { root, local }
    }

    /// Staged files under `prefix`, by their names as written.
    fn staged(&self, prefix: &str) -> DataflowResult<Vec<String>> {
        let listed = self.root.list(prefix).map_err(ParquetSinkError::from)?;
        Ok(listed.into_iter().map(|(name, _)| name).collect())
    }

    fn tidy(&self) {
        if let Some(dir) = &self.local {
            remove_empty_below(&dir.join(STAGING));
        }
    }
}

impl Committer for ParquetCommitter {
    /// Publishes `generation`'s staged files whose last epoch is at most `through`. A file
    /// already renamed (a commit repeated after a crash) is no longer listed; one copied but
    /// not yet removed (an object store's rename is copy, then delete) is copied again.
    fn commit(&mut self, generation: u64, through: Epoch) -> DataflowResult<()> {
        let mut published = 0usize;
        for name in self.staged(&format!("{STAGING}/{generation}/"))? {
            // A file the sink is still writing (a local folder's), staged when it closes.
            if name.ends_with(OPEN_SUFFIX) {
                continue;
            }
            let Some(staged) = Staged::parse(&name) else {
                tracing::warn!(
                    "parquet sink: leaving `{name}` in the staging folder (not a staged file)"
                );
                continue;
            };
            if staged.last_epoch <= through {
                self.root
                    .rename(&name, &staged.published())
                    .map_err(ParquetSinkError::from)?;
                published += 1;
            }
        }
        if published > 0 {
            tracing::debug!(
                "parquet sink: published {published} file(s) of run {generation} through epoch {through}"
            );
            self.tidy();
        }
        Ok(())
    }

    /// Deletes every staged file of other generations: after the restart's re-commit, what is
    /// left of them was never covered by a checkpoint and is written again by this run.
    fn fence(&mut self, generation: u64) -> DataflowResult<()> {
        let ours = generation.to_string();
        let mut voided = 0usize;
        for name in self.staged(&format!("{STAGING}/"))? {
            if staged_generation(&name) != Some(ours.as_str()) {
                self.root.delete(&name).map_err(ParquetSinkError::from)?;
                voided += 1;
            }
        }
        if voided > 0 {
            tracing::info!(
                "parquet sink: removed {voided} staged file(s) no checkpoint covered (older runs)"
            );
        }
        self.tidy();
        Ok(())
    }
}

/// Removes the empty folders below `dir` (not `dir` itself); errors (a folder not empty after
/// all) are left alone.
fn remove_empty_below(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_empty_below(&path);
            let _ = std::fs::remove_dir(&path);
        }
    }
}
