//! The Arrow side of protobuf types: how each type's values become Arrow values, and the Arrow
//! fields of a message (see the protobuf module's documentation for the mapping).

use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, TimeUnit};
use prost_reflect::{EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};

use super::{declared_fields, map_entries, UTC};
use crate::protobuf::ProtoFormatError;

/// How values of a protobuf type become Arrow values.
#[derive(Clone, Debug)]
pub(crate) enum Shape {
    Bool,
    Int32,
    Int64,
    UInt32,
    UInt64,
    Float32,
    Float64,
    Utf8,
    Binary,
    Enum(EnumDescriptor),
    /// `google.protobuf.Timestamp`.
    Timestamp(MessageDescriptor),
    /// `google.protobuf.*Value`: the shape of its field 1, `value`.
    Wrapper(MessageDescriptor, Box<Shape>),
    Message(MessageDescriptor),
}

/// Full names of protobuf's wrapper messages.
const WRAPPERS: [&str; 9] = [
    "google.protobuf.DoubleValue",
    "google.protobuf.FloatValue",
    "google.protobuf.Int64Value",
    "google.protobuf.UInt64Value",
    "google.protobuf.Int32Value",
    "google.protobuf.UInt32Value",
    "google.protobuf.BoolValue",
    "google.protobuf.StringValue",
    "google.protobuf.BytesValue",
];

pub(crate) fn shape(kind: &Kind) -> Shape {
    match kind {
        Kind::Bool => Shape::Bool,
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Shape::Int32,
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Shape::Int64,
        Kind::Uint32 | Kind::Fixed32 => Shape::UInt32,
        Kind::Uint64 | Kind::Fixed64 => Shape::UInt64,
        Kind::Float => Shape::Float32,
        Kind::Double => Shape::Float64,
        Kind::String => Shape::Utf8,
        Kind::Bytes => Shape::Binary,
        Kind::Enum(e) => Shape::Enum(e.clone()),
        Kind::Message(m) => match m.full_name() {
            "google.protobuf.Timestamp" => Shape::Timestamp(m.clone()),
            name if WRAPPERS.contains(&name) => match m.get_field(1) {
                Some(value) => Shape::Wrapper(m.clone(), Box::new(shape(&value.kind()))),
                None => Shape::Message(m.clone()),
            },
            _ => Shape::Message(m.clone()),
        },
    }
}

/// The Arrow fields of `message`'s fields; `stack` holds the messages being expanded, to refuse
/// recursive types.
pub(super) fn message_fields(
    message: &MessageDescriptor,
    stack: &mut Vec<String>,
) -> Result<Fields, ProtoFormatError> {
    stack.push(message.full_name().to_owned());
    let fields = declared_fields(message)
        .iter()
        .map(|f| arrow_field(f, stack))
        .collect::<Result<Vec<_>, _>>();
    stack.pop();
    Ok(fields?.into())
}

fn arrow_field(
    field: &FieldDescriptor,
    stack: &mut Vec<String>,
) -> Result<Field, ProtoFormatError> {
    let unsupported = |what: String| ProtoFormatError::Unsupported {
        message: field.parent_message().full_name().to_owned(),
        field: field.name().to_owned(),
        what,
    };
    // Errors from deeper down already name their field; a recursion found here does not.
    let locate = |e: ProtoFormatError| match e {
        ProtoFormatError::Unsupported { field, what, .. } if field.is_empty() => unsupported(what),
        other => other,
    };
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(unsupported("a map whose entry is not a message".into()));
        };
        let key = shape(&entry.map_entry_key_field().kind())
            .data_type(stack)
            .map_err(locate)?;
        let value = shape(&entry.map_entry_value_field().kind())
            .data_type(stack)
            .map_err(locate)?;
        return Ok(Field::new(
            field.name(),
            DataType::Map(map_entries(key, value), false),
            false,
        ));
    }
    let data_type = shape(&field.kind()).data_type(stack).map_err(locate)?;
    if field.is_list() {
        return Ok(Field::new(
            field.name(),
            DataType::List(Arc::new(Field::new_list_field(data_type, false))),
            false,
        ));
    }
    Ok(Field::new(
        field.name(),
        data_type,
        field.supports_presence(),
    ))
}

impl Shape {
    fn data_type(&self, stack: &mut Vec<String>) -> Result<DataType, ProtoFormatError> {
        Ok(match self {
            Shape::Bool => DataType::Boolean,
            Shape::Int32 => DataType::Int32,
            Shape::Int64 => DataType::Int64,
            Shape::UInt32 => DataType::UInt32,
            Shape::UInt64 => DataType::UInt64,
            Shape::Float32 => DataType::Float32,
            Shape::Float64 => DataType::Float64,
            Shape::Utf8 | Shape::Enum(_) => DataType::Utf8,
            Shape::Binary => DataType::Binary,
            Shape::Timestamp(_) => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
            Shape::Wrapper(_, inner) => inner.data_type(stack)?,
            Shape::Message(m) => {
                if stack.iter().any(|s| s == m.full_name()) {
                    return Err(ProtoFormatError::Unsupported {
                        message: stack.last().cloned().unwrap_or_default(),
                        field: String::new(),
                        what: format!(
                            "message `{}` contains itself ({} -> {}): recursive types have no Arrow type",
                            m.full_name(),
                            stack.join(" -> "),
                            m.full_name()
                        ),
                    });
                }
                DataType::Struct(message_fields(m, stack)?)
            }
        })
    }
}
