//! The Arrow builders of a batch: one per column, following its field's protobuf type, that
//! decoded messages are appended to.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, ListArray, MapArray, StructArray};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, FieldRef, Fields};
use prost_reflect::{
    DynamicMessage, EnumDescriptor, FieldDescriptor, MapKey, MessageDescriptor, Value,
};

use crate::excerpt;
use crate::protobuf::schema::{declared_fields, shape, Shape, UTC};
use crate::protobuf::{ProtoFormatError, ProtoSchema};

/// The builders of a batch: the reader's message as the root struct.
pub(super) struct Root(StructColumn);

impl Root {
    pub(super) fn new(reader: &ProtoSchema, capacity: usize) -> Result<Self, ProtoFormatError> {
        Ok(Root(StructColumn::new(
            reader.descriptor(),
            reader.arrow_schema().fields(),
            capacity,
        )?))
    }

    /// Appends a message's fields as a row; on an error the builders hold part of the row.
    pub(super) fn append(&mut self, message: &DynamicMessage) -> Result<(), String> {
        self.0.append_fields(message)
    }

    /// The batch's columns.
    pub(super) fn finish(self) -> Result<Vec<ArrayRef>, ArrowError> {
        self.0
            .children
            .into_iter()
            .map(|c| c.column.finish())
            .collect()
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
