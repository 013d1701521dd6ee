//! CSV payloads: one record per payload (arrow-csv), columns inferred from sample records or
//! a file's first records.

use std::io::{Cursor, Read};

use arrow_array::RecordBatch;
use arrow_csv::reader::Format;
use arrow_schema::{ArrowError, Schema, SchemaRef};

use super::{trim_line_end, Framing};

/// Infers columns from the first `max_records` records of CSV text (callers bound the text).
/// Ragged records do not stop inference: they are rejected one by one when decoded. A column is
/// typed by what at least [`MAJORITY`] of its sampled values are: a few values that drift from
/// the rest (`n/a` among numbers) become dead letters row by row instead of turning the whole
/// column into text.
pub fn infer_schema(
    mut text: impl Read,
    has_header: bool,
    delimiter: u8,
    max_records: usize,
) -> Result<Schema, ArrowError> {
    let mut bytes = Vec::new();
    text.read_to_end(&mut bytes)?;
    let format = Format::default()
        .with_header(has_header)
        .with_delimiter(delimiter)
        .with_truncated_rows(true);
    let (schema, _) = format.infer_schema(Cursor::new(&bytes), Some(max_records))?;
    Ok(by_majority(
        schema,
        &bytes,
        has_header,
        delimiter,
        max_records,
    ))
}

/// Share of a column's sampled values that decide its type.
pub const MAJORITY: f64 = 0.9;

/// `schema` with each text column that is mostly numbers (or booleans) typed as those.
fn by_majority(
    schema: Schema,
    bytes: &[u8],
    has_header: bool,
    delimiter: u8,
    max_records: usize,
) -> Schema {
    use arrow_array::cast::AsArray;
    use arrow_schema::{DataType, Field};
    let text_columns: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.data_type() == &DataType::Utf8)
        .map(|(i, _)| i)
        .collect();
    if text_columns.is_empty() {
        return schema;
    }
    let as_text = Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), DataType::Utf8, true))
            .collect::<Vec<_>>(),
    );
    let Ok(reader) = arrow_csv::ReaderBuilder::new(std::sync::Arc::new(as_text))
        .with_header(has_header)
        .with_delimiter(delimiter)
        .with_truncated_rows(true)
        .with_batch_size(max_records.max(1))
        .build(Cursor::new(bytes))
    else {
        return schema;
    };
    // A record the reader cannot split ends the sample there.
    let batches: Vec<RecordBatch> = reader.map_while(Result::ok).take(1).collect();
    let mut fields: Vec<arrow_schema::FieldRef> = schema.fields().iter().cloned().collect();
    for i in text_columns {
        let values: Vec<&str> = batches
            .iter()
            .filter_map(|b| b.column(i).as_string_opt::<i32>())
            .flat_map(|c| c.iter().flatten())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect();
        let share = |fits: fn(&str) -> bool| {
            if values.is_empty() {
                0.0
            } else {
                values.iter().filter(|v| fits(v)).count() as f64 / values.len() as f64
            }
        };
        let typed = if share(|v| v.parse::<i64>().is_ok()) >= MAJORITY {
            Some(DataType::Int64)
        } else if share(|v| v.parse::<f64>().is_ok()) >= MAJORITY {
            Some(DataType::Float64)
        } else if share(|v| v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("false"))
            >= MAJORITY
        {
            Some(DataType::Boolean)
        } else {
            None
        };
        if let (Some(data_type), Some(field)) = (typed, fields.get_mut(i)) {
            *field = std::sync::Arc::new(field.as_ref().clone().with_data_type(data_type));
        }
    }
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// Infers columns from sample payloads of one record each (no header, `,`-separated; columns
/// are named `column_1`, `column_2`, ...). Empty payloads are skipped.
pub fn infer_schema_from_payloads<'a>(
    payloads: impl IntoIterator<Item = &'a [u8]>,
    max_records: usize,
) -> Result<Schema, ArrowError> {
    let mut text = Vec::new();
    for payload in payloads {
        let record = trim_line_end(payload);
        if !record.is_empty() {
            text.extend_from_slice(record);
            text.push(b'\n');
        }
    }
    infer_schema(Cursor::new(text), false, b',', max_records)
}

pub(super) fn decode(
    schema: &SchemaRef,
    delimiter: u8,
    framing: Framing,
    payloads: &[&[u8]],
) -> Result<RecordBatch, ArrowError> {
    if let Some(list) = schema.fields().iter().find(|f| f.data_type().is_nested()) {
        return Err(ArrowError::CsvError(format!(
            "column `{}` is a list ({}), which a CSV field cannot hold; use JSON",
            list.name(),
            list.data_type()
        )));
    }
    match framing {
        Framing::Message => decode_messages(schema, delimiter, payloads),
        Framing::FileRecord => decode_records(schema, delimiter, payloads),
    }
}

/// The parser numbers a record decoded alone line 0 (values) or 1 (fields); `line` names the
/// record's line in its file instead.
pub(super) fn reason_at_line(error: &ArrowError, line: u64) -> String {
    error
        .to_string()
        .replace(" at line 0.", &format!(" at line {line}."))
        .replace(" for line 1,", &format!(" for line {line},"))
}

/// One CSV record (no header) per message; fails if any message holds anything else.
fn decode_messages(
    schema: &SchemaRef,
    delimiter: u8,
    values: &[&[u8]],
) -> Result<RecordBatch, ArrowError> {
    let capacity = values.len() + 1;
    let mut decoder = arrow_csv::ReaderBuilder::new(schema.clone())
        .with_header(false)
        .with_delimiter(delimiter)
        .with_batch_size(capacity)
        .build_decoder();
    for (i, value) in values.iter().enumerate() {
        let record = trim_line_end(value);
        if record.is_empty() {
            return Err(ArrowError::CsvError(
                "the message holds no CSV record".to_string(),
            ));
        }
        feed(&mut decoder, record)?;
        feed(&mut decoder, b"\n")?;
        let rows = capacity - decoder.capacity();
        if rows <= i {
            return Err(ArrowError::CsvError(
                "the message's CSV record does not end (unbalanced quote?)".to_string(),
            ));
        }
        if rows > i + 1 {
            return Err(ArrowError::CsvError(
                "the message holds more than one CSV record".to_string(),
            ));
        }
    }
    // An empty buffer tells the parser the input has ended.
    decoder.decode(&[])?;
    Ok(decoder
        .flush()?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
}

#[allow(
    clippy::indexing_slicing,
    reason = "`n` is what the decoder consumed of `buf`"
)]
fn feed(decoder: &mut arrow_csv::reader::Decoder, mut buf: &[u8]) -> Result<(), ArrowError> {
    while !buf.is_empty() {
        let n = decoder.decode(buf)?;
        if n == 0 {
            // Only a full batch stops the parser: more records than messages.
            return Err(ArrowError::CsvError(
                "the message holds more than one CSV record".to_string(),
            ));
        }
        buf = &buf[n..];
    }
    Ok(())
}

/// Records of a CSV file, as its framing cut them (a quoted field may span lines).
#[allow(
    clippy::indexing_slicing,
    reason = "`n` is what the decoder consumed of `buf`"
)]
fn decode_records(
    schema: &SchemaRef,
    delimiter: u8,
    records: &[&[u8]],
) -> Result<RecordBatch, ArrowError> {
    let mut decoder = arrow_csv::ReaderBuilder::new(schema.clone())
        .with_header(false)
        .with_delimiter(delimiter)
        .with_batch_size(records.len().max(1))
        .build_decoder();
    let mut batches = Vec::with_capacity(1);
    for record in records {
        let mut buf = *record;
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
    arrow_select::concat::concat_batches(schema, &batches)
}
