//! A file sink's output made visible only once a checkpoint covers it.
//!
//! A restart cuts a file sink's output back to the checkpointed position, and what lay past it
//! is written again. Lines written straight into the file after the last checkpoint were seen
//! by its readers (`tail -f`, a loader polling the file) and then taken back: the fault
//! campaign (`scripts/campaign.sh`) counted them. So a run with checkpoints writes into a
//! staging file beside the output (`<name>.<offset>.uncommitted`, whose first byte is byte
//! `offset` of the output), and the sink's [`Committer`] appends to the output what each
//! checkpoint covers once that checkpoint is written. A restart from a checkpoint first
//! publishes from the staging file what the checkpoint covers and the crash left unpublished,
//! then drops the rest. A run without checkpoints writes straight into the file, as before.
//!
//! The sink and its committer both live on worker 0's thread and share [`Staging`].

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use riffle_dataflow::{Committer, DataflowError, DataflowResult, Epoch};

use crate::lines::{create_parent, reopen_at};

/// Once this many published bytes sit at the head of the staging file, the unpublished tail
/// moves to a new one: the staging file stays small however long the run.
const ROTATE_BYTES: u64 = if cfg!(test) { 1 << 16 } else { 64 << 20 };

/// What a file sink and its committer share (one per sink factory).
#[derive(Clone, Debug, Default)]
pub struct Staging(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    /// Set by the committer: this run publishes at checkpoints.
    deferred: bool,
    /// Bytes of the output published (in the file itself).
    published: u64,
    /// Bytes of the output the sink has written (published, staged or still buffered).
    written: u64,
    /// The staging file and the output offset of its first byte, once a write made one.
    staged: Option<(PathBuf, u64)>,
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> DataflowError {
    DataflowError::io(format!("{what} {}", path.display()), e)
}

impl Staging {
    fn state(&self) -> DataflowResult<MutexGuard<'_, State>> {
        self.0
            .lock()
            .map_err(|_| DataflowError::Cluster("a file sink's staging lock was poisoned".into()))
    }

    /// The output file for a run that starts from nothing: created empty, and any staging
    /// file an earlier run left beside it removed.
    pub fn create(&self, path: &Path) -> DataflowResult<File> {
        create_parent(path)?;
        remove_staged(path)?;
        let file = File::create(path).map_err(|e| io_error("creating", path, e))?;
        let mut state = self.state()?;
        state.published = 0;
        state.written = 0;
        state.staged = None;
        Ok(file)
    }

    /// The output file for a run that resumes from a checkpoint at `position`: what the
    /// checkpoint covers is published (from the staging file where a crash left it there),
    /// what lies past it is dropped, and the file is returned positioned at its end.
    pub fn resume(&self, path: &Path, position: u64) -> DataflowResult<File> {
        let length = std::fs::metadata(path).map_or(0, |m| m.len());
        if length < position {
            let (staged, start) = staged_files(path)?
                .into_iter()
                .find(|(file, start)| {
                    *start <= length
                        && std::fs::metadata(file).is_ok_and(|m| start + m.len() >= position)
                })
                .ok_or_else(|| {
                    DataflowError::Config(format!(
                        "{} holds {length} bytes but the checkpoint recorded {position}, and no \
                         staging file beside it holds the rest: the file was changed outside \
                         the pipeline",
                        path.display()
                    ))
                })?;
            append_range(&staged, start, length..position, path)?;
        }
        let file = reopen_at(path, position)?;
        remove_staged(path)?;
        let mut state = self.state()?;
        state.published = position;
        state.written = position;
        state.staged = None;
        Ok(file)
    }

    /// A committer that publishes this sink's output at each checkpoint; from now on its
    /// writes are staged.
    pub fn committer(&self, path: &Path) -> DataflowResult<Box<dyn Committer>> {
        self.state()?.deferred = true;
        Ok(Box::new(FileCommitter {
            staging: self.clone(),
            path: path.to_path_buf(),
            position: None,
        }))
    }

    /// Appends to the output what the staging file holds up to `position`.
    fn publish(&self, path: &Path, position: u64) -> DataflowResult<()> {
        let mut state = self.state()?;
        let Some((staged, start)) = state.staged.clone() else {
            return Ok(());
        };
        if position <= state.published {
            return Ok(());
        }
        append_range(&staged, start, state.published..position, path)?;
        state.published = position;
        // All the sink wrote is in the file now (so none of it waits in a buffer): the staging
        // file goes, and the next write starts another. A run that ended leaves none.
        if state.published == state.written {
            std::fs::remove_file(&staged).map_err(|e| io_error("removing", &staged, e))?;
            state.staged = None;
        }
        Ok(())
    }
}

/// Appends bytes `range` of the output, held by `staged` from output offset `start`, to `path`.
fn append_range(
    staged: &Path,
    start: u64,
    range: std::ops::Range<u64>,
    path: &Path,
) -> DataflowResult<()> {
    let mut from = File::open(staged).map_err(|e| io_error("opening", staged, e))?;
    from.seek(SeekFrom::Start(range.start - start))
        .map_err(|e| io_error("seeking", staged, e))?;
    let mut to = OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| io_error("opening", path, e))?;
    let wanted = range.end - range.start;
    let copied = std::io::copy(&mut from.take(wanted), &mut to)
        .map_err(|e| io_error("publishing staged output to", path, e))?;
    if copied != wanted {
        return Err(DataflowError::Config(format!(
            "{} holds {copied} of the {wanted} staged bytes a checkpoint covers",
            staged.display()
        )));
    }
    to.flush().map_err(|e| io_error("flushing", path, e))
}

/// The staging files beside `path`, with the output offset each starts at.
fn staged_files(path: &Path) -> DataflowResult<Vec<(PathBuf, u64)>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.");
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("listing", &dir, e))?;
        let file_name = entry.file_name();
        let Some(offset) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|rest| rest.strip_suffix(".uncommitted"))
            .and_then(|offset| offset.parse::<u64>().ok())
        else {
            continue;
        };
        found.push((entry.path(), offset));
    }
    Ok(found)
}

fn remove_staged(path: &Path) -> DataflowResult<()> {
    for (file, _) in staged_files(path)? {
        std::fs::remove_file(&file).map_err(|e| io_error("removing", &file, e))?;
    }
    Ok(())
}

fn staged_name(path: &Path, start: u64) -> PathBuf {
    let name = path.file_name().map_or_else(
        || "output".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    path.with_file_name(format!("{name}.{start}.uncommitted"))
}

/// Where a file sink's bytes go: straight into the output, or (in a run with checkpoints)
/// into the staging file. Decided at the first write, when the committer, if any, exists.
pub struct StagedWriter {
    staging: Staging,
    path: PathBuf,
    output: Option<BufWriter<File>>,
    staged: Option<BufWriter<File>>,
    /// Output offset of the next byte written.
    position: u64,
}

impl StagedWriter {
    /// A writer over `output` (from [`Staging::create`] or [`Staging::resume`]), which holds
    /// `position` bytes.
    pub fn new(staging: &Staging, path: &Path, output: File, position: u64) -> Self {
        StagedWriter {
            staging: staging.clone(),
            path: path.to_path_buf(),
            output: Some(BufWriter::with_capacity(256 * 1024, output)),
            staged: None,
            position,
        }
    }

    /// Bytes of the output written so far (published, staged or still buffered).
    pub fn position(&self) -> u64 {
        self.position
    }

    fn target(&mut self) -> std::io::Result<&mut BufWriter<File>> {
        let (deferred, retired) = {
            let state = self.staging.state().map_err(std::io::Error::other)?;
            (state.deferred, state.staged.is_none())
        };
        if retired {
            // Everything it held was published and the committer removed it.
            self.staged = None;
        }
        if deferred && self.staged.is_none() {
            // The output file itself only grows through the committer from now on.
            self.output = None;
            self.staged = Some(self.new_staging_file(self.position, &[])?);
        }
        match (&mut self.staged, &mut self.output) {
            (Some(staged), _) => Ok(staged),
            (None, Some(output)) => Ok(output),
            (None, None) => Err(std::io::Error::other("the file sink's output is closed")),
        }
    }

    /// A staging file whose first byte is output offset `start`, holding `head` first.
    fn new_staging_file(&self, start: u64, head: &[u8]) -> std::io::Result<BufWriter<File>> {
        let name = staged_name(&self.path, start);
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&name)?;
        file.write_all(head)?;
        self.staging.state().map_err(std::io::Error::other)?.staged = Some((name, start));
        Ok(BufWriter::with_capacity(256 * 1024, file))
    }

    /// Moves the unpublished tail to a new staging file once enough of the current one is
    /// published.
    fn rotate(&mut self) -> std::io::Result<()> {
        let (published, staged) = {
            let state = self.staging.state().map_err(std::io::Error::other)?;
            (state.published, state.staged.clone())
        };
        let Some((old, start)) = staged else {
            return Ok(());
        };
        if published < start + ROTATE_BYTES {
            return Ok(());
        }
        let mut tail = Vec::new();
        let mut from = File::open(&old)?;
        from.seek(SeekFrom::Start(published - start))?;
        from.read_to_end(&mut tail)?;
        self.staged = Some(self.new_staging_file(published, &tail)?);
        std::fs::remove_file(&old)
    }
}

impl Write for StagedWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.target()?.write(bytes)?;
        self.position += n as u64;
        self.staging.state().map_err(std::io::Error::other)?.written = self.position;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(output) = self.output.as_mut() {
            output.flush()?;
        }
        if let Some(staged) = self.staged.as_mut() {
            staged.flush()?;
            self.rotate()?;
        }
        Ok(())
    }
}

/// Publishes a file sink's staged output up to the position each checkpoint records.
struct FileCommitter {
    staging: Staging,
    path: PathBuf,
    position: Option<u64>,
}

impl Committer for FileCommitter {
    fn sink_position(&mut self, at: u64) {
        self.position = Some(at);
    }

    fn commit(&mut self, _generation: u64, _through: Epoch) -> DataflowResult<()> {
        match self.position.take() {
            Some(at) => self.staging.publish(&self.path, at),
            None => Ok(()),
        }
    }

    /// Nothing to void: a restart drops the staged bytes past its checkpoint
    /// ([`Staging::resume`]).
    fn fence(&mut self, _generation: u64) -> DataflowResult<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    #[test]
    fn without_a_committer_bytes_go_straight_into_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let staging = Staging::default();
        let mut w = StagedWriter::new(&staging, &path, staging.create(&path).unwrap(), 0);
        w.write_all(b"a\nb\n").unwrap();
        w.flush().unwrap();
        assert_eq!(read(&path), "a\nb\n");
        assert!(staged_files(&path).unwrap().is_empty());
    }

    #[test]
    fn with_a_committer_the_file_shows_only_what_a_checkpoint_covers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let staging = Staging::default();
        let mut w = StagedWriter::new(&staging, &path, staging.create(&path).unwrap(), 0);
        let mut committer = staging.committer(&path).unwrap();
        w.write_all(b"1\n2\n").unwrap();
        w.flush().unwrap();
        assert_eq!(read(&path), "", "nothing is visible before a checkpoint");
        committer.sink_position(2);
        committer.commit(1, 0).unwrap();
        assert_eq!(read(&path), "1\n");
        w.write_all(b"3\n").unwrap();
        w.flush().unwrap();
        committer.sink_position(6);
        committer.commit(1, 1).unwrap();
        assert_eq!(read(&path), "1\n2\n3\n");
        // A commit without a new position (an unchanged checkpoint) publishes nothing more.
        committer.commit(1, 2).unwrap();
        assert_eq!(read(&path), "1\n2\n3\n");
        // Everything written is published: no staging file is left, and the next write
        // starts a new one where the output ends.
        assert!(staged_files(&path).unwrap().is_empty());
        w.write_all(b"4\n").unwrap();
        w.flush().unwrap();
        assert_eq!(staged_files(&path).unwrap()[0].1, 6);
        committer.sink_position(8);
        committer.commit(1, 3).unwrap();
        assert_eq!(read(&path), "1\n2\n3\n4\n");
    }

    #[test]
    fn a_restart_publishes_what_the_checkpoint_covers_and_drops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let staging = Staging::default();
        let mut w = StagedWriter::new(&staging, &path, staging.create(&path).unwrap(), 0);
        let mut committer = staging.committer(&path).unwrap();
        w.write_all(b"1\n2\n3\n").unwrap();
        w.flush().unwrap();
        committer.sink_position(2);
        committer.commit(1, 0).unwrap();
        // The checkpoint at 4 is written, then the process dies before its commit.
        drop((w, committer));
        assert_eq!(read(&path), "1\n");
        let staging = Staging::default();
        let file = staging.resume(&path, 4).unwrap();
        assert_eq!(read(&path), "1\n2\n", "the checkpoint's bytes, and no more");
        assert!(staged_files(&path).unwrap().is_empty());
        let mut w = StagedWriter::new(&staging, &path, file, 4);
        let mut committer = staging.committer(&path).unwrap();
        w.write_all(b"3\n4\n").unwrap();
        w.flush().unwrap();
        committer.sink_position(8);
        committer.commit(2, 1).unwrap();
        assert_eq!(read(&path), "1\n2\n3\n4\n");
    }

    #[test]
    fn a_restart_without_the_staged_bytes_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, "1\n").unwrap();
        let e = Staging::default()
            .resume(&path, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no staging file"), "{e}");
    }

    #[test]
    fn the_staging_file_rotates_once_its_head_is_published() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let staging = Staging::default();
        let mut w = StagedWriter::new(&staging, &path, staging.create(&path).unwrap(), 0);
        let mut committer = staging.committer(&path).unwrap();
        w.write_all(&vec![b'x'; ROTATE_BYTES as usize]).unwrap();
        w.flush().unwrap();
        committer.sink_position(ROTATE_BYTES);
        committer.commit(1, 0).unwrap();
        w.write_all(b"tail").unwrap();
        w.flush().unwrap();
        let files = staged_files(&path).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            files[0].1, ROTATE_BYTES,
            "the new staging file starts where publishing ended"
        );
        assert_eq!(std::fs::metadata(&files[0].0).unwrap().len(), 4);
        committer.sink_position(ROTATE_BYTES + 4);
        committer.commit(1, 1).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), ROTATE_BYTES + 4);
    }
}
