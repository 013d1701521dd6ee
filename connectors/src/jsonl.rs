//! JSON lines: a source reading one JSON object per line (decoded by
//! [`crate::formats::json`]), and a sink writing one per row.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_dataflow::sink::{Sink, SinkFactory};
use riffle_dataflow::Committer;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::formats::{self, DeclaredSchema, Decoder, TextFormat};
pub use crate::lines::JsonLinesSink;
use crate::staged_file::{StagedWriter, Staging};
use crate::text::{check_config, Framing, RecordReader, TextPartition, INFER_BYTES};

use crate::kind::Limits;
use crate::kind::{SinkKind, SourceKind};
use riffle_dataflow::range::Range;

/// Lines read to infer the schema.
const INFER_RECORDS: usize = 1000;

/// `source: { jsonl: { path, batch_size, schema } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlSourceConfig {
    pub path: PathBuf,
    /// Lines per batch, and per chunk dealt to a worker.
    #[serde_inline_default(1024)]
    pub batch_size: usize,
    /// Longest line (line end included); a longer one is a dead letter with its line.
    #[serde_inline_default(crate::text::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,
    /// Columns and their types (`name: float32`, `affinity: float32[80]` for an array of
    /// exactly 80 numbers, `int64?` for one a line may leave out), in output order; other keys
    /// are ignored. Unset: inferred.
    #[serde(default)]
    pub schema: Option<DeclaredSchema>,
}

/// A configured JSON-lines source. The schema is declared, or inferred from the first 1000
/// lines that are JSON objects; fields that first appear later are ignored, and a line that is
/// not a JSON object or holds a value of the wrong type for its field (an array of the wrong
/// length for a declared list) becomes a dead letter.
#[derive(Debug)]
pub struct JsonlSource {
    path: PathBuf,
    batch_size: usize,
    max_line_bytes: usize,
    decoder: Decoder,
}

impl JsonlSource {
    pub fn new(config: &JsonlSourceConfig) -> DataflowResult<Self> {
        check_config("jsonl", config.batch_size, config.max_line_bytes)?;
        Ok(JsonlSource {
            path: config.path.clone(),
            batch_size: config.batch_size,
            max_line_bytes: config.max_line_bytes,
            decoder: match &config.schema {
                Some(declared) => declared_decoder(declared)?,
                None => infer_decoder(&config.path, config.max_line_bytes)?,
            },
        })
    }
}

/// The decoder of declared columns (required unless declared nullable).
fn declared_decoder(declared: &DeclaredSchema) -> DataflowResult<Decoder> {
    let schema = formats::declared_schema(declared).ok_or_else(|| {
        DataflowError::Config("jsonl source: `schema` declares no columns".to_string())
    })?;
    Ok(
        Decoder::new(TextFormat::Json, formats::Framing::FileRecord, schema)
            .with_required(&formats::declared_required(declared)),
    )
}

/// Infers the columns from the first lines, reading at most [`INFER_BYTES`] of them (lines
/// over `max_line_bytes` left out); a column every sampled object had is required.
fn infer_decoder(path: &Path, max_line_bytes: usize) -> DataflowResult<Decoder> {
    let mut reader = RecordReader::open(path, Framing::Lines, max_line_bytes)?;
    let sample = reader.sample(INFER_RECORDS, INFER_BYTES)?;
    let schema = formats::json::infer_schema(sample.iter().map(|r| r.bytes.as_slice()))?;
    if schema.fields().is_empty() {
        return Err(DataflowError::Config(format!(
            "jsonl source: no JSON object with fields in the first {INFER_RECORDS} lines of {}",
            path.display()
        )));
    }
    let decoder = Decoder::new(
        TextFormat::Json,
        formats::Framing::FileRecord,
        Arc::new(schema),
    );
    let payloads: Vec<&[u8]> = sample.iter().map(|r| r.bytes.as_slice()).collect();
    let required = decoder.complete_columns(&payloads);
    Ok(decoder.with_required(&required))
}

impl SourceFactory for JsonlSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(self.decoder.schema().clone())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        Ok(Box::new(TextPartition::new(
            &self.path,
            Framing::Lines,
            self.max_line_bytes,
            self.decoder.clone(),
            self.batch_size,
            index,
            peers,
        )?))
    }
}

/// `sink: { jsonl: { path } }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlSinkConfig {
    pub path: PathBuf,
    /// Shared with the committer of a run with checkpoints (`staged_file.rs`).
    #[serde(skip)]
    pub(crate) staging: Staging,
}

impl JsonlSinkConfig {
    pub fn at(path: impl Into<PathBuf>) -> Self {
        JsonlSinkConfig {
            path: path.into(),
            staging: Staging::default(),
        }
    }

    fn sink(&self, file: File, position: u64) -> Box<dyn Sink> {
        Box::new(
            JsonLinesSink::new(
                StagedWriter::new(&self.staging, &self.path, file, position),
                self.path.display().to_string(),
            )
            .tracking_position(position),
        )
    }
}

impl SinkFactory for JsonlSinkConfig {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(self.sink(self.staging.create(&self.path)?, 0))
    }

    /// Reopens the file after a restart at the checkpointed `position`
    /// (`staged_file::Staging::resume`).
    fn open_at(&self, position: u64) -> DataflowResult<Box<dyn Sink>> {
        Ok(self.sink(self.staging.resume(&self.path, position)?, position))
    }

    /// Runs with checkpoints show only what a checkpoint covers (`staged_file.rs`).
    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        self.staging.committer(&self.path).map(Some)
    }
}

impl SourceKind for JsonlSourceConfig {
    fn kind(&self) -> &'static str {
        "jsonl"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.path]
    }
    fn inputs(&self) -> Vec<&Path> {
        vec![&self.path]
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Ok(Box::new(JsonlSource::new(self)?))
    }
}

impl Limits for JsonlSourceConfig {
    const RANGES: &'static [Range] = crate::text::TEXT_RANGES;
}

impl SinkKind for JsonlSinkConfig {
    fn kind(&self) -> &'static str {
        "jsonl"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.path]
    }
    fn outputs(&self) -> Vec<&Path> {
        vec![&self.path]
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        // Each built sink stages on its own.
        Ok(Box::new(JsonlSinkConfig::at(&self.path)))
    }
}

impl Limits for JsonlSinkConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_columns_skip_inference_and_bad_lines_are_dead_letters() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        let lines = [
            r#"{"id": 1, "v": [0.5, 1.5], "p": 3}"#,
            r#"{"id": 2, "v": [0.5], "p": 3}"#,
            r#"{"id": 3, "v": [0.5, "high"], "p": 3}"#,
            r#"{"id": 4, "v": [1, 2]}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let yaml = format!(
            "path: {}\nschema: {{ v: \"float32[2]\", id: int64, p: int64? }}",
            path.display()
        );
        let config: JsonlSourceConfig = serde_saphyr::from_str(&yaml).unwrap();
        let source = JsonlSource::new(&config).unwrap();
        let schema = source.schema().unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["v", "id", "p"]);
        let mut partition = source.partition(0, 1).unwrap();
        let batch = partition.next_batch().unwrap().unwrap();
        assert_eq!(batch.records.num_rows(), 2);
        assert_eq!(batch.records.schema(), schema);
        let reasons: Vec<&str> = batch.rejected.iter().map(|l| l.reason.as_str()).collect();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(
            reasons[0].contains("expected 2 but got 1"),
            "{}",
            reasons[0]
        );
        assert!(reasons[1].contains("high"), "{}", reasons[1]);
        assert!(batch.rejected[0].record.contains(r#""line":2"#));
    }
}
