//! Arrow rows to Kafka message values, one Avro datum per row.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions, UInt32Array};
use arrow_avro::schema::{
    AvroSchema, FingerprintStrategy, AVRO_NAMESPACE_METADATA_KEY, AVRO_NAME_METADATA_KEY,
    SCHEMA_METADATA_KEY,
};
use arrow_avro::writer::format::{AvroBinaryFormat, AvroSoeFormat};
use arrow_avro::writer::{Encoder, WriterBuilder};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use serde_json::Value;

use super::decode::unframed;
use super::{AvroFormatError, EncodeFraming};
use crate::excerpt;

/// Encodes each row of a batch as one Avro datum, framed or not.
///
/// The writer schema is declared (Avro JSON) or derived from the results' columns by
/// arrow-avro. A declared schema must name every column of the results (columns it lacks are
/// an error, not dropped: select the columns to write first) and every field of it without a
/// default must be a column; fields with a default that are not columns are written with
/// their default.
#[derive(Debug)]
pub struct AvroEncoder {
    schema_text: String,
    record_name: Option<String>,
    /// The columns every batch must have, in order.
    input: SchemaRef,
    /// What the arrow-avro encoder writes: the input's columns, then the defaulted fields.
    writer: SchemaRef,
    /// One row of the declared fields' defaults that are not input columns.
    defaults: Option<RecordBatch>,
    /// Built on first use; an encoder bakes in the framing and the id.
    plain: Option<Box<Encoder>>,
    confluent: Option<Box<(u32, Encoder)>>,
}

impl AvroEncoder {
    /// An encoder of batches with the columns of `input`. With `declared` (Avro JSON) that is
    /// the writer schema; otherwise it is derived from `input`, as a record named
    /// `record_name` (a full name: `com.example.Click`).
    pub fn new(
        input: &Schema,
        declared: Option<&str>,
        record_name: &str,
    ) -> Result<Self, AvroFormatError> {
        let input = Arc::new(Schema::new(input.fields().clone()));
        let (schema_text, mut fields, defaults) = match declared {
            Some(text) => {
                let declared = check_declared(&input, text)?;
                (text.to_string(), declared.fields, declared.defaults)
            }
            None => {
                let text = derive(&input, record_name)?;
                (text, input.fields().iter().cloned().collect(), None)
            }
        };
        let record_name = serde_json::from_str::<Value>(&schema_text)
            .ok()
            .and_then(|v| full_name(&v));
        if let Some(defaults) = &defaults {
            fields.extend(defaults.schema_ref().fields().iter().cloned());
        }
        let metadata = HashMap::from([(SCHEMA_METADATA_KEY.to_string(), schema_text.clone())]);
        let writer = Arc::new(Schema::new_with_metadata(fields, metadata));
        let plain = WriterBuilder::new(writer.as_ref().clone())
            .build_encoder::<AvroBinaryFormat>()
            .map_err(|e| match declared {
                Some(_) => AvroFormatError::Columns(excerpt(&format!(
                    "the results' columns cannot be written with the declared Avro schema: {e}"
                ))),
                None => AvroFormatError::Columns(excerpt(&format!(
                    "the results' columns have no Avro encoding: {e}"
                ))),
            })?;
        Ok(AvroEncoder {
            schema_text,
            record_name,
            input,
            writer,
            defaults,
            plain: Some(Box::new(plain)),
            confluent: None,
        })
    }

    /// The writer schema's JSON, as registered.
    pub fn schema_text(&self) -> &str {
        &self.schema_text
    }

    /// The writer schema's record full name (`namespace.name`).
    pub fn record_name(&self) -> Option<String> {
        self.record_name.clone()
    }

    /// One payload per row of `batch`, in order. `batch` must have the columns the encoder
    /// was built for.
    pub fn encode(
        &mut self,
        batch: &RecordBatch,
        framing: EncodeFraming,
    ) -> Result<Vec<Bytes>, AvroFormatError> {
        let batch = self.writer_batch(batch)?;
        let encoder = match framing {
            EncodeFraming::Plain => match &mut self.plain {
                Some(encoder) => encoder,
                slot @ None => {
                    slot.insert(Box::new(build::<AvroBinaryFormat>(&self.writer, None)?))
                }
            },
            EncodeFraming::Confluent(id) => {
                let stale = self.confluent.as_ref().is_none_or(|built| built.0 != id);
                if stale {
                    let encoder = build::<AvroSoeFormat>(&self.writer, Some(id))?;
                    self.confluent = Some(Box::new((id, encoder)));
                }
                match self.confluent.as_deref_mut() {
                    Some((_, encoder)) => encoder,
                    None => return Err(AvroFormatError::Encode("no encoder was built".into())),
                }
            }
        };
        if let Err(e) = encoder.encode(&batch) {
            // Rows of a failed batch may be half written: the encoder starts afresh.
            match framing {
                EncodeFraming::Plain => self.plain = None,
                EncodeFraming::Confluent(_) => self.confluent = None,
            }
            return Err(AvroFormatError::Encode(excerpt(&e.to_string())));
        }
        Ok(encoder.flush().iter().collect())
    }

    /// `batch`'s columns, and the defaults of the declared fields it lacks, as the writer's.
    fn writer_batch(&self, batch: &RecordBatch) -> Result<RecordBatch, AvroFormatError> {
        let got = batch.schema_ref().fields();
        let want = self.input.fields();
        let fits = got.len() == want.len()
            && got
                .iter()
                .zip(want.iter())
                .all(|(g, w)| g.name() == w.name() && g.data_type() == w.data_type());
        if !fits {
            return Err(AvroFormatError::Columns(excerpt(&format!(
                "the batch's columns ({}) are not those the Avro encoder was built for ({})",
                names(got.iter().map(|f| f.as_ref())),
                names(want.iter().map(|f| f.as_ref()))
            ))));
        }
        let mut columns = batch.columns().to_vec();
        if let Some(defaults) = &self.defaults {
            let rows = u32::try_from(batch.num_rows()).map_err(|_| {
                AvroFormatError::Encode(format!("a batch of {} rows", batch.num_rows()))
            })?;
            let first = UInt32Array::from_iter_values(std::iter::repeat_n(0, rows as usize));
            for column in defaults.columns() {
                columns.push(
                    arrow_select::take::take(column.as_ref(), &first, None)
                        .map_err(|e| AvroFormatError::Encode(e.to_string()))?,
                );
            }
        }
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        RecordBatch::try_new_with_options(self.writer.clone(), columns, &options)
            .map_err(|e| AvroFormatError::Columns(excerpt(&e.to_string())))
    }
}

fn build<F: arrow_avro::writer::format::AvroFormat>(
    writer: &Schema,
    id: Option<u32>,
) -> Result<Encoder, AvroFormatError> {
    let mut builder = WriterBuilder::new(writer.clone());
    if let Some(id) = id {
        builder = builder.with_fingerprint_strategy(FingerprintStrategy::Id(id));
    }
    builder
        .build_encoder::<F>()
        .map_err(|e| AvroFormatError::Encode(excerpt(&e.to_string())))
}

fn names<'a>(fields: impl Iterator<Item = &'a Field>) -> String {
    fields
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The schema arrow-avro derives from `input`, as a record of full name `record_name`.
fn derive(input: &Schema, record_name: &str) -> Result<String, AvroFormatError> {
    let (namespace, name) = match record_name.rsplit_once('.') {
        Some((namespace, name)) => (Some(namespace), name),
        None => (None, record_name),
    };
    let mut metadata = HashMap::from([(AVRO_NAME_METADATA_KEY.to_string(), name.to_string())]);
    if let Some(namespace) = namespace.filter(|n| !n.is_empty()) {
        metadata.insert(
            AVRO_NAMESPACE_METADATA_KEY.to_string(),
            namespace.to_string(),
        );
    }
    let named = Schema::new_with_metadata(input.fields().clone(), metadata);
    AvroSchema::try_from(&named)
        .map(|s| s.json_string)
        .map_err(|e| {
            AvroFormatError::Columns(excerpt(&format!(
                "the results' columns have no Avro schema: {e}"
            )))
        })
}

/// The full name of a named schema (`namespace.name`, or a name with dots as it is).
fn full_name(schema: &Value) -> Option<String> {
    let name = schema.get("name")?.as_str()?;
    match schema.get("namespace").and_then(Value::as_str) {
        Some(namespace) if !namespace.is_empty() && !name.contains('.') => {
            Some(format!("{namespace}.{name}"))
        }
        _ => Some(name.to_string()),
    }
}

/// What a declared schema makes of the input's columns.
struct Declared {
    /// The input's fields, nullable where the Avro field is (so a null where it is not is
    /// refused with the batch).
    fields: Vec<Arc<Field>>,
    /// One row of the defaults of the fields that are not columns.
    defaults: Option<RecordBatch>,
}

/// Checks the declared record's fields against the input's columns: every column a field,
/// every field without a default a column, of a type that arrow-avro writes as that field's
/// Avro type (its encoder writes what the column's Arrow type says, whatever the schema).
fn check_declared(input: &Schema, text: &str) -> Result<Declared, AvroFormatError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| invalid_declared(format!("not JSON: {e}")))?;
    let fields = record_fields(&value)?;
    let schema = AvroSchema::new(text.to_string());
    let read = unframed(&schema, &schema)
        .map_err(|e| invalid_declared(e.to_string()))?
        .schema();
    let (declared, defaulted) = classify_fields(input, fields)?;
    Ok(Declared {
        fields: fit_columns(input, &read, &declared)?,
        defaults: defaults(&value, defaulted)?,
    })
}

fn invalid_declared(what: String) -> AvroFormatError {
    AvroFormatError::WriterSchema(excerpt(&what))
}

/// The fields of the declared schema, which must be a record.
fn record_fields(value: &Value) -> Result<&[Value], AvroFormatError> {
    match (
        value.get("type").and_then(Value::as_str),
        value.get("fields"),
    ) {
        (Some("record"), Some(Value::Array(fields))) => Ok(fields),
        _ => Err(invalid_declared(
            "expected a record (`{\"type\": \"record\", \"name\": …, \"fields\": […]}`), one \
             field per column"
                .into(),
        )),
    }
}

/// The names of the declared `fields`, and those of them that are not columns but have a
/// default (written with it); a field that is neither a column nor defaulted is an error.
fn classify_fields<'a>(
    input: &Schema,
    fields: &'a [Value],
) -> Result<(Vec<&'a str>, Vec<Value>), AvroFormatError> {
    let mut declared = Vec::with_capacity(fields.len());
    let mut required_missing = Vec::new();
    let mut defaulted = Vec::new();
    for field in fields {
        let name = field
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid_declared("a field has no `name`".into()))?;
        declared.push(name);
        if input.field_with_name(name).is_ok() {
            continue;
        }
        if field.get("default").is_some() {
            defaulted.push(field.clone());
        } else {
            required_missing.push(format!("`{name}`"));
        }
    }
    if !required_missing.is_empty() {
        let many = required_missing.len() > 1;
        return Err(AvroFormatError::Columns(excerpt(&format!(
            "the Avro schema's field{} {} {} no default and {} not among the results' columns \
             ({})",
            if many { "s" } else { "" },
            required_missing.join(", "),
            if many { "have" } else { "has" },
            if many { "are" } else { "is" },
            names(input.fields().iter().map(|f| f.as_ref()))
        ))));
    }
    Ok((declared, defaulted))
}

/// The input's fields, nullable as `read` (the declared schema as arrow-avro reads it) says;
/// a column that is not a `declared` field, or is not written as its field, is an error.
fn fit_columns(
    input: &Schema,
    read: &Schema,
    declared: &[&str],
) -> Result<Vec<Arc<Field>>, AvroFormatError> {
    let mut fitted = Vec::with_capacity(input.fields().len());
    let mut extra = Vec::new();
    let mut mismatched = Vec::new();
    for column in input.fields() {
        match read.field_with_name(column.name()) {
            Err(_) => extra.push(format!("`{}`", column.name())),
            Ok(field) if !same_encoding(column.data_type(), field.data_type()) => {
                mismatched.push(format!(
                    "`{}` is {}, which the Avro field is not written from (expected {})",
                    column.name(),
                    column.data_type(),
                    field.data_type()
                ))
            }
            Ok(field) => fitted.push(Arc::new(
                column.as_ref().clone().with_nullable(field.is_nullable()),
            )),
        }
    }
    if !extra.is_empty() {
        let many = extra.len() > 1;
        return Err(AvroFormatError::Columns(excerpt(&format!(
            "result column{} {} {} not in the Avro schema: expected only its fields ({}); select \
             the columns to write first",
            if many { "s" } else { "" },
            extra.join(", "),
            if many { "are" } else { "is" },
            declared.join(", ")
        ))));
    }
    if !mismatched.is_empty() {
        return Err(AvroFormatError::Columns(excerpt(&format!(
            "the results' columns cannot be written with the declared Avro schema: {}; cast them \
             first",
            mismatched.join("; ")
        ))));
    }
    Ok(fitted)
}

/// One row of the defaults of `defaulted` (fields of the declared record `declared`), as
/// arrow-avro reads them: an empty record, read as a record of those fields.
fn defaults(
    declared: &Value,
    defaulted: Vec<Value>,
) -> Result<Option<RecordBatch>, AvroFormatError> {
    if defaulted.is_empty() {
        return Ok(None);
    }
    let mut empty = declared.clone();
    let mut only_defaulted = declared.clone();
    if let Some(object) = empty.as_object_mut() {
        object.insert("fields".into(), Value::Array(Vec::new()));
    }
    if let Some(object) = only_defaulted.as_object_mut() {
        object.insert("fields".into(), Value::Array(defaulted));
    }
    unframed(
        &AvroSchema::new(empty.to_string()),
        &AvroSchema::new(only_defaulted.to_string()),
    )
    .and_then(|mut decoder| {
        decoder.decode(&[])?;
        decoder.flush().map_err(Into::into)
    })
    .map_err(|e| {
        AvroFormatError::WriterSchema(excerpt(&format!(
            "the defaults of the fields that are not columns: {e}"
        )))
    })
}

/// Whether arrow-avro writes a column of type `column` as it reads the Avro type it maps to
/// `read`: the same type, up to string and binary layouts, time zones and nested names.
fn same_encoding(column: &DataType, read: &DataType) -> bool {
    use DataType::*;
    match (column, read) {
        (Utf8 | LargeUtf8 | Utf8View, Utf8) => true,
        (Binary | LargeBinary | BinaryView, Binary) => true,
        (Timestamp(a, _), Timestamp(b, _)) => a == b,
        (List(a) | LargeList(a), List(b) | LargeList(b)) => {
            same_encoding(a.data_type(), b.data_type())
        }
        (Map(a, _), Map(b, _)) => same_encoding(a.data_type(), b.data_type()),
        (Struct(a), Struct(b)) => {
            a.len() == b.len()
                && a.iter().zip(b.iter()).all(|(a, b)| {
                    a.name() == b.name() && same_encoding(a.data_type(), b.data_type())
                })
        }
        (Dictionary(_, a), Dictionary(_, b)) => same_encoding(a, b),
        (a, b) => a.equals_datatype(b),
    }
}
