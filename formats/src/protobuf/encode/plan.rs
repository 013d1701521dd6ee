//! Plans: how each input column becomes values of the field it fills, checked against the
//! message once, when the encoder is made.

use std::collections::HashSet;

use arrow_cast::can_cast_types;
use arrow_schema::{DataType, Fields, TimeUnit};
use prost_reflect::{EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};

use crate::protobuf::schema::{kind_name, shape, Shape};

/// A column (of the batch, or a child of a struct) and the field it fills.
#[derive(Clone)]
pub(super) struct Member {
    pub(super) index: usize,
    pub(super) name: String,
    pub(super) field: FieldDescriptor,
    pub(super) plan: Plan,
}

/// How an array becomes values of a protobuf type.
#[derive(Clone)]
pub(super) enum Plan {
    /// A Null column: the field is never set.
    Null,
    /// Cast to `target`, then read as the field's scalar.
    Leaf {
        leaf: Leaf,
        target: DataType,
    },
    Timestamp {
        message: MessageDescriptor,
        unit: TimeUnit,
    },
    Wrapper(MessageDescriptor, Box<Plan>),
    Message(MessageDescriptor, Vec<Member>),
    List(Box<Plan>),
    Map {
        key: Box<Plan>,
        value: Box<Plan>,
    },
}

#[derive(Clone)]
pub(super) enum Leaf {
    Bool,
    Int32,
    Int64,
    UInt32,
    UInt64,
    Float32,
    Float64,
    Utf8,
    Binary,
    EnumName(EnumDescriptor),
    EnumNumber,
}

/// Plans for the columns `fields` of `message`; an error names the column (dotted below the
/// top) and what was expected.
pub(super) fn plan_members(
    message: &MessageDescriptor,
    fields: &Fields,
    prefix: &str,
) -> Result<Vec<Member>, (String, String)> {
    let mut seen = HashSet::new();
    let mut members = Vec::with_capacity(fields.len());
    for (index, column) in fields.iter().enumerate() {
        let name = format!("{prefix}{}", column.name());
        let Some(field) = message.get_field_by_name(column.name()) else {
            let known: Vec<&str> = message
                .descriptor_proto()
                .field
                .iter()
                .map(|f| f.name())
                .collect();
            return Err((
                name,
                format!(
                    "message `{}` has no field of this name; it has: {}",
                    message.full_name(),
                    known.join(", ")
                ),
            ));
        };
        if !seen.insert(field.number()) {
            return Err((
                name,
                format!("a second column for field `{}`", field.name()),
            ));
        }
        let plan = plan_field(&field, column.data_type(), &name)?;
        members.push(Member {
            index,
            name,
            field,
            plan,
        });
    }
    Ok(members)
}

fn plan_field(
    field: &FieldDescriptor,
    data_type: &DataType,
    name: &str,
) -> Result<Plan, (String, String)> {
    if *data_type == DataType::Null {
        return Ok(Plan::Null);
    }
    let expected = |what: &str| {
        (
            name.to_owned(),
            format!(
                "field `{}` is {}: expected {what}, found {data_type}",
                field.name(),
                field_type_name(field)
            ),
        )
    };
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(expected("a Map"));
        };
        let entry_fields = entry_fields(data_type).map_err(expected)?;
        let [Some(key), Some(value)] = [entry_fields.first(), entry_fields.get(1)] else {
            return Err(expected("a Map"));
        };
        return Ok(Plan::Map {
            key: Box::new(plan_shape(
                &shape(&entry.map_entry_key_field().kind()),
                key.data_type(),
                &format!("{name}.key"),
            )?),
            value: Box::new(plan_shape(
                &shape(&entry.map_entry_value_field().kind()),
                value.data_type(),
                &format!("{name}.value"),
            )?),
        });
    }
    if field.is_list() {
        return match data_type {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
                Ok(Plan::List(Box::new(plan_shape(
                    &shape(&field.kind()),
                    item.data_type(),
                    &format!("{name}.item"),
                )?)))
            }
            _ => Err(expected("a List")),
        };
    }
    plan_shape(&shape(&field.kind()), data_type, name)
}

/// The key and value fields of a map column: a Map, or a List of Struct<key, value> (put in
/// that order); what was expected when it is neither.
fn entry_fields(data_type: &DataType) -> Result<Fields, &'static str> {
    match data_type {
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(fields) if fields.len() == 2 => Ok(fields.clone()),
            _ => Err("a Map"),
        },
        DataType::List(item) | DataType::LargeList(item) => match item.data_type() {
            DataType::Struct(fields)
                if fields.len() == 2
                    && fields.find("key").is_some()
                    && fields.find("value").is_some() =>
            {
                let ordered = ["key", "value"]
                    .map(|n| fields.find(n).map(|(_, f)| f.clone()))
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>();
                Ok(Fields::from(ordered))
            }
            _ => Err("a Map or a List of Struct<key, value>"),
        },
        _ => Err("a Map or a List of Struct<key, value>"),
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

fn plan_shape(shape: &Shape, data_type: &DataType, name: &str) -> Result<Plan, (String, String)> {
    let leaf = |leaf: Leaf, target: DataType| {
        if can_cast_types(data_type, &target) {
            Ok(Plan::Leaf { leaf, target })
        } else {
            Err((
                name.to_owned(),
                format!("cannot convert {data_type} to {target}"),
            ))
        }
    };
    let expected = |what: &str, protobuf: &str| {
        Err((
            name.to_owned(),
            format!("protobuf {protobuf} expects {what}, found {data_type}"),
        ))
    };
    match shape {
        Shape::Bool if *data_type == DataType::Boolean => leaf(Leaf::Bool, DataType::Boolean),
        Shape::Bool => expected("Boolean", "bool"),
        Shape::Int32 | Shape::Int64 | Shape::UInt32 | Shape::UInt64 if data_type.is_integer() => {
            match shape {
                Shape::Int32 => leaf(Leaf::Int32, DataType::Int32),
                Shape::Int64 => leaf(Leaf::Int64, DataType::Int64),
                Shape::UInt32 => leaf(Leaf::UInt32, DataType::UInt32),
                _ => leaf(Leaf::UInt64, DataType::UInt64),
            }
        }
        Shape::Int32 | Shape::Int64 | Shape::UInt32 | Shape::UInt64 => {
            expected("an integer type", "integer")
        }
        Shape::Float32 | Shape::Float64 if data_type.is_floating() || data_type.is_integer() => {
            match shape {
                Shape::Float32 => leaf(Leaf::Float32, DataType::Float32),
                _ => leaf(Leaf::Float64, DataType::Float64),
            }
        }
        Shape::Float32 | Shape::Float64 => expected("a number type", "float/double"),
        Shape::Utf8 if is_string(data_type) => leaf(Leaf::Utf8, DataType::Utf8),
        Shape::Utf8 => expected("Utf8", "string"),
        Shape::Binary if is_binary(data_type) || is_string(data_type) => {
            leaf(Leaf::Binary, DataType::Binary)
        }
        Shape::Binary => expected("Binary or Utf8", "bytes"),
        Shape::Enum(e) if is_string(data_type) => leaf(Leaf::EnumName(e.clone()), DataType::Utf8),
        Shape::Enum(_) if data_type.is_integer() => leaf(Leaf::EnumNumber, DataType::Int32),
        Shape::Enum(e) => expected(
            "Utf8 (value names) or an integer type (numbers)",
            &format!("enum {}", e.full_name()),
        ),
        Shape::Timestamp(message) => match data_type {
            DataType::Timestamp(unit, _) => Ok(Plan::Timestamp {
                message: message.clone(),
                unit: *unit,
            }),
            _ => expected("a Timestamp", "google.protobuf.Timestamp"),
        },
        Shape::Wrapper(message, inner) => Ok(Plan::Wrapper(
            message.clone(),
            Box::new(plan_shape(inner, data_type, name)?),
        )),
        Shape::Message(message) => match data_type {
            DataType::Struct(fields) => Ok(Plan::Message(
                message.clone(),
                plan_members(message, fields, &format!("{name}."))?,
            )),
            _ => expected("a Struct", &format!("message {}", message.full_name())),
        },
    }
}

fn field_type_name(field: &FieldDescriptor) -> String {
    if field.is_map() {
        "a map".into()
    } else if field.is_list() {
        format!("repeated {}", kind_name(&field.kind()))
    } else {
        kind_name(&field.kind())
    }
}
