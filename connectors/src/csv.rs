//! CSV source: a CSV file with columns declared (`schema:`) or inferred from its first
//! records. Inference and decoding are [`crate::formats::csv`]'s; this file reads and deals the
//! records.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::formats::{self, DeclaredSchema, Decoder, TextFormat};
use crate::text::{check_config, Framing, RecordReader, TextPartition, INFER_BYTES};

use crate::kind::Limits;
use crate::kind::SourceKind;
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
        let delimiter = match config.delimiter {
            None => b',',
            Some(c) if c.is_ascii() && c != '\n' && c != '\r' && c != '"' => c as u8,
            Some(c) => {
                return Err(DataflowError::Config(format!(
                    "csv source: delimiter {c:?} must be an ASCII character other than a quote or newline"
                )))
            }
        };
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
}
