//! Writing JSON lines, shared by every sink that writes JSON (the `jsonl` and `stdout` sinks,
//! Kafka's JSON values, Redis values, webhook bodies) and by the sinks' own dead-letter files:
//! the row encoder (`json_lines`), a sink over any writer ([`JsonLinesSink`]) and an
//! append-only file made at the first line (`AppendLines`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_json::writer::LineDelimited;
use arrow_json::WriterBuilder;
use arrow_schema::{ArrowError, DataType};
use riffle_dataflow::sink::Sink;
use riffle_dataflow::{DataflowError, DataflowResult};

/// Creates the directory a sink's file goes in.
pub(crate) fn create_parent(path: &Path) -> DataflowResult<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir)
            .map_err(|e| DataflowError::io(format!("creating directory {}", dir.display()), e)),
        _ => Ok(()),
    }
}

/// A sink's file reopened after a restart at the `position` its checkpoint recorded: what lies
/// past it was written after the checkpoint and is produced again, so it is cut off; the file
/// is returned positioned at its (new) end.
pub(crate) fn reopen_at(path: &Path, position: u64) -> DataflowResult<File> {
    create_parent(path)?;
    let io = |what: &str, e| DataflowError::io(format!("{what} {}", path.display()), e);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| io("opening", e))?;
    let length = file.metadata().map_err(|e| io("reading", e))?.len();
    if length < position {
        return Err(DataflowError::Config(format!(
            "{} holds {length} bytes but the checkpoint recorded {position}: the file was changed outside the pipeline",
            path.display()
        )));
    }
    file.set_len(position).map_err(|e| io("truncating", e))?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0)).map_err(|e| io("seeking", e))?;
    Ok(file)
}

/// A sink's own dead-letter file: JSON lines appended, the file created (with its folder) at
/// the first, so a run without refusals leaves none.
pub(crate) struct AppendLines {
    path: PathBuf,
    out: Option<BufWriter<File>>,
}

impl AppendLines {
    pub fn new(path: PathBuf) -> Self {
        AppendLines { path, out: None }
    }

    // The video sink's messages name it.
    #[cfg_attr(not(feature = "video"), allow(dead_code))]
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: std::io::Error) -> DataflowError {
        DataflowError::io(format!("writing {}", self.path.display()), e)
    }

    /// Appends `line` (held in a buffer until [`AppendLines::flush`]).
    pub fn write(&mut self, line: &serde_json::Value) -> DataflowResult<()> {
        if self.out.is_none() {
            create_parent(&self.path)?;
            let file = File::options()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| self.io(e))?;
            self.out = Some(BufWriter::new(file));
        }
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        let written = serde_json::to_writer(&mut *out, line)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
        written.map_err(|e| self.io(e))
    }

    /// Hands what was written to the file: refused rows must outlast a crash as surely as
    /// written ones.
    pub fn flush(&mut self) -> DataflowResult<()> {
        match self.out.as_mut().map(Write::flush) {
            Some(Err(e)) => Err(self.io(e)),
            _ => Ok(()),
        }
    }
}

/// Writes each row as one JSON object per line, nulls included, nested lists and structs as
/// JSON arrays and objects.
///
/// Top-level binary columns (e.g. raw image bytes) are left out: hex-encoding them would make
/// lines huge, and the other columns identify the record.
pub struct JsonLinesSink<W: Write + Send> {
    out: W,
    /// Bytes in the destination so far, for sinks whose position can be checkpointed.
    position: Option<u64>,
    /// Names the destination in errors.
    label: String,
}

impl<W: Write + Send> JsonLinesSink<W> {
    pub fn new(out: W, label: impl Into<String>) -> Self {
        JsonLinesSink {
            out,
            position: None,
            label: label.into(),
        }
    }

    /// Tracks the byte position from `start` (a file's length when it was opened).
    pub fn tracking_position(mut self, start: u64) -> Self {
        self.position = Some(start);
        self
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write + Send> Sink for JsonLinesSink<W> {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        // Encoded first, so that the position advances by exactly what reaches the file.
        let bytes = json_lines(batch).map_err(|e| {
            DataflowError::stage("sink", format!("encoding JSON for {}: {e}", self.label))
        })?;
        self.out
            .write_all(&bytes)
            .map_err(|e| DataflowError::io(format!("writing {}", self.label), e))?;
        if let Some(p) = self.position.as_mut() {
            *p += bytes.len() as u64;
        }
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        self.out
            .flush()
            .map_err(|e| DataflowError::io(format!("flushing {}", self.label), e))
    }

    fn position(&self) -> Option<u64> {
        self.position
    }
}

/// Bytes of any Arrow binary type: left out of JSON (and of Redis values' scalars).
pub(crate) fn is_binary(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

/// The rows as JSON lines, nulls written out, top-level binary columns left out (hex-encoded
/// payloads would dwarf the rest).
pub(crate) fn json_lines(batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
    let schema = batch.schema();
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| !is_binary(schema.field(i).data_type()))
        .collect();
    let batch = batch.project(&keep)?;
    let mut writer = WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, LineDelimited>(Vec::with_capacity(batch.get_array_memory_size()));
    writer.write(&batch)?;
    writer.finish()?;
    Ok(writer.into_inner())
}
