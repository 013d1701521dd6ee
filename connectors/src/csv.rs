//! CSV source: a CSV file with a schema inferred from its first records. Inference and
//! decoding are [`crate::formats::csv`]'s; this file reads and deals the records.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::formats::{self, Decoder, TextFormat};
use crate::text::{check_config, Framing, RecordReader, TextPartition, INFER_BYTES};

/// Records read to infer the column types.
const INFER_RECORDS: usize = 1000;

/// `source: { csv: { path, has_header, batch_size, delimiter } }`.
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
}

/// A configured CSV source. Columns are inferred from the first 1000 records (all nullable;
/// integers, floats, booleans, dates and timestamps, else strings). A record with the wrong
/// number of fields or a value that does not parse as its column's type becomes a dead letter.
#[derive(Debug)]
pub struct CsvSource {
    path: PathBuf,
    has_header: bool,
    batch_size: usize,
    delimiter: u8,
    max_line_bytes: usize,
    schema: SchemaRef,
    /// Columns every sampled record had a value for: required of every record.
    required: Vec<String>,
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
        let (schema, required) = infer_schema(config, delimiter)?;
        Ok(CsvSource {
            required,
            path: config.path.clone(),
            has_header: config.has_header,
            batch_size: config.batch_size,
            delimiter,
            max_line_bytes: config.max_line_bytes,
            schema,
        })
    }
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
        Ok(self.schema.clone())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        let decoder = Decoder::new(
            TextFormat::Csv {
                delimiter: self.delimiter,
            },
            formats::Framing::FileRecord,
            self.schema.clone(),
        )
        .with_required(&self.required);
        let mut partition = TextPartition::new(
            &self.path,
            framing(self.delimiter),
            self.max_line_bytes,
            decoder,
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
            source.schema.field(0).data_type(),
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
