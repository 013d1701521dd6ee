//! Arrow IPC files: a source reading whole batches, and a sink writing them.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use arrow_array::{Array, RecordBatch};
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{Schema, SchemaRef};
use riffle_dataflow::sink::{Sink, SinkFactory};
use riffle_dataflow::source::SourceBatch;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;

use crate::kind::Limits;
use crate::kind::{SinkKind, SourceKind};

/// `source: { ipc: { path } }`: an Arrow IPC *file* (not a stream).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcSourceConfig {
    pub path: PathBuf,
}

/// A configured IPC source: batch `i` of the file goes to worker `i % peers`, unchanged.
#[derive(Debug)]
pub struct IpcSource {
    path: PathBuf,
    schema: SchemaRef,
    num_batches: usize,
}

fn open_reader(path: &Path) -> DataflowResult<FileReader<std::io::BufReader<File>>> {
    let file = File::open(path)
        .map_err(|e| DataflowError::io(format!("opening {}", path.display()), e))?;
    FileReader::try_new_buffered(file, None).map_err(|e| {
        DataflowError::Config(format!(
            "ipc source: {} is not a readable Arrow IPC file: {e}",
            path.display()
        ))
    })
}

impl IpcSource {
    pub fn new(config: &IpcSourceConfig) -> DataflowResult<Self> {
        let reader = open_reader(&config.path)?;
        Ok(IpcSource {
            path: config.path.clone(),
            schema: reader.schema(),
            num_batches: reader.num_batches(),
        })
    }

    /// Number of batches in the file.
    pub fn num_batches(&self) -> usize {
        self.num_batches
    }
}

impl SourceFactory for IpcSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(self.schema.clone())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        crate::check_partition(index, peers)?;
        Ok(Box::new(IpcPartition {
            reader: open_reader(&self.path)?,
            path: self.path.clone(),
            next: index,
            peers,
        }))
    }
}

struct IpcPartition {
    reader: FileReader<std::io::BufReader<File>>,
    path: PathBuf,
    /// Index of the next batch this worker reads.
    next: usize,
    peers: usize,
}

impl Source for IpcPartition {
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        if self.next >= self.reader.num_batches() {
            return Ok(None);
        }
        let index = self.next;
        self.next = self.next.saturating_add(self.peers);
        let path = &self.path;
        let fail = |message: String| {
            DataflowError::stage(
                "source",
                format!("reading batch {index} of {}: {message}", path.display()),
            )
        };
        self.reader
            .set_index(index)
            .map_err(|e| fail(e.to_string()))?;
        let records = match self.reader.next() {
            Some(Ok(batch)) => batch,
            Some(Err(e)) => return Err(fail(e.to_string())),
            None => {
                return Err(fail(
                    "the file has fewer batches than its footer lists".into(),
                ))
            }
        };
        Ok(Some(SourceBatch::new(records, Vec::new())))
    }
}

/// `sink: { ipc: { path } }`: an Arrow IPC file with the schema of the first batch.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcSinkConfig {
    pub path: PathBuf,
}

impl SinkFactory for IpcSinkConfig {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(IpcFileSink::create(&self.path)?))
    }
}

/// Writes batches to an Arrow IPC file.
///
/// An IPC file ends in a footer listing every batch, written once: by [`IpcFileSink::finish`]
/// or, failing that, when the sink is dropped at the end of the run. Until then the file is
/// not readable with `FileReader`; `flush` only pushes the written batches to the file.
/// Every batch must have the schema of the first one (same names and types); a file that
/// received no batch is finished with an empty schema.
pub struct IpcFileSink {
    path: PathBuf,
    /// The created file, until the first batch fixes the schema.
    file: Option<File>,
    writer: Option<FileWriter<BufWriter<File>>>,
    finished: bool,
}

impl IpcFileSink {
    /// Creates the file (and its directory), replacing any earlier one, so a stale file never
    /// passes for this run's results.
    pub fn create(path: &Path) -> DataflowResult<Self> {
        crate::lines::create_parent(path)?;
        let file = File::create(path)
            .map_err(|e| DataflowError::io(format!("creating {}", path.display()), e))?;
        Ok(IpcFileSink {
            path: path.to_path_buf(),
            file: Some(file),
            writer: None,
            finished: false,
        })
    }

    fn writer(&mut self, schema: &Schema) -> DataflowResult<&mut FileWriter<BufWriter<File>>> {
        if self.writer.is_none() {
            let file = self.file.take().ok_or_else(|| {
                DataflowError::stage("sink", format!("{} is already closed", self.path.display()))
            })?;
            let writer = FileWriter::try_new_buffered(file, schema)
                .map_err(|e| self.arrow_error("writing", e))?;
            self.writer = Some(writer);
        }
        self.writer.as_mut().ok_or_else(|| {
            DataflowError::stage("sink", format!("{} is already closed", self.path.display()))
        })
    }

    fn arrow_error(&self, action: &str, e: arrow_schema::ArrowError) -> DataflowError {
        match e {
            arrow_schema::ArrowError::IoError(_, source) => {
                DataflowError::io(format!("{action} {}", self.path.display()), source)
            }
            other => {
                DataflowError::stage("sink", format!("{action} {}: {other}", self.path.display()))
            }
        }
    }

    /// Writes the footer; the file is complete and no more batches can be written.
    fn write_footer(&mut self) -> DataflowResult<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        if self.writer.is_none() {
            self.writer(&Schema::empty())?;
        }
        let result = match self.writer.as_mut() {
            Some(writer) => writer.finish(),
            None => Ok(()),
        };
        result.map_err(|e| self.arrow_error("finishing", e))
    }
}

/// Whether `batch` can go in a file of `schema`: same names and types, and no nulls in a
/// column the file declares non-nullable.
fn fits(schema: &Schema, batch: &RecordBatch) -> bool {
    let fields = batch.schema_ref().fields();
    schema.fields().len() == fields.len()
        && schema
            .fields()
            .iter()
            .zip(fields.iter())
            .zip(batch.columns())
            .all(|((want, got), column)| {
                want.name() == got.name()
                    && want.data_type() == got.data_type()
                    && (want.is_nullable() || column.null_count() == 0)
            })
}

impl Sink for IpcFileSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        if self.finished {
            return Err(DataflowError::stage(
                "sink",
                format!("{} is already finished", self.path.display()),
            ));
        }
        let writer = self.writer(batch.schema_ref())?;
        if !fits(writer.schema(), batch) {
            let expected = writer.schema().clone();
            return Err(DataflowError::stage(
                "sink",
                format!(
                    "{}: batch schema {} differs from the file's schema {}",
                    self.path.display(),
                    batch.schema_ref(),
                    expected
                ),
            ));
        }
        let result = writer.write(batch);
        result.map_err(|e| self.arrow_error("writing", e))
    }

    fn flush(&mut self) -> DataflowResult<()> {
        let result = match self.writer.as_mut() {
            Some(writer) if !self.finished => writer.flush(),
            _ => Ok(()),
        };
        result.map_err(|e| self.arrow_error("flushing", e))
    }

    /// The end of the run: the footer makes the file readable.
    fn finish(&mut self) -> DataflowResult<()> {
        self.write_footer()
    }
}

impl Drop for IpcFileSink {
    fn drop(&mut self) {
        if let Err(e) = self.write_footer() {
            tracing::error!("ipc sink: {e}");
        }
    }
}

impl SourceKind for IpcSourceConfig {
    fn kind(&self) -> &'static str {
        "ipc"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.path]
    }
    fn inputs(&self) -> Vec<&Path> {
        vec![&self.path]
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Ok(Box::new(IpcSource::new(self)?))
    }
}

impl Limits for IpcSourceConfig {}

impl SinkKind for IpcSinkConfig {
    fn kind(&self) -> &'static str {
        "ipc"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.path]
    }
    fn outputs(&self) -> Vec<&Path> {
        vec![&self.path]
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(Box::new(self.clone()))
    }
}

impl Limits for IpcSinkConfig {}
