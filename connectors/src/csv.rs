//! CSV source: a CSV file with a schema inferred from its first records. Inference and
//! decoding are [`crate::formats::csv`]'s; this file reads and deals the records.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::formats::{self, Decoder, TextFormat};
use crate::text::{check_batch_size, Framing, TextPartition};

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
    let schema = formats::csv::infer_schema(
        std::io::BufReader::new(file),
        has_header,
        delimiter,
        INFER_RECORDS,
    )
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
        let decoder = Decoder::new(
            TextFormat::Csv {
                delimiter: self.delimiter,
            },
            formats::Framing::FileRecord,
            self.schema.clone(),
        );
        let mut partition = TextPartition::new(
            &self.path,
            Framing::Csv {
                delimiter: self.delimiter,
                quote: b'"',
            },
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
