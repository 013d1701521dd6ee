//! CSV source: a CSV file with a schema inferred from its first records.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_csv::reader::Format;
use arrow_csv::ReaderBuilder;
use arrow_schema::{ArrowError, SchemaRef};
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;

use crate::text::{check_batch_size, Framing, Record, RecordDecoder, TextPartition};

/// Records read to infer the column types.
const INFER_RECORDS: usize = 1000;

/// `source: { csv: { path, has_header, batch_size, delimiter } }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvSourceConfig {
    pub path: PathBuf,
    /// Whether the first record names the columns (otherwise `column_1`, `column_2`, ...).
    #[serde(default = "default_true")]
    pub has_header: bool,
    /// Records per batch, and per chunk dealt to a worker.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Field separator, an ASCII character; `,` when unset.
    #[serde(default)]
    pub delimiter: Option<char>,
}

fn default_true() -> bool {
    true
}

fn default_batch_size() -> usize {
    1024
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
    schema: SchemaRef,
}

impl CsvSource {
    pub fn new(config: &CsvSourceConfig) -> DataflowResult<Self> {
        check_batch_size("csv", config.batch_size)?;
        let delimiter = match config.delimiter {
            None => b',',
            Some(c) if c.is_ascii() && c != '\n' && c != '\r' && c != '"' => c as u8,
            Some(c) => {
                return Err(DataflowError::Config(format!(
                    "csv source: delimiter {c:?} must be an ASCII character other than a quote or newline"
                )))
            }
        };
        let schema = infer_schema(&config.path, config.has_header, delimiter)?;
        Ok(CsvSource {
            path: config.path.clone(),
            has_header: config.has_header,
            batch_size: config.batch_size,
            delimiter,
            schema,
        })
    }
}

fn infer_schema(path: &Path, has_header: bool, delimiter: u8) -> DataflowResult<SchemaRef> {
    let file = File::open(path)
        .map_err(|e| DataflowError::io(format!("opening {}", path.display()), e))?;
    // Ragged rows must not stop inference: they are rejected one by one when decoded.
    let format = Format::default()
        .with_header(has_header)
        .with_delimiter(delimiter)
        .with_truncated_rows(true);
    let (schema, _) = format
        .infer_schema(std::io::BufReader::new(file), Some(INFER_RECORDS))
        .map_err(|e| {
            DataflowError::Config(format!(
                "csv source: cannot infer a schema from {}: {e}",
                path.display()
            ))
        })?;
    if schema.fields().is_empty() {
        return Err(DataflowError::Config(format!(
            "csv source: {} has no columns",
            path.display()
        )));
    }
    Ok(Arc::new(schema))
}

impl SourceFactory for CsvSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(self.schema.clone())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        let decoder = CsvDecoder {
            schema: self.schema.clone(),
            delimiter: self.delimiter,
        };
        let mut partition = TextPartition::new(
            &self.path,
            Framing::Csv {
                delimiter: self.delimiter,
                quote: b'"',
            },
            decoder,
            self.schema.clone(),
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

struct CsvDecoder {
    schema: SchemaRef,
    delimiter: u8,
}

impl RecordDecoder for CsvDecoder {
    fn decode(&self, records: &[Record]) -> Result<RecordBatch, ArrowError> {
        let mut decoder = ReaderBuilder::new(self.schema.clone())
            .with_header(false)
            .with_delimiter(self.delimiter)
            .with_batch_size(records.len().max(1))
            .build_decoder();
        let mut batches = Vec::with_capacity(1);
        for record in records {
            let mut buf = record.bytes.as_slice();
            while !buf.is_empty() {
                let n = decoder.decode(buf)?;
                buf = &buf[n..];
                if decoder.capacity() == 0 {
                    batches.extend(decoder.flush()?);
                } else if n == 0 {
                    break;
                }
            }
        }
        // An empty buffer tells the parser the input has ended.
        decoder.decode(&[])?;
        batches.extend(decoder.flush()?);
        arrow_select::concat::concat_batches(&self.schema, &batches)
    }

    fn reason(&self, error: &ArrowError, record: &Record) -> String {
        // The record was parsed alone, so the parser numbers it line 0 (values) or 1 (fields);
        // name the line in the file instead.
        let line = record.line;
        error
            .to_string()
            .replace(" at line 0.", &format!(" at line {line}."))
            .replace(" for line 1,", &format!(" for line {line},"))
    }
}
