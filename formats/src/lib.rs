//! Payload formats: how the bytes of a record (a line or CSV record of a file, the value of a
//! Kafka message) become rows of an Arrow [`RecordBatch`], and back. Every connector that
//! decodes or encodes payloads uses this crate: the `csv`, `jsonl` and `avro` file sources, the
//! Kafka source and sink, `riffle produce`. The schema-registry client lives here too
//! ([`schema_registry`], the `schemas` feature), with the HTTP helpers it shares with the
//! webhook sink ([`web`]).
//!
//! - [`json`]: one JSON object per record; schema inferred from sample records.
//! - [`csv`]: one CSV record per record; schema inferred from sample records.
//! - [`raw`]: `raw` and `jpeg` payloads, kept whole in a `bytes` column.
//! - [`picture`]: how a decoded picture travels (RGB8 pixels beside `width` and `height`), the
//!   contract between the sources that make pictures and the vision stages that read them.
//! - [`ColumnType`], [`DeclaredSchema`] and [`declared_schema`]: columns declared in the
//!   pipeline file instead of inferred (scalars, and fixed-size lists of numbers for JSON).
//!
//! Decoding never fails the run on bad data: [`Decoder::decode_or_reject`] decodes a chunk of
//! records at once and, if any record is bad, decodes them one by one so that each bad record
//! becomes a [`DeadLetter`] with its reason while the others are kept.

// No panic on data or configuration in library code (its unit tests may unwrap): this crate
// reads what comes from outside.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

#[cfg(feature = "schemas")]
pub mod avro;
pub mod csv;
pub mod json;
pub mod picture;
#[cfg(feature = "schemas")]
pub mod protobuf;
pub mod raw;
mod schema;
#[cfg(feature = "schemas")]
pub mod schema_registry;
#[cfg(feature = "schemas")]
pub mod value;
pub mod web;

#[cfg(test)]
mod tests;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::DataflowResult;
use serde::Deserialize;

pub use schema::{declared_required, declared_schema, ColumnType, DeclaredColumn, DeclaredSchema};

/// Message value formats of the Kafka source (`format:`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MessageFormat {
    /// One JSON object per message (arrow-json).
    Json,
    /// One CSV record per message, no header (arrow-csv).
    Csv,
    /// An encoded image: the value lands in a `bytes` column for `decode`.
    Jpeg,
    /// Any payload, as a `bytes` column.
    Raw,
    /// Avro (`avro:` and/or `schema_registry:` give the schema).
    Avro,
    /// Protobuf (`protobuf:` and/or `schema_registry:` give the schema).
    Protobuf,
}

impl MessageFormat {
    /// The schema'd format, for `avro` and `protobuf`.
    #[cfg(feature = "schemas")]
    pub fn schemaful(self) -> Option<value::SchemaFormat> {
        match self {
            MessageFormat::Avro => Some(value::SchemaFormat::Avro),
            MessageFormat::Protobuf => Some(value::SchemaFormat::Protobuf),
            _ => None,
        }
    }

    /// The text format that decodes into columns, or `None` for payloads kept whole.
    pub fn text(self) -> Option<TextFormat> {
        match self {
            MessageFormat::Json => Some(TextFormat::Json),
            MessageFormat::Csv => Some(TextFormat::Csv { delimiter: b',' }),
            MessageFormat::Jpeg
            | MessageFormat::Raw
            | MessageFormat::Avro
            | MessageFormat::Protobuf => None,
        }
    }
}

/// Formats whose records decode into columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextFormat {
    Json,
    Csv { delimiter: u8 },
}

impl TextFormat {
    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            TextFormat::Json => "json",
            TextFormat::Csv { .. } => "csv",
        }
    }
}

/// What one payload holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Exactly one record (a Kafka message): anything more or less is rejected.
    Message,
    /// A record as a file's framing cut it (a JSON line, which may hold several objects; a CSV
    /// record, which may span lines).
    FileRecord,
}

/// Decodes payloads of one format into batches of one schema.
#[derive(Clone, Debug)]
pub struct Decoder {
    format: TextFormat,
    framing: Framing,
    /// The columns of the decoded batches.
    schema: SchemaRef,
    /// The columns a record is read as, and which of them make `schema`, when they differ (a
    /// CSV header with columns the declared schema leaves out, or orders otherwise).
    read: Option<(SchemaRef, Vec<usize>)>,
    /// Columns every record must have (not null), by index.
    required: Vec<usize>,
}

/// The rows of the payloads that decoded, which payloads those were, and dead letters for the
/// others.
#[derive(Debug)]
pub struct Decoded {
    pub batch: RecordBatch,
    /// Indices of the payloads behind the rows of `batch`, ascending.
    pub kept: Vec<usize>,
    pub rejected: Vec<DeadLetter>,
}

impl Decoder {
    pub fn new(format: TextFormat, framing: Framing, schema: SchemaRef) -> Self {
        Decoder {
            format,
            framing,
            schema,
            read: None,
            required: Vec::new(),
        }
    }

    /// Reads records as `read` and keeps its columns `columns`, in that order (which must give
    /// this decoder's schema).
    pub fn reading(mut self, read: SchemaRef, columns: Vec<usize>) -> Self {
        self.read = Some((read, columns));
        self
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Requires the named columns of every record (names not in the schema are ignored).
    pub fn with_required(mut self, names: &[String]) -> Self {
        self.required = names
            .iter()
            .filter_map(|n| self.schema.index_of(n).ok())
            .collect();
        self.required.sort_unstable();
        self.required.dedup();
        self
    }

    /// Names of the columns that every record of `sample` that decodes has (not null): an
    /// inferred schema's required columns. None when no record decodes.
    pub fn complete_columns(&self, sample: &[&[u8]]) -> Vec<String> {
        let Ok(decoded) = self.decode_or_reject(sample, |_, _| DeadLetter {
            stage: String::new(),
            reason: String::new(),
            record: String::new(),
        }) else {
            return Vec::new();
        };
        if decoded.batch.num_rows() == 0 {
            return Vec::new();
        }
        self.schema
            .fields()
            .iter()
            .zip(decoded.batch.columns())
            .filter(|(_, c)| c.null_count() == 0)
            .map(|(f, _)| f.name().clone())
            .collect()
    }

    /// Names of the required columns.
    pub fn required(&self) -> Vec<&str> {
        self.required
            .iter()
            .map(|&i| self.schema.field(i).name().as_str())
            .collect()
    }

    /// All of `payloads` as one batch, or the first error if any payload is bad.
    pub fn decode(&self, payloads: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
        let read = self.read.as_ref().map_or(&self.schema, |(read, _)| read);
        let batch = match self.format {
            TextFormat::Json => json::decode(read, self.framing, payloads),
            TextFormat::Csv { delimiter } => csv::decode(read, delimiter, self.framing, payloads),
        }?;
        let batch = match &self.read {
            Some((_, columns)) => RecordBatch::try_new(
                self.schema.clone(),
                batch.project(columns)?.columns().to_vec(),
            )?,
            None => batch,
        };
        let missing: Vec<String> = self
            .required
            .iter()
            .filter(|&&i| batch.column(i).null_count() > 0)
            .map(|&i| format!("`{}`", self.schema.field(i).name()))
            .collect();
        if missing.is_empty() {
            return Ok(batch);
        }
        let s = if missing.len() > 1 { "s" } else { "" };
        let message = format!("missing required column{s} {}", missing.join(", "));
        Err(match self.format {
            TextFormat::Json => ArrowError::JsonError(message),
            TextFormat::Csv { .. } => ArrowError::CsvError(message),
        })
    }

    /// Decodes `payloads` at once; if that fails, payload by payload, so that only the bad
    /// ones are rejected. `dead_letter(i, reason)` describes bad payload `i`.
    pub fn decode_or_reject(
        &self,
        payloads: &[&[u8]],
        mut dead_letter: impl FnMut(usize, &ArrowError) -> DeadLetter,
    ) -> DataflowResult<Decoded> {
        if let Ok(batch) = self.decode(payloads) {
            return Ok(Decoded {
                batch,
                kept: (0..payloads.len()).collect(),
                rejected: Vec::new(),
            });
        }
        let mut good = Vec::with_capacity(payloads.len());
        let mut kept = Vec::with_capacity(payloads.len());
        let mut rejected = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            match self.decode(std::slice::from_ref(payload)) {
                Ok(batch) => {
                    good.push(batch);
                    kept.push(i);
                }
                Err(e) => rejected.push(dead_letter(i, &e)),
            }
        }
        let batch = arrow_select::concat::concat_batches(&self.schema, &good)?;
        Ok(Decoded {
            batch,
            kept,
            rejected,
        })
    }

    /// A decoding error as a dead letter's reason, naming `line` of the file the record starts
    /// on where the parser would name its own numbering.
    /// The reason is cut to an excerpt: a parser's message may quote a whole record.
    pub fn reason(&self, error: &ArrowError, line: Option<u64>) -> String {
        let reason = match (self.format, line) {
            (TextFormat::Csv { .. }, Some(line)) => csv::reason_at_line(error, line),
            _ => error.to_string(),
        };
        excerpt(&reason)
    }
}

/// Longest text of a record quoted in an error or a dead letter's reason.
pub const MAX_EXCERPT_BYTES: usize = 300;

/// `text` cut to at most [`MAX_EXCERPT_BYTES`] (at a character boundary), saying how long it was.
pub fn excerpt(text: &str) -> String {
    excerpt_within(text, MAX_EXCERPT_BYTES)
}

/// `text` cut to at most `max` bytes (at a character boundary), saying how long it was.
pub fn excerpt_within(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// The payload without trailing line ends.
#[allow(
    clippy::indexing_slicing,
    reason = "`end` is an index of `value` + 1, or 0"
)]
pub(crate) fn trim_line_end(value: &[u8]) -> &[u8] {
    let end = value
        .iter()
        .rposition(|&b| b != b'\n' && b != b'\r')
        .map_or(0, |i| i + 1);
    &value[..end]
}
