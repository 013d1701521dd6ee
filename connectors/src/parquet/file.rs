//! Where an open file's bytes go. Into an object store a file is built in memory and put whole
//! when it closes (a PUT is all or nothing). Into a local folder it is written straight to disk
//! as it is encoded, under a temporary name in the staging folder, then synced and renamed to
//! its staged name (or linked to its published one): no copy of the whole file in memory, and
//! a name that says "complete" only ever names a complete, durable file.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use parquet::arrow::ArrowWriter;
use parquet::errors::ParquetError;

use super::ParquetSinkError;

/// How many times a step is retried when the committer, tidying the staging folder, removed
/// an empty folder the step needs.
const FOLDER_RACES: usize = 8;

/// An open file's writer.
pub enum Output {
    Memory(ArrowWriter<Vec<u8>>),
    /// `temp`: the file being written, inside the local root's staging folder. (The Parquet
    /// writer buffers its writes itself.)
    Disk {
        writer: ArrowWriter<File>,
        temp: Temp,
    },
}

/// A closed file, ready to be given its name.
pub enum Closed {
    Memory(Vec<u8>),
    /// Complete and synced, still under its temporary name.
    Disk(Temp),
}

/// A file under its temporary name: removed if dropped before it is given its own (a run
/// that fails or stops with files open leaves none behind).
pub struct Temp {
    path: PathBuf,
    armed: bool,
}

impl Temp {
    pub fn new(path: PathBuf) -> Temp {
        Temp { path, armed: true }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Output {
    pub fn write(&mut self, batch: &arrow_array::RecordBatch) -> Result<(), ParquetError> {
        match self {
            Output::Memory(w) => w.write(batch),
            Output::Disk { writer, .. } => writer.write(batch),
        }
    }

    /// Writes the footer. `sync` (a file a checkpoint will cover): on disk, syncs the file so
    /// that a crash of the machine cannot leave a checkpoint covering rows the disk lost.
    pub fn close(self, url: &str, sync: bool) -> Result<Closed, ParquetSinkError> {
        match self {
            Output::Memory(w) => Ok(Closed::Memory(w.into_inner().map_err(|e| {
                ParquetSinkError::Parquet {
                    url: url.to_string(),
                    what: "closing a file",
                    source: e,
                }
            })?)),
            Output::Disk { writer, temp } => {
                let file = writer.into_inner().map_err(|e| ParquetSinkError::Parquet {
                    url: temp.path.display().to_string(),
                    what: "closing a file",
                    source: e,
                })?;
                if sync {
                    file.sync_all()
                        .map_err(|e| io_error("syncing", &temp.path, e))?;
                }
                Ok(Closed::Disk(temp))
            }
        }
    }
}

pub fn io_error(what: &'static str, path: &Path, source: io::Error) -> ParquetSinkError {
    ParquetSinkError::Io {
        path: path.display().to_string(),
        what,
        source,
    }
}

/// Runs `step`, creating `path`'s folder and trying again when it is missing.
fn in_folder<T>(path: &Path, mut step: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 0;
    loop {
        match step() {
            Err(e) if e.kind() == io::ErrorKind::NotFound && tries < FOLDER_RACES => {
                tries += 1;
                if let Some(folder) = path.parent() {
                    std::fs::create_dir_all(folder)?;
                }
            }
            done => return done,
        }
    }
}

/// Creates the file `temp` (and its folder).
pub fn create(temp: &Path) -> Result<File, ParquetSinkError> {
    in_folder(temp, || File::create(temp)).map_err(|e| io_error("creating", temp, e))
}

/// Renames the closed file `temp` to `to`, replacing what is there (a staged name is this
/// run's alone), and syncs the folder so the new name survives a crash of the machine.
pub fn rename(mut temp: Temp, to: &Path) -> Result<(), ParquetSinkError> {
    in_folder(to, || std::fs::rename(&temp.path, to))
        .map_err(|e| io_error("renaming", &temp.path, e))?;
    temp.armed = false;
    sync_folder(to)
}

/// Links the closed file `temp` to `to` unless something is there already (`false`), then
/// removes `temp`: a published name is never overwritten. (For runs without checkpoints, which
/// promise nothing about a crash: nothing is synced.)
pub fn link_new(temp: &mut Temp, to: &Path) -> Result<bool, ParquetSinkError> {
    match in_folder(to, || std::fs::hard_link(&temp.path, to)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(io_error("publishing", &temp.path, e)),
    }
    std::fs::remove_file(&temp.path).map_err(|e| io_error("removing", &temp.path, e))?;
    temp.armed = false;
    Ok(true)
}

fn sync_folder(path: &Path) -> Result<(), ParquetSinkError> {
    let Some(folder) = path.parent() else {
        return Ok(());
    };
    File::open(folder)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_error("syncing the folder of", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_made_and_a_published_name_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/one.open");
        drop(create(&path).unwrap());
        std::fs::write(&path, b"1").unwrap();
        let staged = dir.path().join("c/d/one.staged");
        rename(Temp::new(path.clone()), &staged).unwrap();
        assert_eq!(std::fs::read(&staged).unwrap(), b"1");
        assert!(!path.exists());

        let path = dir.path().join("a/two.open");
        std::fs::write(&path, b"2").unwrap();
        let mut second = Temp::new(path.clone());
        assert!(
            !link_new(&mut second, &staged).unwrap(),
            "taken: not replaced"
        );
        assert_eq!(std::fs::read(&staged).unwrap(), b"1");
        let free = dir.path().join("e/part.parquet");
        assert!(link_new(&mut second, &free).unwrap());
        drop(second);
        assert_eq!(std::fs::read(&free).unwrap(), b"2");
        assert!(!path.exists(), "the temporary name is gone");
    }

    #[test]
    fn a_file_dropped_before_it_is_named_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.open");
        std::fs::write(&path, b"partial").unwrap();
        drop(Temp::new(path.clone()));
        assert!(!path.exists());
        let e = rename(Temp::new(dir.path().join("gone")), &dir.path().join("y"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("renaming"), "{e}");
    }
}
