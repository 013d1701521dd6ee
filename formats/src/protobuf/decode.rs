//! Protobuf payloads to Arrow rows: each payload decoded by prost-reflect with the reader's
//! descriptor, the messages then appended straight into Arrow builders (faster than going
//! through arrow-json with prost-reflect's serde, see the benchmark in `tests.rs`, and bytes
//! stay bytes).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, ListArray, MapArray, RecordBatch, RecordBatchOptions, StructArray};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, FieldRef, Fields, SchemaRef};
use prost_reflect::{
    DynamicMessage, EnumDescriptor, FieldDescriptor, FileDescriptor, MapKey, MessageDescriptor,
    Value,
};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::DataflowResult;

use super::schema::{
    compile_registered, declared_fields, first_conflict, message_at, schema_type_name, shape,
    Shape, UTC,
};
use super::{read_message_indexes, ProtoFormatError, ProtoSchema};
use crate::schema_registry::{wire, RegistryError, SchemaLookup, SchemaType};
use crate::{excerpt, Decoded};

/// What a payload holds around the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoFraming {
    /// The registry's prefix (a zero byte, the writer schema's id), the message indexes, then
    /// the message.
    Confluent,
    /// The message alone.
    Plain,
}

/// Decodes Protobuf payloads into batches of the reader's columns.
///
/// Every payload decodes with the reader's message (fields it does not know are skipped, as
/// protobuf readers do). With the Confluent framing and `writers`, each writer schema id (and
/// message indexes) is checked once, then remembered: its message must be the reader's (same
/// full name) and every field number both have must have types that read as each other
/// (strictly: see `schema::first_conflict`); payloads of other writers are rejected. Registry
/// failures reject the payloads of that id for the rest of the call and are asked again on the
/// next. Without `writers` the framing is stripped unchecked.
#[derive(Clone)]
pub struct ProtobufDecoder {
    reader: ProtoSchema,
    schema: SchemaRef,
    framing: ProtoFraming,
    writers: Option<Arc<dyn SchemaLookup>>,
    /// Verdicts on writer schemas by id; shared by clones. Registry failures are not kept here.
    checked: Arc<Mutex<HashMap<u32, Writer>>>,
}

impl fmt::Debug for ProtobufDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtobufDecoder")
            .field("reader", &self.reader)
            .field("framing", &self.framing)
            // The lookup's own Debug could show registry credentials.
            .field("checks_writers", &self.writers.is_some())
            .finish_non_exhaustive()
    }
}

/// A writer schema, once fetched.
enum Writer {
    /// It compiled: the verdict for each message path seen so far.
    File {
        file: FileDescriptor,
        verdicts: HashMap<Vec<i32>, Result<(), String>>,
    },
    /// It never will be read (not Protobuf, does not compile): the reason.
    Refused(String),
}

/// What one call of `decode_or_reject` remembers about writers beyond the shared cache.
#[derive(Default)]
struct Session {
    /// The last writer id and message path found compatible.
    last_ok: Option<(u32, Vec<i32>)>,
    /// Registry failures by id, asked again on the next call, not for every payload of this one.
    failed: HashMap<u32, String>,
}

/// The rows, the payloads behind them, and the payloads rejected with their reasons.
type Outcome = (RecordBatch, Vec<usize>, Vec<(usize, String)>);

fn schema_error(e: ProtoFormatError) -> ArrowError {
    match e {
        ProtoFormatError::Arrow(e) => e,
        other => ArrowError::SchemaError(other.to_string()),
    }
}

impl ProtobufDecoder {
    /// A decoder of `reader`'s messages, framed by `framing`; `writers` are where Confluent
    /// framing's writer schema ids are looked up for checking.
    pub fn new(
        reader: ProtoSchema,
        framing: ProtoFraming,
        writers: Option<Arc<dyn SchemaLookup>>,
    ) -> Result<Self, ProtoFormatError> {
        // Columns are built from the reader's descriptor and these fields, which must agree.
        Root::new(&reader, 0)?;
        Ok(ProtobufDecoder {
            schema: reader.arrow_schema(),
            reader,
            framing,
            writers,
            checked: Arc::default(),
        })
    }

    /// The columns of the decoded batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Decodes `payloads` into rows in payload order; a payload that does not decode (bad
    /// framing, bytes that are not the message, an incompatible or unknown writer schema)
    /// becomes `dead_letter(i, reason)` instead, the others are kept.
    pub fn decode_or_reject(
        &self,
        payloads: &[&[u8]],
        mut dead_letter: impl FnMut(usize, &str) -> DeadLetter,
    ) -> DataflowResult<Decoded> {
        let mut session = Session::default();
        let (batch, kept, mut bad) = match self.decode_streaming(payloads, &mut session)? {
            Some(outcome) => outcome,
            None => self.decode_keeping(payloads, &mut session)?,
        };
        // A registry that cannot be reached (after the client's retries) says nothing about
        // the messages: stop rather than turn good messages into dead letters.
        if let Some(reason) = session.failed.values().next() {
            return Err(riffle_dataflow::DataflowError::stage(
                "source",
                format!("{reason}; stopping rather than rejecting messages that may be good (raise schema_registry.timeout_ms to ride out longer outages)"),
            ));
        }
        bad.sort_by_key(|(i, _)| *i);
        let rejected = bad
            .iter()
            .map(|(i, reason)| dead_letter(*i, &excerpt(reason)))
            .collect();
        Ok(Decoded {
            batch,
            kept,
            rejected,
        })
    }

    /// Appends each message as it is decoded (the fast path); `None` when a message's values
    /// do not fit its columns (a Timestamp out of range), which builders cannot take back.
    fn decode_streaming(
        &self,
        payloads: &[&[u8]],
        session: &mut Session,
    ) -> DataflowResult<Option<Outcome>> {
        let mut root = Root::new(&self.reader, payloads.len()).map_err(schema_error)?;
        let mut kept = Vec::with_capacity(payloads.len());
        let mut bad = Vec::new();
        let mut indexes = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            match self.message(payload, &mut indexes, session) {
                Ok(message) => {
                    if root.0.append_fields(&message).is_err() {
                        return Ok(None);
                    }
                    kept.push(i);
                }
                Err(reason) => bad.push((i, reason)),
            }
        }
        let batch = self.finish(root, kept.len())?;
        Ok(Some((batch, kept, bad)))
    }

    /// Decodes every message first, then builds the columns, dropping each message whose
    /// values do not fit and building again.
    fn decode_keeping(&self, payloads: &[&[u8]], session: &mut Session) -> DataflowResult<Outcome> {
        let mut messages = Vec::with_capacity(payloads.len());
        let mut kept = Vec::with_capacity(payloads.len());
        let mut bad = Vec::new();
        let mut indexes = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            match self.message(payload, &mut indexes, session) {
                Ok(message) => {
                    messages.push(message);
                    kept.push(i);
                }
                Err(reason) => bad.push((i, reason)),
            }
        }
        let batch = loop {
            let mut root = Root::new(&self.reader, messages.len()).map_err(schema_error)?;
            let failed = messages
                .iter()
                .enumerate()
                .find_map(|(row, m)| root.0.append_fields(m).err().map(|e| (row, e)));
            match failed {
                None => break self.finish(root, messages.len())?,
                Some((row, reason)) if row < messages.len() => {
                    messages.remove(row);
                    bad.push((kept.remove(row), reason));
                }
                Some((_, reason)) => return Err(ArrowError::InvalidArgumentError(reason).into()),
            }
        };
        Ok((batch, kept, bad))
    }

    fn finish(&self, root: Root, rows: usize) -> Result<RecordBatch, ArrowError> {
        let columns = root
            .0
            .children
            .into_iter()
            .map(|c| c.column.finish())
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
    }

    /// The message in `payload`, or why there is none.
    fn message(
        &self,
        payload: &[u8],
        indexes: &mut Vec<i32>,
        session: &mut Session,
    ) -> Result<DynamicMessage, String> {
        let body = self.body(payload, indexes, session)?;
        let descriptor = self.reader.descriptor();
        DynamicMessage::decode(descriptor.clone(), body).map_err(|e| {
            format!(
                "protobuf: payload of {} bytes is not a `{}` message: {e}",
                body.len(),
                descriptor.full_name()
            )
        })
    }

    /// The message bytes of `payload`, its framing checked.
    fn body<'a>(
        &self,
        payload: &'a [u8],
        indexes: &mut Vec<i32>,
        session: &mut Session,
    ) -> Result<&'a [u8], String> {
        match self.framing {
            ProtoFraming::Plain => Ok(payload),
            ProtoFraming::Confluent => {
                let (id, rest) = wire::split(payload).map_err(|e| e.to_string())?;
                let body = read_message_indexes(rest, indexes)?;
                if let Some(writers) = &self.writers {
                    self.check_writer(writers.as_ref(), id, indexes, session)?;
                }
                Ok(body)
            }
        }
    }

    /// Whether payloads of writer schema `id`, message `indexes`, read as the reader's message.
    fn check_writer(
        &self,
        writers: &dyn SchemaLookup,
        id: u32,
        indexes: &[i32],
        session: &mut Session,
    ) -> Result<(), String> {
        if session
            .last_ok
            .as_ref()
            .is_some_and(|(ok_id, ok_indexes)| *ok_id == id && ok_indexes == indexes)
        {
            return Ok(());
        }
        if let Some(reason) = session.failed.get(&id) {
            return Err(reason.clone());
        }
        let cached = {
            let checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
            match checked.get(&id) {
                Some(Writer::Refused(reason)) => return Err(reason.clone()),
                Some(Writer::File { file, verdicts }) => match verdicts.get(indexes) {
                    Some(verdict) => Some(Ok(verdict.clone())),
                    None => Some(Err(file.clone())),
                },
                None => None,
            }
        };
        let verdict = match cached {
            Some(Ok(verdict)) => verdict,
            Some(Err(file)) => self.remember(id, file, indexes),
            // Fetched without holding the lock: other clones keep decoding meanwhile.
            None => match fetch_writer(writers, id) {
                Ok(file) => self.remember(id, file, indexes),
                Err(Fetched::Refused(reason)) => {
                    self.checked
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(id, Writer::Refused(reason.clone()));
                    Err(reason)
                }
                Err(Fetched::Failed(reason)) => {
                    session.failed.insert(id, reason.clone());
                    Err(reason)
                }
            },
        };
        if verdict.is_ok() {
            session.last_ok = Some((id, indexes.to_vec()));
        }
        verdict
    }

    /// Judges message `indexes` of writer `id`'s `file` against the reader, and keeps the verdict.
    fn remember(&self, id: u32, file: FileDescriptor, indexes: &[i32]) -> Result<(), String> {
        let reader = self.reader.descriptor();
        let verdict = match message_at(&file, indexes) {
            None => Err(format!(
                "writer schema id {id}: the payload's message indexes {indexes:?} name no message of the schema"
            )),
            Some(writer) if writer.full_name() != reader.full_name() => Err(format!(
                "writer schema id {id} wrote message `{}`, not the reader's `{}`",
                writer.full_name(),
                reader.full_name()
            )),
            Some(writer) => match first_conflict(&writer, reader) {
                Some(conflict) => Err(format!(
                    "writer schema id {id} is incompatible with the reader's `{}`: {conflict}",
                    reader.full_name()
                )),
                None => Ok(()),
            },
        };
        let mut checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
        match checked.entry(id).or_insert_with(|| Writer::File {
            file,
            verdicts: HashMap::new(),
        }) {
            Writer::File { verdicts, .. } => {
                verdicts.insert(indexes.to_vec(), verdict.clone());
            }
            Writer::Refused(_) => {}
        }
        verdict
    }
}

enum Fetched {
    /// The schema will never be read (kept).
    Refused(String),
    /// The registry did not answer (asked again later).
    Failed(String),
}

fn fetch_writer(writers: &dyn SchemaLookup, id: u32) -> Result<FileDescriptor, Fetched> {
    // Only an unreachable registry is worth asking again; its other answers are final.
    let failed = |e: RegistryError| match e {
        RegistryError::Request { .. } => Fetched::Failed(format!("writer schema id {id}: {e}")),
        _ => Fetched::Refused(format!("writer schema id {id}: {e}")),
    };
    let schema = writers.by_id(id).map_err(failed)?;
    if schema.schema_type != SchemaType::Protobuf {
        return Err(Fetched::Refused(format!(
            "writer schema id {id} is a {} schema, not PROTOBUF",
            schema_type_name(schema.schema_type)
        )));
    }
    let references = writers.references(&schema).map_err(failed)?;
    compile_registered(&schema, &references)
        .map(|(_, file)| file)
        .map_err(|e| Fetched::Refused(format!("writer schema id {id}: {e}")))
}

/// The builders of a batch: the reader's message as the root struct.
struct Root(StructColumn);

impl Root {
    fn new(reader: &ProtoSchema, capacity: usize) -> Result<Self, ProtoFormatError> {
        Ok(Root(StructColumn::new(
            reader.descriptor(),
            reader.arrow_schema().fields(),
            capacity,
        )?))
    }
}

/// One column's builder, following its protobuf type.
enum Column {
    Bool(BooleanBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    UInt32(UInt32Builder),
    UInt64(UInt64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Utf8(StringBuilder),
    Binary(BinaryBuilder),
    Enum(StringBuilder, EnumDescriptor),
    Timestamp(TimestampMicrosecondBuilder),
    /// A wrapper message: its field 1's column.
    Wrapper(Box<Column>),
    Struct(Box<StructColumn>),
    List(Box<ListColumn>),
    Map(Box<MapColumn>),
}

struct Child {
    field: FieldDescriptor,
    /// Null when the field is absent (it has presence).
    presence: bool,
    column: Column,
}

struct StructColumn {
    fields: Fields,
    children: Vec<Child>,
    nulls: NullBufferBuilder,
    len: usize,
}

struct ListColumn {
    item: FieldRef,
    offsets: Vec<i32>,
    nulls: NullBufferBuilder,
    values: Column,
}

struct MapColumn {
    entries: FieldRef,
    entry_fields: Fields,
    offsets: Vec<i32>,
    nulls: NullBufferBuilder,
    keys: Column,
    values: Column,
}

fn mismatch(data_type: &DataType) -> ProtoFormatError {
    ProtoFormatError::Arrow(ArrowError::SchemaError(format!(
        "protobuf decoder: column type {data_type} does not follow its field's type"
    )))
}

impl StructColumn {
    fn new(
        message: &MessageDescriptor,
        fields: &Fields,
        capacity: usize,
    ) -> Result<Self, ProtoFormatError> {
        let declared = declared_fields(message);
        if declared.len() != fields.len() {
            return Err(mismatch(&DataType::Struct(fields.clone())));
        }
        let children = declared
            .into_iter()
            .zip(fields.iter())
            .map(|(field, arrow)| {
                Ok(Child {
                    presence: arrow.is_nullable(),
                    column: Column::for_field(&field, arrow.data_type(), capacity)?,
                    field,
                })
            })
            .collect::<Result<Vec<_>, ProtoFormatError>>()?;
        Ok(StructColumn {
            fields: fields.clone(),
            children,
            nulls: NullBufferBuilder::new(capacity),
            len: 0,
        })
    }

    fn append_fields(&mut self, message: &DynamicMessage) -> Result<(), String> {
        for child in &mut self.children {
            if child.presence && !message.has_field(&child.field) {
                child.column.append_null();
            } else {
                child
                    .column
                    .append(&message.get_field(&child.field))
                    .map_err(|e| format!("field `{}`: {e}", child.field.name()))?;
            }
        }
        Ok(())
    }

    fn append(&mut self, message: &DynamicMessage) -> Result<(), String> {
        self.append_fields(message)?;
        self.nulls.append_non_null();
        self.len += 1;
        Ok(())
    }

    fn append_null(&mut self) {
        for child in &mut self.children {
            child.column.append_null();
        }
        self.nulls.append_null();
        self.len += 1;
    }

    fn finish(self) -> Result<ArrayRef, ArrowError> {
        let arrays = self
            .children
            .into_iter()
            .map(|c| c.column.finish())
            .collect::<Result<Vec<_>, _>>()?;
        let mut nulls = self.nulls;
        Ok(Arc::new(StructArray::try_new_with_length(
            self.fields,
            arrays,
            nulls.finish(),
            self.len,
        )?))
    }
}

fn next_offset(offsets: &[i32], added: usize) -> Result<i32, String> {
    let last = offsets.last().copied().unwrap_or(0);
    i32::try_from(added)
        .ok()
        .and_then(|n| last.checked_add(n))
        .ok_or_else(|| "more than 2^31 list or map items in one batch".to_string())
}

impl Column {
    fn for_field(
        field: &FieldDescriptor,
        data_type: &DataType,
        capacity: usize,
    ) -> Result<Self, ProtoFormatError> {
        if field.is_map() {
            let (DataType::Map(entries, _), prost_reflect::Kind::Message(entry)) =
                (data_type, field.kind())
            else {
                return Err(mismatch(data_type));
            };
            let DataType::Struct(entry_fields) = entries.data_type() else {
                return Err(mismatch(data_type));
            };
            let [key_type, value_type] = [0, 1].map(|i| {
                entry_fields
                    .get(i)
                    .map(|f| f.data_type().clone())
                    .unwrap_or(DataType::Null)
            });
            let mut offsets = Vec::with_capacity(capacity + 1);
            offsets.push(0);
            return Ok(Column::Map(Box::new(MapColumn {
                entries: entries.clone(),
                entry_fields: entry_fields.clone(),
                offsets,
                nulls: NullBufferBuilder::new(capacity),
                keys: Column::for_shape(
                    &shape(&entry.map_entry_key_field().kind()),
                    &key_type,
                    capacity,
                )?,
                values: Column::for_shape(
                    &shape(&entry.map_entry_value_field().kind()),
                    &value_type,
                    capacity,
                )?,
            })));
        }
        if field.is_list() {
            let DataType::List(item) = data_type else {
                return Err(mismatch(data_type));
            };
            let mut offsets = Vec::with_capacity(capacity + 1);
            offsets.push(0);
            return Ok(Column::List(Box::new(ListColumn {
                item: item.clone(),
                offsets,
                nulls: NullBufferBuilder::new(capacity),
                values: Column::for_shape(&shape(&field.kind()), item.data_type(), capacity)?,
            })));
        }
        Column::for_shape(&shape(&field.kind()), data_type, capacity)
    }

    fn for_shape(
        shape: &Shape,
        data_type: &DataType,
        capacity: usize,
    ) -> Result<Self, ProtoFormatError> {
        Ok(match (shape, data_type) {
            (Shape::Bool, DataType::Boolean) => {
                Column::Bool(BooleanBuilder::with_capacity(capacity))
            }
            (Shape::Int32, DataType::Int32) => Column::Int32(Int32Builder::with_capacity(capacity)),
            (Shape::Int64, DataType::Int64) => Column::Int64(Int64Builder::with_capacity(capacity)),
            (Shape::UInt32, DataType::UInt32) => {
                Column::UInt32(UInt32Builder::with_capacity(capacity))
            }
            (Shape::UInt64, DataType::UInt64) => {
                Column::UInt64(UInt64Builder::with_capacity(capacity))
            }
            (Shape::Float32, DataType::Float32) => {
                Column::Float32(Float32Builder::with_capacity(capacity))
            }
            (Shape::Float64, DataType::Float64) => {
                Column::Float64(Float64Builder::with_capacity(capacity))
            }
            (Shape::Utf8, DataType::Utf8) => {
                Column::Utf8(StringBuilder::with_capacity(capacity, 0))
            }
            (Shape::Binary, DataType::Binary) => {
                Column::Binary(BinaryBuilder::with_capacity(capacity, 0))
            }
            (Shape::Enum(e), DataType::Utf8) => {
                Column::Enum(StringBuilder::with_capacity(capacity, 0), e.clone())
            }
            (Shape::Timestamp(_), DataType::Timestamp(_, _)) => Column::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone(UTC),
            ),
            (Shape::Wrapper(_, inner), data_type) => {
                Column::Wrapper(Box::new(Column::for_shape(inner, data_type, capacity)?))
            }
            (Shape::Message(m), DataType::Struct(fields)) => {
                Column::Struct(Box::new(StructColumn::new(m, fields, capacity)?))
            }
            (_, data_type) => return Err(mismatch(data_type)),
        })
    }

    fn append(&mut self, value: &Value) -> Result<(), String> {
        match (self, value) {
            (Column::Bool(b), Value::Bool(v)) => b.append_value(*v),
            (Column::Int32(b), Value::I32(v)) => b.append_value(*v),
            (Column::Int64(b), Value::I64(v)) => b.append_value(*v),
            (Column::UInt32(b), Value::U32(v)) => b.append_value(*v),
            (Column::UInt64(b), Value::U64(v)) => b.append_value(*v),
            (Column::Float32(b), Value::F32(v)) => b.append_value(*v),
            (Column::Float64(b), Value::F64(v)) => b.append_value(*v),
            (Column::Utf8(b), Value::String(v)) => b.append_value(v),
            (Column::Binary(b), Value::Bytes(v)) => b.append_value(v),
            (Column::Enum(b, e), Value::EnumNumber(n)) => match e.get_value(*n) {
                Some(value) => b.append_value(value.name()),
                // Open enums keep numbers their schema does not name.
                None => b.append_value(n.to_string()),
            },
            (Column::Timestamp(b), Value::Message(m)) => b.append_value(timestamp_micros(m)?),
            (Column::Wrapper(inner), Value::Message(m)) => match m.get_field_by_number(1) {
                Some(v) => inner.append(&v)?,
                None => return Err("a wrapper message without its field 1".into()),
            },
            (Column::Struct(s), Value::Message(m)) => s.append(m)?,
            (Column::List(l), Value::List(items)) => {
                let end = next_offset(&l.offsets, items.len())?;
                for item in items {
                    l.values.append(item)?;
                }
                l.offsets.push(end);
                l.nulls.append_non_null();
            }
            (Column::Map(m), Value::Map(entries)) => {
                let end = next_offset(&m.offsets, entries.len())?;
                // Sorted: a HashMap's order would differ from run to run.
                let mut sorted: Vec<(&MapKey, &Value)> = entries.iter().collect();
                sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (key, value) in sorted {
                    m.keys.append_key(key)?;
                    m.values.append(value)?;
                }
                m.offsets.push(end);
                m.nulls.append_non_null();
            }
            (_, value) => {
                return Err(format!(
                    "value {} does not fit its column",
                    excerpt(&format!("{value:?}"))
                ))
            }
        }
        Ok(())
    }

    fn append_key(&mut self, key: &MapKey) -> Result<(), String> {
        match (self, key) {
            (Column::Bool(b), MapKey::Bool(v)) => b.append_value(*v),
            (Column::Int32(b), MapKey::I32(v)) => b.append_value(*v),
            (Column::Int64(b), MapKey::I64(v)) => b.append_value(*v),
            (Column::UInt32(b), MapKey::U32(v)) => b.append_value(*v),
            (Column::UInt64(b), MapKey::U64(v)) => b.append_value(*v),
            (Column::Utf8(b), MapKey::String(v)) => b.append_value(v),
            (_, key) => return Err(format!("map key {key:?} does not fit its column")),
        }
        Ok(())
    }

    fn append_null(&mut self) {
        match self {
            Column::Bool(b) => b.append_null(),
            Column::Int32(b) => b.append_null(),
            Column::Int64(b) => b.append_null(),
            Column::UInt32(b) => b.append_null(),
            Column::UInt64(b) => b.append_null(),
            Column::Float32(b) => b.append_null(),
            Column::Float64(b) => b.append_null(),
            Column::Utf8(b) | Column::Enum(b, _) => b.append_null(),
            Column::Binary(b) => b.append_null(),
            Column::Timestamp(b) => b.append_null(),
            Column::Wrapper(inner) => inner.append_null(),
            Column::Struct(s) => s.append_null(),
            Column::List(l) => {
                l.offsets.push(l.offsets.last().copied().unwrap_or(0));
                l.nulls.append_null();
            }
            Column::Map(m) => {
                m.offsets.push(m.offsets.last().copied().unwrap_or(0));
                m.nulls.append_null();
            }
        }
    }

    fn finish(self) -> Result<ArrayRef, ArrowError> {
        Ok(match self {
            Column::Bool(mut b) => Arc::new(b.finish()),
            Column::Int32(mut b) => Arc::new(b.finish()),
            Column::Int64(mut b) => Arc::new(b.finish()),
            Column::UInt32(mut b) => Arc::new(b.finish()),
            Column::UInt64(mut b) => Arc::new(b.finish()),
            Column::Float32(mut b) => Arc::new(b.finish()),
            Column::Float64(mut b) => Arc::new(b.finish()),
            Column::Utf8(mut b) | Column::Enum(mut b, _) => Arc::new(b.finish()),
            Column::Binary(mut b) => Arc::new(b.finish()),
            Column::Timestamp(mut b) => Arc::new(b.finish()),
            Column::Wrapper(inner) => inner.finish()?,
            Column::Struct(s) => s.finish()?,
            Column::List(l) => {
                let ListColumn {
                    item,
                    offsets,
                    mut nulls,
                    values,
                } = *l;
                Arc::new(ListArray::try_new(
                    item,
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    values.finish()?,
                    nulls.finish(),
                )?)
            }
            Column::Map(m) => {
                let MapColumn {
                    entries,
                    entry_fields,
                    offsets,
                    mut nulls,
                    keys,
                    values,
                } = *m;
                let entries_array = StructArray::try_new(
                    entry_fields,
                    vec![keys.finish()?, values.finish()?],
                    None,
                )?;
                Arc::new(MapArray::try_new(
                    entries,
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    entries_array,
                    nulls.finish(),
                    false,
                )?)
            }
        })
    }
}

/// A `google.protobuf.Timestamp` as microseconds since the epoch (nanoseconds below a
/// microsecond dropped, towards the past).
fn timestamp_micros(message: &DynamicMessage) -> Result<i64, String> {
    let seconds = message
        .get_field_by_number(1)
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let nanos = message
        .get_field_by_number(2)
        .and_then(|v| v.as_i32())
        .unwrap_or(0);
    seconds
        .checked_mul(1_000_000)
        .and_then(|micros| micros.checked_add(i64::from(nanos).div_euclid(1000)))
        .ok_or_else(|| {
            format!("Timestamp of {seconds} s and {nanos} ns is out of range of microseconds since 1970")
        })
}
