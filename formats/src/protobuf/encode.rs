//! Arrow rows to Protobuf payloads: each column converted to prost-reflect values, each row
//! set into a `DynamicMessage` and encoded by prost.

use std::collections::HashSet;
use std::fmt;
use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_cast::{can_cast_types, cast_with_options, CastOptions};
use arrow_schema::{DataType, Fields, TimeUnit};
use bytes::Bytes;
use prost::Message as _;
use prost_reflect::{
    DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor, Value,
};

use super::schema::{kind_name, shape, Shape};
use super::{write_message_indexes, ProtoFormatError, ProtoSchema};
use crate::schema_registry::wire;

/// What is written around each message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeFraming {
    /// The registry's prefix with this schema id, the message indexes, then the message.
    Confluent(u32),
    /// The message alone.
    Plain,
}

/// Encodes rows as messages of one type: each column fills the field of its name.
///
/// Accepted column types, by field type: `bool` ← Boolean; integers and enum numbers ← any
/// integer type (values out of the field's range are an error); `float`/`double` ← floats and
/// integers; `string` ← Utf8 (any width); `bytes` ← binary or Utf8; enums ← Utf8 value names or
/// integers; `Timestamp` ← Timestamp of any unit; wrappers ← their scalar; messages ← Struct
/// (each child a field, by name); `repeated` ← List, LargeList, FixedSizeList; maps ← Map or a
/// List of Struct<key, value>; a Null column ← anything. Null values leave their field unset;
/// null list items, map keys or map values are errors (protobuf has no place for them).
#[derive(Clone)]
pub struct ProtobufEncoder {
    schema: ProtoSchema,
    input: Vec<DataType>,
    members: Vec<Member>,
    /// The encoded message indexes, for the Confluent framing.
    indexes: Vec<u8>,
}

impl fmt::Debug for ProtobufEncoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtobufEncoder")
            .field("schema", &self.schema)
            .field(
                "columns",
                &self.members.iter().map(|m| &m.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A column (of the batch, or a child of a struct) and the field it fills.
#[derive(Clone)]
struct Member {
    index: usize,
    name: String,
    field: FieldDescriptor,
    plan: Plan,
}

/// How an array becomes values of a protobuf type.
#[derive(Clone)]
enum Plan {
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
enum Leaf {
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

impl ProtobufEncoder {
    /// An encoder of rows of `input` as `schema`'s message. Every column must be a field of
    /// the message with a type that fits (see the type documentation); fields without a
    /// column are left unset.
    pub fn new(
        input: &arrow_schema::Schema,
        schema: ProtoSchema,
    ) -> Result<Self, ProtoFormatError> {
        let members = plan_members(schema.descriptor(), input.fields(), "")
            .map_err(|(column, what)| ProtoFormatError::Column { column, what })?;
        let mut indexes = Vec::new();
        write_message_indexes(&schema.message_indexes(), &mut indexes);
        Ok(ProtobufEncoder {
            input: input
                .fields()
                .iter()
                .map(|f| f.data_type().clone())
                .collect(),
            schema,
            members,
            indexes,
        })
    }

    /// One payload per row of `batch`, framed by `framing`.
    pub fn encode(
        &mut self,
        batch: &RecordBatch,
        framing: EncodeFraming,
    ) -> Result<Vec<Bytes>, ProtoFormatError> {
        let types: Vec<&DataType> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.data_type())
            .collect();
        if types.len() != self.input.len() || types.iter().zip(&self.input).any(|(a, b)| *a != b) {
            return Err(ProtoFormatError::Column {
                column: "(all)".into(),
                what: format!(
                    "batch columns ({}) differ from the columns the encoder was made for ({})",
                    join_types(types.iter().copied()),
                    join_types(self.input.iter())
                ),
            });
        }
        let mut columns = Vec::with_capacity(self.members.len());
        for member in &self.members {
            let array = batch.column(member.index);
            columns.push(
                values(&member.plan, array).map_err(|what| ProtoFormatError::Column {
                    column: member.name.clone(),
                    what,
                })?,
            );
        }
        let descriptor = self.schema.descriptor();
        let mut payloads = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let mut message = DynamicMessage::new(descriptor.clone());
            for (member, column) in self.members.iter().zip(columns.iter_mut()) {
                if let Some(value) = column.get_mut(row).and_then(Option::take) {
                    set(&mut message, &member.field, value).map_err(|what| {
                        ProtoFormatError::Column {
                            column: member.name.clone(),
                            what: format!("row {row}: {what}"),
                        }
                    })?;
                }
            }
            let mut buf =
                Vec::with_capacity(message.encoded_len() + wire::PREFIX_LEN + self.indexes.len());
            if let EncodeFraming::Confluent(id) = framing {
                buf.extend_from_slice(&wire::prefix(id));
                buf.extend_from_slice(&self.indexes);
            }
            message
                .encode(&mut buf)
                .map_err(|e| ProtoFormatError::Column {
                    column: "(all)".into(),
                    what: format!("row {row}: {e}"),
                })?;
            payloads.push(Bytes::from(buf));
        }
        Ok(payloads)
    }
}

fn join_types<'a>(types: impl Iterator<Item = &'a DataType>) -> String {
    types.map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

fn set(message: &mut DynamicMessage, field: &FieldDescriptor, value: Value) -> Result<(), String> {
    message
        .try_set_field(field, value)
        .map_err(|e| format!("field `{}`: {e}", field.name()))
}

/// Plans for the columns `fields` of `message`; an error names the column (dotted below the
/// top) and what was expected.
fn plan_members(
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
        let entry_fields = match data_type {
            DataType::Map(entries, _) => match entries.data_type() {
                DataType::Struct(fields) if fields.len() == 2 => fields.clone(),
                _ => return Err(expected("a Map")),
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
                    Fields::from(ordered)
                }
                _ => return Err(expected("a Map or a List of Struct<key, value>")),
            },
            _ => return Err(expected("a Map or a List of Struct<key, value>")),
        };
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

/// The values of `array` by `plan`, one per row (`None`: null, the field left unset).
fn values(plan: &Plan, array: &ArrayRef) -> Result<Vec<Option<Value>>, String> {
    let len = array.len();
    Ok(match plan {
        Plan::Null => vec![None; len],
        Plan::Leaf { leaf, target } => {
            let cast = cast_with_options(
                array,
                target,
                &CastOptions {
                    safe: false,
                    ..Default::default()
                },
            )
            .map_err(|e| e.to_string())?;
            leaf_values(leaf, &cast)?
        }
        Plan::Timestamp { message, unit } => {
            let raw = cast_with_options(array, &DataType::Int64, &CastOptions::default())
                .map_err(|e| e.to_string())?;
            let per_second: i64 = match unit {
                TimeUnit::Second => 1,
                TimeUnit::Millisecond => 1_000,
                TimeUnit::Microsecond => 1_000_000,
                TimeUnit::Nanosecond => 1_000_000_000,
            };
            let nanos_per_unit = 1_000_000_000 / per_second;
            let Some(raw) = raw.as_primitive_opt::<Int64Type>() else {
                return Err(format!("cannot read {} as Int64", array.data_type()));
            };
            let mut out = Vec::with_capacity(len);
            for v in raw.iter() {
                out.push(match v {
                    None => None,
                    Some(v) => {
                        let mut m = DynamicMessage::new(message.clone());
                        let nanos = v.rem_euclid(per_second) * nanos_per_unit;
                        m.try_set_field_by_number(1, Value::I64(v.div_euclid(per_second)))
                            .map_err(|e| e.to_string())?;
                        m.try_set_field_by_number(2, Value::I32(i32::try_from(nanos).unwrap_or(0)))
                            .map_err(|e| e.to_string())?;
                        Some(Value::Message(m))
                    }
                });
            }
            out
        }
        Plan::Wrapper(message, inner) => values(inner, array)?
            .into_iter()
            .map(|v| {
                v.map(|v| {
                    let mut m = DynamicMessage::new(message.clone());
                    m.try_set_field_by_number(1, v)
                        .map(|()| Value::Message(m))
                        .map_err(|e| e.to_string())
                })
                .transpose()
            })
            .collect::<Result<_, _>>()?,
        Plan::Message(message, members) => {
            let Some(structs) = array.as_struct_opt() else {
                return Err(format!(
                    "expected a Struct array, found {}",
                    array.data_type()
                ));
            };
            let mut columns = Vec::with_capacity(members.len());
            for member in members {
                let Some(column) = structs.columns().get(member.index) else {
                    return Err(format!("no child column `{}`", member.name));
                };
                columns.push(
                    values(&member.plan, column).map_err(|e| format!("`{}`: {e}", member.name))?,
                );
            }
            let mut out = Vec::with_capacity(len);
            for row in 0..len {
                if structs.is_null(row) {
                    out.push(None);
                    continue;
                }
                let mut m = DynamicMessage::new(message.clone());
                for (member, column) in members.iter().zip(columns.iter_mut()) {
                    if let Some(value) = column.get_mut(row).and_then(Option::take) {
                        set(&mut m, &member.field, value)?;
                    }
                }
                out.push(Some(Value::Message(m)));
            }
            out
        }
        Plan::List(item) => {
            let (ranges, items) = list_parts(array)?;
            let mut items = values(item, &items)?;
            ranges
                .into_iter()
                .map(|range| {
                    range
                        .map(|range| {
                            take_range(&mut items, range)
                                .map(Value::List)
                                .ok_or_else(|| {
                                    "a null list item: protobuf lists cannot hold nulls".to_string()
                                })
                        })
                        .transpose()
                })
                .collect::<Result<_, _>>()?
        }
        Plan::Map { key, value } => {
            let (ranges, entries) = if let Some(map) = array.as_map_opt() {
                let offsets = map.value_offsets();
                let ranges = (0..len)
                    .map(|row| {
                        (!map.is_null(row)).then(|| {
                            let start = offsets.get(row).copied().unwrap_or(0);
                            let end = offsets.get(row + 1).copied().unwrap_or(start);
                            usize::try_from(start).unwrap_or(0)..usize::try_from(end).unwrap_or(0)
                        })
                    })
                    .collect();
                (ranges, map.entries().clone())
            } else {
                let (ranges, items) = list_parts(array)?;
                let Some(entries) = items.as_struct_opt() else {
                    return Err(format!(
                        "expected Struct<key, value> entries, found {}",
                        items.data_type()
                    ));
                };
                (ranges, entries.clone())
            };
            let column = |n: &str, i: usize| {
                entries
                    .column_by_name(n)
                    .or_else(|| entries.columns().get(i))
                    .cloned()
                    .ok_or_else(|| format!("map entries have no `{n}`"))
            };
            let mut keys = values(key, &column("key", 0)?)?;
            let mut vals = values(value, &column("value", 1)?)?;
            let mut out = Vec::with_capacity(len);
            for range in ranges {
                let Some(range) = range else {
                    out.push(None);
                    continue;
                };
                let mut map = std::collections::HashMap::with_capacity(range.len());
                let ks = take_range(&mut keys, range.clone())
                    .ok_or_else(|| "a null map key: protobuf maps cannot hold nulls".to_string())?;
                let vs = take_range(&mut vals, range).ok_or_else(|| {
                    "a null map value: protobuf maps cannot hold nulls".to_string()
                })?;
                for (k, v) in ks.into_iter().zip(vs) {
                    let k = k.into_map_key().ok_or_else(|| {
                        "a map key of a type protobuf keys cannot have".to_string()
                    })?;
                    map.insert(k, v);
                }
                out.push(Some(Value::Map(map)));
            }
            out
        }
    })
}

/// The values in `range`, taken out of `items`; `None` when one is null (or out of range).
fn take_range(items: &mut [Option<Value>], range: Range<usize>) -> Option<Vec<Value>> {
    items.get_mut(range)?.iter_mut().map(Option::take).collect()
}

/// The item range of each row of a list array (`None` for null rows), and its items.
type ListParts = (Vec<Option<Range<usize>>>, ArrayRef);

fn list_parts(array: &ArrayRef) -> Result<ListParts, String> {
    let len = array.len();
    let ranges_of = |offsets: Vec<usize>| -> Vec<Option<Range<usize>>> {
        (0..len)
            .map(|row| {
                (!array.is_null(row)).then(|| {
                    let start = offsets.get(row).copied().unwrap_or(0);
                    start..offsets.get(row + 1).copied().unwrap_or(start)
                })
            })
            .collect()
    };
    if let Some(list) = array.as_list_opt::<i32>() {
        let offsets = list
            .value_offsets()
            .iter()
            .map(|&o| usize::try_from(o).unwrap_or(0))
            .collect();
        return Ok((ranges_of(offsets), list.values().clone()));
    }
    if let Some(list) = array.as_list_opt::<i64>() {
        let offsets = list
            .value_offsets()
            .iter()
            .map(|&o| usize::try_from(o).unwrap_or(0))
            .collect();
        return Ok((ranges_of(offsets), list.values().clone()));
    }
    if let Some(list) = array.as_fixed_size_list_opt() {
        let size = usize::try_from(list.value_length()).unwrap_or(0);
        let offsets = (0..=len).map(|row| row * size).collect();
        return Ok((ranges_of(offsets), list.values().clone()));
    }
    Err(format!(
        "expected a List array, found {}",
        array.data_type()
    ))
}

fn leaf_values(leaf: &Leaf, array: &ArrayRef) -> Result<Vec<Option<Value>>, String> {
    // `array` was cast to the leaf's type: the downcasts fail only if that cast lied.
    let not = |what: &str| format!("expected {what} after casting, found {}", array.data_type());
    fn prim<T: arrow_array::ArrowPrimitiveType>(
        array: &ArrayRef,
        f: impl Fn(T::Native) -> Value,
    ) -> Option<Vec<Option<Value>>> {
        Some(
            array
                .as_primitive_opt::<T>()?
                .iter()
                .map(|v| v.map(&f))
                .collect(),
        )
    }
    let values = match leaf {
        Leaf::Bool => array
            .as_boolean_opt()
            .map(|a| a.iter().map(|v| v.map(Value::Bool)).collect()),
        Leaf::Int32 => prim::<Int32Type>(array, Value::I32),
        Leaf::Int64 => prim::<Int64Type>(array, Value::I64),
        Leaf::UInt32 => prim::<UInt32Type>(array, Value::U32),
        Leaf::UInt64 => prim::<UInt64Type>(array, Value::U64),
        Leaf::Float32 => prim::<Float32Type>(array, Value::F32),
        Leaf::Float64 => prim::<Float64Type>(array, Value::F64),
        Leaf::EnumNumber => prim::<Int32Type>(array, Value::EnumNumber),
        Leaf::Utf8 => array.as_string_opt::<i32>().map(|a| {
            a.iter()
                .map(|v| v.map(|s| Value::String(s.to_owned())))
                .collect()
        }),
        Leaf::Binary => array.as_binary_opt::<i32>().map(|a| {
            a.iter()
                .map(|v| v.map(|b| Value::Bytes(Bytes::copy_from_slice(b))))
                .collect()
        }),
        Leaf::EnumName(e) => {
            let Some(names) = array.as_string_opt::<i32>() else {
                return Err(not("Utf8"));
            };
            return names
                .iter()
                .map(|v| v.map(|name| enum_number(e, name)).transpose())
                .collect();
        }
    };
    values.ok_or_else(|| not("the field's type"))
}

fn enum_number(e: &EnumDescriptor, name: &str) -> Result<Value, String> {
    match e.get_value_by_name(name) {
        Some(value) => Ok(Value::EnumNumber(value.number())),
        None => Err(format!(
            "`{name}` is not a value of enum {}; it has: {}",
            e.full_name(),
            e.values()
                .map(|v| v.name().to_owned())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
