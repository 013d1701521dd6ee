//! JSON payloads: one object per record (arrow-json), schema inferred from sample records.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use serde_json::Value;

use super::Framing;

/// Infers columns from sample payloads. Payloads that are not JSON objects are skipped (they
/// are rejected when read); when types conflict, the schema comes from the payloads that agree
/// with the earlier ones, leaving the others to be rejected.
pub fn infer_schema<'a>(
    payloads: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Schema, ArrowError> {
    let mut order: Vec<String> = Vec::new();
    let objects: Vec<Value> = payloads
        .into_iter()
        .filter(|v| !too_deep(v, MAX_DEPTH))
        .filter_map(|v| {
            let value = serde_json::from_slice::<Value>(v).ok()?;
            if value.is_object() {
                note_keys(v, &mut order);
            }
            Some(value)
        })
        .filter(Value::is_object)
        .collect();
    let infer = |values: &[&Value]| {
        arrow_json::reader::infer_json_schema_from_iterator(values.iter().map(|v| Ok(*v)))
    };
    let all: Vec<&Value> = objects.iter().collect();
    let schema = match infer(&all) {
        Ok(schema) => schema,
        Err(_) => {
            let mut agreeing: Vec<&Value> = Vec::with_capacity(objects.len());
            for value in &objects {
                agreeing.push(value);
                if infer(&agreeing).is_err() {
                    agreeing.pop();
                }
            }
            infer(&agreeing)?
        }
    };
    Ok(in_written_order(schema, &order))
}

/// `schema`'s fields in the order their keys were first written in the samples (a
/// `serde_json::Value` sorts them).
fn in_written_order(schema: Schema, order: &[String]) -> Schema {
    let mut fields: Vec<arrow_schema::FieldRef> = order
        .iter()
        .filter_map(|k| schema.fields().find(k).map(|(_, f)| f.clone()))
        .collect();
    for f in schema.fields() {
        if !fields.iter().any(|g| g.name() == f.name()) {
            fields.push(f.clone());
        }
    }
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// Appends the top-level keys of the JSON object `bytes` not yet in `order`, as written.
fn note_keys(bytes: &[u8], order: &mut Vec<String>) {
    struct Keys(Vec<String>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(key) = map.next_key::<String>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        keys.push(key);
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    if let Ok(Keys(keys)) = serde_json::from_slice::<Keys>(bytes) {
        for key in keys {
            if !order.contains(&key) {
                order.push(key);
            }
        }
    }
}

/// Deepest nesting of arrays and objects accepted in a record.
pub const MAX_DEPTH: usize = 64;

/// What the JSON value starting `bytes` is, in words (`None`: an object, or nothing).
fn non_object(bytes: &[u8]) -> Option<&'static str> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace())?;
    Some(match first {
        b'{' => return None,
        b'[' => "an array",
        b'"' => "a string",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        b'-' | b'0'..=b'9' => "a number",
        _ => return None,
    })
}

/// Whether arrays and objects nest deeper than `max` anywhere in `bytes` (strings skipped).
fn too_deep(bytes: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Refuses a payload that is not an object or nests too deep, before the parser sees it.
fn check_shape(payload: &[u8]) -> Result<(), ArrowError> {
    if let Some(kind) = non_object(payload) {
        return Err(ArrowError::JsonError(format!(
            "expected a JSON object, got {kind}"
        )));
    }
    if too_deep(payload, MAX_DEPTH) {
        return Err(ArrowError::JsonError(format!(
            "JSON nested deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(())
}

pub(super) fn decode(
    schema: &SchemaRef,
    framing: Framing,
    payloads: &[&[u8]],
) -> Result<RecordBatch, ArrowError> {
    for payload in payloads {
        check_shape(payload)?;
    }
    let relaxed = relaxed(schema);
    let read = relaxed.as_ref().unwrap_or(schema);
    let batch = match framing {
        Framing::Message => decode_messages(read, payloads),
        Framing::FileRecord => decode_lines(read, payloads),
    }?;
    match relaxed {
        Some(_) => tightened(batch, schema),
        None => Ok(batch),
    }
}

/// `schema` with the elements of its fixed-size lists nullable, when any are not: a null
/// element then decodes, for [`tightened`] to refuse naming its column (Arrow's own check
/// would fail the record without saying which column).
fn relaxed(schema: &SchemaRef) -> Option<SchemaRef> {
    let strict = |f: &Field| matches!(f.data_type(), DataType::FixedSizeList(item, _) if !item.is_nullable());
    if !schema.fields().iter().any(|f| strict(f)) {
        return None;
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::FixedSizeList(item, size) if strict(f) => {
                let item = Arc::new(item.as_ref().clone().with_nullable(true));
                f.as_ref()
                    .clone()
                    .with_data_type(DataType::FixedSizeList(item, *size))
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    Some(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// `batch` (decoded with [`relaxed`]'s schema) in `schema`, or an error naming the first
/// column with a null list element in a record that has the list.
fn tightened(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let (DataType::FixedSizeList(item, size), Some(list)) =
            (field.data_type(), column.as_fixed_size_list_opt())
        else {
            columns.push(column.clone());
            continue;
        };
        let values = list.values();
        if values.null_count() > 0 {
            let k = *size as usize;
            let bad = (0..list.len())
                .filter(|&row| list.is_valid(row))
                .find_map(|row| (0..k).find(|&j| values.is_null(row * k + j)));
            if let Some(j) = bad {
                return Err(ArrowError::JsonError(format!(
                    "whilst decoding field '{}': element {j} of the list is null",
                    field.name()
                )));
            }
        }
        columns.push(Arc::new(FixedSizeListArray::try_new(
            item.clone(),
            *size,
            values.clone(),
            list.nulls().cloned(),
        )?));
    }
    RecordBatch::try_new(schema.clone(), columns)
}

/// One JSON object per message; fails if any message holds anything else.
fn decode_messages(schema: &SchemaRef, values: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
    // One spare row, so a second value in the last message is seen rather than left unread.
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(values.len() + 1)
        .build_decoder()?;
    for (i, value) in values.iter().enumerate() {
        let read = decoder.decode(value)?;
        if decoder.has_partial_record() {
            return Err(ArrowError::JsonError(
                "incomplete JSON value in the message".to_string(),
            ));
        }
        let rows = decoder.len();
        if rows <= i {
            return Err(ArrowError::JsonError(
                "the message holds no JSON value".to_string(),
            ));
        }
        if rows > i + 1 || read < value.len() {
            return Err(ArrowError::JsonError(
                "the message holds more than one JSON value".to_string(),
            ));
        }
    }
    Ok(decoder
        .flush()?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
}

/// Lines of a JSON-lines file, each holding whole values (usually one object).
#[allow(
    clippy::indexing_slicing,
    reason = "`n` is what the decoder consumed of `buf`"
)]
fn decode_lines(schema: &SchemaRef, lines: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(lines.len().max(1))
        .build_decoder()?;
    let mut batches = Vec::with_capacity(1);
    for line in lines {
        let mut buf = *line;
        while !buf.is_empty() {
            let n = decoder.decode(buf)?;
            buf = &buf[n..];
            // The decoder stops early only when its batch is full.
            if !buf.is_empty() {
                match decoder.flush()? {
                    Some(batch) => batches.push(batch),
                    None if n == 0 => {
                        return Err(ArrowError::JsonError(
                            "JSON decoder made no progress".to_string(),
                        ))
                    }
                    None => {}
                }
            }
        }
        // Each line must hold whole records: a value left open is a bad line, not the start
        // of a multi-line record.
        if decoder.has_partial_record() {
            return Err(ArrowError::JsonError(
                "incomplete JSON value on the line".to_string(),
            ));
        }
    }
    batches.extend(decoder.flush()?);
    arrow_select::concat::concat_batches(schema, &batches)
}
