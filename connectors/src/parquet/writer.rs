//! The writer: rows go into one open Parquet file per partition folder (on disk for a local
//! folder, in memory for an object store: [`super::file`]); at an epoch boundary where the roll
//! is due, every open file is closed and given its name, staged (runs with checkpoints,
//! published later by [`super::commit`]) or published at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use riffle_dataflow::sink::Sink;
use riffle_dataflow::{DataflowError, DataflowResult, Epoch};
use riffle_storage::Location;

use super::file::{self, Closed, Output, Temp};
use super::layout::{open_name, unstaged, Staged, STAGING};
use super::partition::Partitioner;
use super::ParquetSinkError;

/// Added to the position while a file is open. The checkpointer takes the newest epoch whose
/// position is at most the durable count (rows in closed files); with plain row counts an
/// epoch in the middle of a file would qualify as soon as that file closed, and a checkpoint
/// there would cover rows of a file that is only published with later epochs. With the mark,
/// only epochs that end with every file closed can be checkpointed.
pub const OPEN_FILE_MARK: u64 = 1 << 62;

/// When the open files are closed: at the first epoch boundary after either is reached.
#[derive(Clone, Copy, Debug)]
pub struct Roll {
    pub rows: u64,
    pub after: Duration,
}

/// Writes results as Parquet files under one root (a local folder or an object-store prefix).
pub struct ParquetSink {
    root: Location,
    /// The root as a local folder: files are written there directly instead of in memory.
    local: Option<PathBuf>,
    /// Files opened so far (names them while they are written).
    opened: u64,
    partitioner: Partitioner,
    props: WriterProperties,
    roll: Roll,
    /// The run's generation, once the runtime gives one (runs with checkpoints).
    generation: Option<u64>,
    epoch: Epoch,
    /// Names this run's files when there are no checkpoints (milliseconds at open).
    run: u64,
    seq: u64,
    open: BTreeMap<String, OpenFile>,
    opened_at: Option<Instant>,
    open_rows: u64,
    handed: u64,
    durable: Arc<AtomicU64>,
}

struct OpenFile {
    output: Output,
    schema: SchemaRef,
    first_epoch: Epoch,
    last_epoch: Epoch,
}

impl ParquetSink {
    /// `local`: the root as a local folder, if it is one.
    pub fn new(
        root: Location,
        local: Option<PathBuf>,
        partitioner: Partitioner,
        props: WriterProperties,
        roll: Roll,
    ) -> Self {
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        ParquetSink {
            root,
            local,
            opened: 0,
            partitioner,
            props,
            roll,
            generation: None,
            epoch: 0,
            run,
            seq: 0,
            open: BTreeMap::new(),
            opened_at: None,
            open_rows: 0,
            handed: 0,
            durable: Arc::new(AtomicU64::new(0)),
        }
    }

    fn parquet(&self, what: &'static str, e: parquet::errors::ParquetError) -> DataflowError {
        ParquetSinkError::Parquet {
            url: self.root.url().to_string(),
            what,
            source: e,
        }
        .into()
    }

    fn roll_due(&self) -> bool {
        self.open_rows > 0
            && (self.open_rows >= self.roll.rows
                || self
                    .opened_at
                    .is_some_and(|t| t.elapsed() >= self.roll.after))
    }

    /// A new file for rows of `schema`, opened in the current epoch.
    fn open_file(&mut self, schema: SchemaRef) -> DataflowResult<OpenFile> {
        let props = Some(self.props.clone());
        let output = match &self.local {
            Some(dir) => {
                let name = open_name(self.generation, self.run, self.opened);
                let temp = Temp::new(dir.join(name));
                self.opened += 1;
                let created = file::create(temp.path())?;
                let writer = ArrowWriter::try_new(created, schema.clone(), props)
                    .map_err(|e| self.parquet("opening a file", e))?;
                Output::Disk { writer, temp }
            }
            None => Output::Memory(
                ArrowWriter::try_new(Vec::new(), schema.clone(), props)
                    .map_err(|e| self.parquet("opening a file", e))?,
            ),
        };
        Ok(OpenFile {
            output,
            schema,
            first_epoch: self.epoch,
            last_epoch: self.epoch,
        })
    }

    /// Closes every open file and gives it its name: staged under this generation, or
    /// published when the run has none.
    fn close_all(&mut self) -> DataflowResult<()> {
        let files = std::mem::take(&mut self.open);
        for (partition, file) in files {
            let closed = file
                .output
                .close(self.root.url(), self.generation.is_some())?;
            match self.generation {
                Some(generation) => {
                    let name = Staged {
                        generation,
                        partition,
                        first_epoch: file.first_epoch,
                        last_epoch: file.last_epoch,
                        seq: self.seq,
                    }
                    .name();
                    match (closed, &self.local) {
                        (Closed::Disk(temp), Some(dir)) => file::rename(temp, &dir.join(name))?,
                        (Closed::Memory(bytes), _) => self
                            .root
                            .put(&name, bytes)
                            .map_err(ParquetSinkError::from)?,
                        (Closed::Disk(_), None) => return Err(self.no_folder()),
                    }
                }
                None => self.publish_new(&partition, closed)?,
            }
            self.seq += 1;
        }
        if let (None, Some(dir)) = (self.generation, &self.local) {
            // No commit tidies up after a run without checkpoints: the folder its open files
            // were in goes (`remove_dir` leaves it if anything else is there).
            let _ = std::fs::remove_dir(dir.join(STAGING));
        }
        self.durable.fetch_add(self.open_rows, Ordering::Release);
        self.open_rows = 0;
        self.opened_at = None;
        Ok(())
    }

    /// Publishes a file of a run without checkpoints under a name nothing holds yet.
    fn publish_new(&mut self, partition: &str, mut closed: Closed) -> DataflowResult<()> {
        for _ in 0..1000 {
            let name = unstaged(partition, self.run, self.seq);
            let published = match (&mut closed, &self.local) {
                (Closed::Disk(temp), Some(dir)) => file::link_new(temp, &dir.join(&name))?,
                (Closed::Memory(bytes), _) => self
                    .root
                    .put_new(&name, bytes.clone())
                    .map_err(ParquetSinkError::from)?,
                (Closed::Disk(_), None) => return Err(self.no_folder()),
            };
            if published {
                return Ok(());
            }
            // Another run started in the same millisecond wrote it: take the next number.
            self.seq += 1;
        }
        Err(DataflowError::Config(format!(
            "parquet sink {}: no free file name for run {} after 1000 tries",
            self.root.url(),
            self.run
        )))
    }

    fn no_folder(&self) -> DataflowError {
        DataflowError::Config(format!(
            "parquet sink {}: a file was written on disk for a root that is not a folder",
            self.root.url()
        ))
    }
}

impl Sink for ParquetSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let rows = batch.num_rows() as u64;
        if rows == 0 {
            return Ok(());
        }
        for (partition, part) in self.partitioner.split(batch)? {
            let epoch = self.epoch;
            if !self.open.contains_key(&partition) {
                let file = self.open_file(part.schema())?;
                self.open.insert(partition.clone(), file);
            }
            let Some(file) = self.open.get_mut(&partition) else {
                continue;
            };
            // Columns of one pipeline's results keep their types; only metadata may differ.
            let part = if part.schema() == file.schema {
                part
            } else {
                RecordBatch::try_new(file.schema.clone(), part.columns().to_vec()).map_err(|e| {
                    DataflowError::schema(
                        "(results)",
                        format!("the columns of the open file ({})", file.schema),
                        e.to_string(),
                    )
                })?
            };
            file.output
                .write(&part)
                .map_err(|e| ParquetSinkError::Parquet {
                    url: self.root.url().to_string(),
                    what: "writing rows",
                    source: e,
                })?;
            file.last_epoch = epoch;
        }
        self.handed += rows;
        self.open_rows += rows;
        self.opened_at.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Called when an epoch completes: the only place files roll, so no file ever holds part
    /// of an epoch whose rest is in another.
    fn flush(&mut self) -> DataflowResult<()> {
        if self.roll_due() {
            self.close_all()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> DataflowResult<()> {
        self.close_all()
    }

    fn position(&self) -> Option<u64> {
        let mark = if self.open_rows > 0 {
            OPEN_FILE_MARK
        } else {
            0
        };
        Some(self.handed + mark)
    }

    fn durable(&self) -> Option<Arc<AtomicU64>> {
        Some(self.durable.clone())
    }

    fn begin_epoch(&mut self, generation: u64, epoch: Epoch) {
        self.generation = Some(generation);
        self.epoch = epoch;
    }
}
