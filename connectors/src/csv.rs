//! CSV files: a source reading one with columns declared (`schema:`) or inferred from its
//! first records (inference and decoding are [`crate::formats::csv`]'s; this file reads and
//! deals the records), and a sink writing the results as one, with a header row.

use std::fs::File;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Schema, SchemaRef};
use riffle_dataflow::sink::{Sink, SinkFactory};
use riffle_dataflow::Committer;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::formats::{self, DeclaredSchema, Decoder, TextFormat};
use crate::lines::is_binary;
use crate::staged_file::{StagedWriter, Staging};
use crate::text::{check_config, Framing, RecordReader, TextPartition, INFER_BYTES};

use crate::kind::Limits;
use crate::kind::{SinkKind, SourceKind};
use riffle_dataflow::range::Range;

/// Records read to infer the column types.
const INFER_RECORDS: usize = 1000;

/// `source: { csv: { path, has_header, batch_size, delimiter, schema } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvSourceConfig {
    pub path: PathBuf,
    /// Whether the first record names the columns (otherwise `column_1`, `column_2`, ...).
    #[serde_inline_default(true)]
    pub has_header: bool,
    /// Records per batch, and per chunk dealt to a worker.
    #[serde_inline_default(1024)]
    pub batch_size: usize,
    /// Field separator, an ASCII character; `,` when unset.
    #[serde(default)]
    pub delimiter: Option<char>,
    /// Longest record (line end included); a longer one is a dead letter with its line.
    #[serde_inline_default(crate::text::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,
    /// Columns and their types (`name: float32`, `int64?` for one a record may leave empty), in
    /// output order; unset: inferred. With a header, columns are found by name and the header's
    /// other columns are left out; without one, they are the record's fields in order.
    #[serde(default)]
    pub schema: Option<DeclaredSchema>,
}

/// A configured CSV source. Columns are declared, or inferred from the first 1000 records (all
/// nullable; integers, floats, booleans, dates and timestamps, else strings). A record with the
/// wrong number of fields or a value that does not parse as its column's type becomes a dead
/// letter.
#[derive(Debug)]
pub struct CsvSource {
    path: PathBuf,
    has_header: bool,
    batch_size: usize,
    delimiter: u8,
    max_line_bytes: usize,
    /// Decodes the records; its required columns are the declared ones, or those every sampled
    /// record had a value for.
    decoder: Decoder,
}

impl CsvSource {
    pub fn new(config: &CsvSourceConfig) -> DataflowResult<Self> {
        check_config("csv", config.batch_size, config.max_line_bytes)?;
        let delimiter = delimiter_byte("csv source", config.delimiter.unwrap_or(','))?;
        let decoder = match &config.schema {
            Some(declared) => declared_decoder(config, declared, delimiter)?,
            None => {
                let (schema, required) = infer_schema(config, delimiter)?;
                Decoder::new(
                    TextFormat::Csv { delimiter },
                    formats::Framing::FileRecord,
                    schema,
                )
                .with_required(&required)
            }
        };
        Ok(CsvSource {
            path: config.path.clone(),
            has_header: config.has_header,
            batch_size: config.batch_size,
            delimiter,
            max_line_bytes: config.max_line_bytes,
            decoder,
        })
    }
}

/// The decoder of declared columns: found by name in the header (the header's other columns
/// read as text and left out), or the record's fields in order when there is no header.
fn declared_decoder(
    config: &CsvSourceConfig,
    declared: &DeclaredSchema,
    delimiter: u8,
) -> DataflowResult<Decoder> {
    let path = &config.path;
    let schema = formats::declared_schema(declared).ok_or_else(|| {
        DataflowError::Config("csv source: `schema` declares no columns".to_string())
    })?;
    if let Some((name, column)) = declared.first_list() {
        return Err(DataflowError::Config(format!(
            "csv source: schema column `{name}` is a list ({column}), which a CSV field cannot              hold: declare one column per value (a `tensor` stage can gather them), or use JSON"
        )));
    }
    let decoder = Decoder::new(
        TextFormat::Csv { delimiter },
        formats::Framing::FileRecord,
        schema.clone(),
    )
    .with_required(&formats::declared_required(declared));
    if !config.has_header {
        return Ok(decoder);
    }
    let mut reader = RecordReader::open(path, framing(delimiter), config.max_line_bytes)?;
    let header = match reader.next_record()? {
        Some(header) if !header.oversized => header.bytes,
        Some(_) => {
            return Err(DataflowError::Config(format!(
                "csv source: the header of {} is longer than max_line_bytes ({})",
                path.display(),
                config.max_line_bytes
            )))
        }
        None => {
            return Err(DataflowError::Config(format!(
                "csv source: {} has no header",
                path.display()
            )))
        }
    };
    let names = arrow_csv::reader::Format::default()
        .with_header(true)
        .with_delimiter(delimiter)
        .infer_schema(Cursor::new(header), Some(0))
        .map_err(|e| {
            DataflowError::Config(format!(
                "csv source: cannot read the header of {}: {}",
                path.display(),
                formats::excerpt(&e.to_string())
            ))
        })?
        .0;
    let read: Vec<arrow_schema::Field> = names
        .fields()
        .iter()
        .map(|f| match schema.field_with_name(f.name()) {
            Ok(declared) => declared.clone(),
            Err(_) => arrow_schema::Field::new(f.name(), arrow_schema::DataType::Utf8, true),
        })
        .collect();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let index = names.index_of(field.name()).map_err(|_| {
            let header: Vec<&str> = names.fields().iter().map(|f| f.name().as_str()).collect();
            DataflowError::Config(formats::excerpt(&format!(
                "csv source: schema column `{}` is not in the header of {} (it has: {})",
                field.name(),
                path.display(),
                header.join(", ")
            )))
        })?;
        columns.push(index);
    }
    Ok(decoder.reading(Arc::new(arrow_schema::Schema::new(read)), columns))
}

/// A field separator as the byte the reader and writer take: ASCII, and not a character that
/// quotes or ends a record.
fn delimiter_byte(role: &str, c: char) -> DataflowResult<u8> {
    if c.is_ascii() && !matches!(c, '\n' | '\r' | '"') {
        return Ok(c as u8);
    }
    Err(DataflowError::Config(format!(
        "{role}: delimiter {c:?} must be an ASCII character other than a quote or newline"
    )))
}

fn framing(delimiter: u8) -> Framing {
    Framing::Csv {
        delimiter,
        quote: b'"',
    }
}

/// Infers the columns from the header and the first records, reading at most
/// [`INFER_BYTES`] of them (records over `max_line_bytes` left out), and which columns every
/// sampled record had.
fn infer_schema(
    config: &CsvSourceConfig,
    delimiter: u8,
) -> DataflowResult<(SchemaRef, Vec<String>)> {
    let path = &config.path;
    let mut reader = RecordReader::open(path, framing(delimiter), config.max_line_bytes)?;
    let mut text = Vec::new();
    if config.has_header {
        match reader.next_record()? {
            Some(header) if header.oversized => {
                return Err(DataflowError::Config(format!(
                    "csv source: the header of {} is longer than max_line_bytes ({})",
                    path.display(),
                    config.max_line_bytes
                )))
            }
            Some(header) => text.extend_from_slice(&header.bytes),
            None => {}
        }
    }
    let sample = reader.sample(INFER_RECORDS, INFER_BYTES)?;
    for record in &sample {
        text.extend_from_slice(&record.bytes);
    }
    let schema = formats::csv::infer_schema(
        Cursor::new(text),
        config.has_header,
        delimiter,
        INFER_RECORDS,
    )
    .map_err(|e| {
        DataflowError::Config(format!(
            "csv source: cannot infer a schema from {}: {}",
            path.display(),
            formats::excerpt(&e.to_string())
        ))
    })?;
    if schema.fields().is_empty() {
        return Err(DataflowError::Config(format!(
            "csv source: {} has no columns",
            path.display()
        )));
    }
    let schema = Arc::new(schema);
    let decoder = Decoder::new(
        TextFormat::Csv { delimiter },
        formats::Framing::FileRecord,
        schema.clone(),
    );
    let payloads: Vec<&[u8]> = sample.iter().map(|r| r.bytes.as_slice()).collect();
    Ok((schema, decoder.complete_columns(&payloads)))
}

impl SourceFactory for CsvSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(self.decoder.schema().clone())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        let mut partition = TextPartition::new(
            &self.path,
            framing(self.delimiter),
            self.max_line_bytes,
            self.decoder.clone(),
            self.batch_size,
            index,
            peers,
        )?;
        if self.has_header {
            // The header is not a record: every worker skips it so chunks line up.
            partition.skip_records(1)?;
        }
        Ok(Box::new(partition))
    }
}

impl SourceKind for CsvSourceConfig {
    fn kind(&self) -> &'static str {
        "csv"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.path]
    }
    fn inputs(&self) -> Vec<&Path> {
        vec![&self.path]
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Ok(Box::new(CsvSource::new(self)?))
    }
}

impl Limits for CsvSourceConfig {
    const RANGES: &'static [Range] = crate::text::TEXT_RANGES;
}

/// `sink: { csv: { path, delimiter, header } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvSinkConfig {
    pub path: PathBuf,
    /// Field separator, an ASCII character other than a quote or newline.
    #[serde_inline_default(',')]
    pub delimiter: char,
    /// Whether the file starts with a row naming the columns.
    #[serde_inline_default(true)]
    pub header: bool,
    /// Shared with the committer of a run with checkpoints (`staged_file.rs`).
    #[serde(skip)]
    staging: Staging,
}

impl CsvSinkConfig {
    fn delimiter(&self) -> DataflowResult<u8> {
        delimiter_byte("csv sink", self.delimiter).map_err(|e| e.at("delimiter"))
    }

    /// The sink over `file`, which holds `position` bytes already.
    fn sink(&self, file: File, position: u64) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(CsvFileSink {
            out: StagedWriter::new(&self.staging, &self.path, file, position),
            label: self.path.display().to_string(),
            delimiter: self.delimiter()?,
            // A file cut back to a checkpoint past 0 has its header already.
            header_due: self.header && position == 0,
        }))
    }
}

/// Columns a CSV field cannot hold: lists and structs (arrow-csv refuses them) and bytes (as
/// hex they would dwarf the rest, and no reader would turn them back into a picture).
fn unwritable(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(_, values) => unwritable(values),
        DataType::RunEndEncoded(_, values) => unwritable(values.data_type()),
        other => other.is_nested() || is_binary(other),
    }
}

impl SinkFactory for CsvSinkConfig {
    /// Creates the file (and its directory), replacing any earlier one.
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        self.sink(self.staging.create(&self.path)?, 0)
    }

    /// Reopens the file after a restart at the checkpointed `position`
    /// (`staged_file::Staging::resume`).
    fn open_at(&self, position: u64) -> DataflowResult<Box<dyn Sink>> {
        self.sink(self.staging.resume(&self.path, position)?, position)
    }

    /// Runs with checkpoints show only what a checkpoint covers (`staged_file.rs`).
    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        self.staging.committer(&self.path).map(Some)
    }
}

/// Writes rows as CSV records, columns in the results' order, nulls as empty fields; the
/// header row once, at the top of the file.
struct CsvFileSink {
    out: StagedWriter,
    /// Names the file in errors.
    label: String,
    delimiter: u8,
    /// Whether the header is still to be written: the columns are known at the first batch.
    header_due: bool,
}

impl Sink for CsvFileSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        // Encoded first, so that a batch that cannot be encoded writes nothing.
        let mut writer = arrow_csv::WriterBuilder::new()
            .with_delimiter(self.delimiter)
            .with_header(self.header_due)
            .build(Vec::with_capacity(batch.get_array_memory_size()));
        writer.write(batch).map_err(|e| {
            DataflowError::stage("sink", format!("encoding CSV for {}: {e}", self.label))
        })?;
        let bytes = writer.into_inner();
        self.out
            .write_all(&bytes)
            .map_err(|e| DataflowError::io(format!("writing {}", self.label), e))?;
        self.header_due = false;
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        self.out
            .flush()
            .map_err(|e| DataflowError::io(format!("flushing {}", self.label), e))
    }

    /// Bytes of the file so far (the writer counts them), recorded by checkpoints.
    fn position(&self) -> Option<u64> {
        Some(self.out.position())
    }
}

impl SinkKind for CsvSinkConfig {
    fn kind(&self) -> &'static str {
        "csv"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.path]
    }
    fn outputs(&self) -> Vec<&Path> {
        vec![&self.path]
    }
    /// Refuses, before the run, columns a CSV field cannot hold, rather than failing at the
    /// first batch or leaving them out unseen.
    fn check_input(&self, schema: &Schema) -> Result<(), String> {
        let (refused, kept): (Vec<_>, Vec<_>) = schema
            .fields()
            .iter()
            .partition(|f| unwritable(f.data_type()));
        if refused.is_empty() {
            return Ok(());
        }
        let named: Vec<String> = refused
            .iter()
            .map(|f| format!("`{}` ({})", f.name(), f.data_type()))
            .collect();
        let (what, them) = match named.as_slice() {
            [one] => (format!("column {one} is a list, struct or bytes"), "it"),
            _ => (
                format!("columns {} are lists, structs or bytes", named.join(", ")),
                "them",
            ),
        };
        let kept: Vec<&str> = kept.iter().map(|f| f.name().as_str()).collect();
        let select = if kept.is_empty() {
            String::new()
        } else {
            format!(
                "drop {them} with a last stage `select: {{ columns: [{}] }}`, or ",
                kept.join(", ")
            )
        };
        Err(format!(
            "{what}, which a CSV field cannot hold: {select}write JSON lines \
             (`sink: {{ jsonl: {{ path: ... }} }}`), which keep lists and structs"
        ))
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        self.delimiter()?;
        // Each built sink stages on its own.
        let mut built = self.clone();
        built.staging = Staging::default();
        Ok(Box::new(built))
    }
}

impl Limits for CsvSinkConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &std::path::Path, extra: serde_json::Value) -> CsvSourceConfig {
        let mut c = serde_json::json!({ "path": path });
        if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(extra.clone());
        }
        serde_json::from_value(c).unwrap()
    }

    fn read_all(source: &CsvSource) -> (usize, Vec<String>) {
        let mut partition = source.partition(0, 1).unwrap();
        let (mut rows, mut reasons) = (0, Vec::new());
        while let Some(batch) = partition.next_batch().unwrap() {
            rows += batch.records.num_rows();
            reasons.extend(batch.rejected.into_iter().map(|l| l.reason));
        }
        (rows, reasons)
    }

    #[test]
    fn an_over_long_line_is_a_dead_letter_and_reasons_are_excerpts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        let long = "9".repeat(5000);
        // Line 3 is over the limit; after the sampled records, a long non-number in the int
        // column.
        let mut text = format!("a,b\n1,x\n{long},y\n");
        text.push_str(&"2,w\n".repeat(INFER_RECORDS));
        text.push_str(&format!("{},z\n", "q".repeat(2000)));
        std::fs::write(&path, text).unwrap();
        let source =
            CsvSource::new(&config(&path, serde_json::json!({"max_line_bytes": 4096}))).unwrap();
        let (rows, reasons) = read_all(&source);
        assert_eq!(rows, 1 + INFER_RECORDS);
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert_eq!(
            reasons[0],
            "line 3: record longer than max_line_bytes (4096)"
        );
        assert!(reasons[1].len() < 400, "{}", reasons[1]);
        assert!(reasons[1].contains("bytes in all)"), "{}", reasons[1]);
    }

    #[test]
    fn declared_columns_are_found_by_header_name_in_declared_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        std::fs::write(&path, "id,note,score\n1,x,0.5\n2,y,oops\n3,z,\n4,w,1e3\n").unwrap();
        // YAML, which keeps the written order (a serde_json map would sort it).
        let yaml = format!(
            "path: {}\nschema: {{ score: float32?, id: int32 }}",
            path.display()
        );
        let source = CsvSource::new(&serde_saphyr::from_str(&yaml).unwrap()).unwrap();
        let got = source.schema().unwrap();
        let names: Vec<&str> = got.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["score", "id"]);
        assert_eq!(got.field(0).data_type(), &arrow_schema::DataType::Float32);
        let (rows, reasons) = read_all(&source);
        assert_eq!(rows, 3);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].contains("oops"), "{}", reasons[0]);

        let missing = serde_json::json!({"schema": {"id": "int64", "user": "string"}});
        let e = CsvSource::new(&config(&path, missing))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`user` is not in the header"), "{e}");
        assert!(e.contains("id, note, score"), "{e}");
        let list = serde_json::json!({"schema": {"id": "float32[2]"}});
        let e = CsvSource::new(&config(&path, list))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`id` is a list (float32[2])"), "{e}");

        // No header: the declared columns are the fields in order.
        let bare = dir.path().join("b.csv");
        std::fs::write(&bare, "1,2.5\n2,x\n").unwrap();
        let c = serde_json::json!({"has_header": false, "schema": {"n": "int64", "v": "float64"}});
        let source = CsvSource::new(&config(&bare, c)).unwrap();
        let (rows, reasons) = read_all(&source);
        assert_eq!((rows, reasons.len()), (1, 1));
    }

    #[test]
    fn inference_reads_a_bounded_sample_and_special_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        // Past the sampled bytes, a column turns to text: inference never saw it.
        let mut text = String::from("n\n");
        let line = format!("{}\n", "1".repeat(15));
        for _ in 0..(INFER_BYTES / line.len() + 10) {
            text.push_str(&line);
        }
        text.push_str("not-a-number\n");
        std::fs::write(&path, text).unwrap();
        let c = config(&path, serde_json::json!({}));
        let source = CsvSource::new(&c).unwrap();
        assert_eq!(
            source.decoder.schema().field(0).data_type(),
            &arrow_schema::DataType::Int64
        );

        let e = CsvSource::new(&config(
            std::path::Path::new("/dev/zero"),
            serde_json::json!({}),
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero is a character device, not a regular file"
        );
        let e = CsvSource::new(&config(&path, serde_json::json!({"max_line_bytes": 0})));
        assert!(e.unwrap_err().to_string().contains("max_line_bytes"));
    }

    /// A batch of the scalar types a CSV file holds, text with the delimiter, a quote and a
    /// line end in it, and nulls; `first` numbers its rows.
    fn scalars(first: i64) -> RecordBatch {
        use arrow_array::{BooleanArray, Float64Array, Int64Array, StringArray};
        let schema = Schema::new(vec![
            arrow_schema::Field::new("id", DataType::Int64, false),
            arrow_schema::Field::new("score", DataType::Float64, true),
            arrow_schema::Field::new("note", DataType::Utf8, true),
            arrow_schema::Field::new("ok", DataType::Boolean, true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![first, first + 1, first + 2])),
                Arc::new(Float64Array::from(vec![Some(0.25), None, Some(-3e10)])),
                Arc::new(StringArray::from(vec![
                    Some("plain"),
                    Some("a;b, \"quoted\"\nnext line"),
                    None,
                ])),
                Arc::new(BooleanArray::from(vec![Some(true), Some(false), None])),
            ],
        )
        .unwrap()
    }

    fn sink_config(path: &std::path::Path, extra: serde_json::Value) -> CsvSinkConfig {
        let mut c = serde_json::json!({ "path": path });
        if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(extra.clone());
        }
        serde_json::from_value(c).unwrap()
    }

    /// Every row of the file, through the csv source with the sink's delimiter.
    fn read_back(path: &std::path::Path, delimiter: char) -> Vec<RecordBatch> {
        let source = CsvSource::new(&config(
            path,
            serde_json::json!({ "delimiter": delimiter.to_string() }),
        ))
        .unwrap();
        let mut partition = source.partition(0, 1).unwrap();
        let mut batches = Vec::new();
        while let Some(batch) = partition.next_batch().unwrap() {
            assert!(batch.rejected.is_empty(), "{:?}", batch.rejected);
            batches.push(batch.records);
        }
        batches
    }

    #[test]
    fn rows_written_read_back_through_the_csv_source_with_one_header() {
        let dir = tempfile::tempdir().unwrap();
        for delimiter in [',', ';', '\t'] {
            let path = dir.path().join("out/r.csv");
            let c = sink_config(
                &path,
                serde_json::json!({ "delimiter": delimiter.to_string() }),
            );
            c.check_input(&scalars(0).schema()).unwrap();
            let mut sink = c.build().unwrap().open().unwrap();
            sink.write_batch(&scalars(0)).unwrap();
            sink.write_batch(&scalars(3)).unwrap();
            sink.finish().unwrap();
            assert_eq!(
                sink.position(),
                Some(std::fs::metadata(&path).unwrap().len())
            );
            let text = std::fs::read_to_string(&path).unwrap();
            let header = ["id", "score", "note", "ok"].join(&delimiter.to_string());
            assert!(text.starts_with(&format!("{header}\n")), "{text}");
            assert_eq!(text.matches(&header).count(), 1, "{text}");

            let batches = read_back(&path, delimiter);
            let read =
                arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
            let written = arrow_select::concat::concat_batches(
                &scalars(0).schema(),
                &[scalars(0), scalars(3)],
            )
            .unwrap();
            assert_eq!(read.num_rows(), 6);
            let names: Vec<&str> = read
                .schema_ref()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            assert_eq!(names, ["id", "score", "note", "ok"]);
            for (i, column) in written.columns().iter().enumerate() {
                assert_eq!(read.column(i).as_ref(), column.as_ref(), "column {i}");
            }
        }

        // Without a header, only the records.
        let path = dir.path().join("bare.csv");
        let mut sink = sink_config(&path, serde_json::json!({ "header": false }))
            .open()
            .unwrap();
        sink.write_batch(&scalars(0)).unwrap();
        sink.flush().unwrap();
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("0,0.25,plain,true\n"));
    }

    #[test]
    fn a_restart_cuts_back_to_the_checkpoint_without_a_second_header_or_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.csv");
        let c = sink_config(&path, serde_json::json!({}));
        let mut sink = c.open().unwrap();
        sink.write_batch(&scalars(0)).unwrap();
        sink.flush().unwrap();
        let checkpoint = sink.position().unwrap();
        // Written after the checkpoint, then the process dies: produced again on restart.
        sink.write_batch(&scalars(3)).unwrap();
        sink.flush().unwrap();
        drop(sink);

        let mut sink = c.open_at(checkpoint).unwrap();
        assert_eq!(sink.position(), Some(checkpoint));
        sink.write_batch(&scalars(3)).unwrap();
        sink.write_batch(&scalars(6)).unwrap();
        sink.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("id,score,note,ok").count(), 1, "{text}");
        let ids: Vec<i64> = read_back(&path, ',')
            .iter()
            .flat_map(|b| {
                let ids = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow_array::Int64Array>();
                ids.unwrap().values().to_vec()
            })
            .collect();
        assert_eq!(ids, (0..9).collect::<Vec<_>>());

        // A restart at 0 (no checkpoint had rows) writes the header again; a file shorter than
        // the checkpoint was changed by someone else.
        let mut sink = c.open_at(0).unwrap();
        sink.write_batch(&scalars(0)).unwrap();
        sink.flush().unwrap();
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("id,score,note,ok\n0,"));
        let e = c.open_at(1 << 20).err().unwrap().to_string();
        assert!(e.contains("changed outside the pipeline"), "{e}");
    }

    #[test]
    fn columns_a_csv_field_cannot_hold_are_refused_at_validation() {
        use arrow_schema::{Field, Fields};
        let c = sink_config(std::path::Path::new("r.csv"), serde_json::json!({}));
        let boxes = DataType::List(Arc::new(Field::new("item", DataType::Float32, true)));
        let schema = Schema::new(vec![
            Field::new("frame", DataType::Int64, false),
            Field::new("boxes", boxes, true),
            Field::new("camera_id", DataType::Utf8, false),
        ]);
        let e = c.check_input(&schema).unwrap_err();
        assert!(e.starts_with("column `boxes` (List("), "{e}");
        assert!(
            e.contains("`select: { columns: [frame, camera_id] }`") && e.contains("jsonl"),
            "{e}"
        );

        let tensor =
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 4);
        let point = DataType::Struct(Fields::from(vec![Field::new("x", DataType::Int32, false)]));
        let schema = Schema::new(vec![
            Field::new("pixels", DataType::Binary, false),
            Field::new("t", tensor, false),
            Field::new("p", point, true),
        ]);
        let e = c.check_input(&schema).unwrap_err();
        assert!(
            e.starts_with("columns `pixels` (Binary), `t` (FixedSizeList("),
            "{e}"
        );
        assert!(e.contains("`p` (Struct(") && !e.contains("select"), "{e}");
        assert_eq!(c.check_input(&scalars(0).schema()), Ok(()));
    }

    #[test]
    fn the_sinks_keys_are_checked() {
        let yaml = "path: r.csv\ndelimiter: \"\\t\"\nheader: false";
        let c: CsvSinkConfig = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!((c.delimiter, c.header), ('\t', false));
        let e = sink_config(
            std::path::Path::new("r.csv"),
            serde_json::json!({"delimiter": "\""}),
        )
        .build()
        .err()
        .unwrap();
        assert_eq!(e.located().0, Some("delimiter"));
        assert!(e.to_string().contains("other than a quote"), "{e}");
        let unknown = serde_json::json!({"path": "r.csv", "has_header": true});
        assert!(serde_json::from_value::<CsvSinkConfig>(unknown).is_err());
        let two = serde_json::json!({"path": "r.csv", "delimiter": ";;"});
        assert!(serde_json::from_value::<CsvSinkConfig>(two).is_err());
    }
}
