//! An array's values as protobuf values, by its column's plan: one per row, `None` where the
//! row is null (its field left unset).

use std::collections::HashMap;
use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, StructArray};
use arrow_cast::{cast_with_options, CastOptions};
use arrow_schema::{DataType, TimeUnit};
use bytes::Bytes;
use prost_reflect::{DynamicMessage, EnumDescriptor, MessageDescriptor, Value};

use super::plan::{Leaf, Member, Plan};
use super::set;

/// The values of `array` by `plan`, one per row (`None`: null, the field left unset).
pub(super) fn values(plan: &Plan, array: &ArrayRef) -> Result<Vec<Option<Value>>, String> {
    match plan {
        Plan::Null => Ok(vec![None; array.len()]),
        Plan::Leaf { leaf, target } => cast_leaf_values(leaf, target, array),
        Plan::Timestamp { message, unit } => timestamp_values(message, *unit, array),
        Plan::Wrapper(message, inner) => wrapper_values(message, inner, array),
        Plan::Message(message, members) => message_values(message, members, array),
        Plan::List(item) => list_values(item, array),
        Plan::Map { key, value } => map_values(key, value, array),
    }
}

/// `array` cast to the leaf's type, out-of-range values an error rather than null, then read.
fn cast_leaf_values(
    leaf: &Leaf,
    target: &DataType,
    array: &ArrayRef,
) -> Result<Vec<Option<Value>>, String> {
    let cast = cast_with_options(
        array,
        target,
        &CastOptions {
            safe: false,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    leaf_values(leaf, &cast)
}

/// `google.protobuf.Timestamp` messages of a Timestamp column in `unit`s.
fn timestamp_values(
    message: &MessageDescriptor,
    unit: TimeUnit,
    array: &ArrayRef,
) -> Result<Vec<Option<Value>>, String> {
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
    let mut out = Vec::with_capacity(array.len());
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
    Ok(out)
}

/// Wrapper messages (`google.protobuf.Int64Value`, …) around the values of `inner`.
fn wrapper_values(
    message: &MessageDescriptor,
    inner: &Plan,
    array: &ArrayRef,
) -> Result<Vec<Option<Value>>, String> {
    values(inner, array)?
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
        .collect()
}

/// Messages of a Struct column, each child column filling its member's field.
fn message_values(
    message: &MessageDescriptor,
    members: &[Member],
    array: &ArrayRef,
) -> Result<Vec<Option<Value>>, String> {
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
        columns.push(values(&member.plan, column).map_err(|e| format!("`{}`: {e}", member.name))?);
    }
    let len = array.len();
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
    Ok(out)
}

/// Lists of a list column's items by `item`; a null item is an error.
fn list_values(item: &Plan, array: &ArrayRef) -> Result<Vec<Option<Value>>, String> {
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
        .collect()
}

/// Maps of a map column (or a list of key-value structs), keys and values by their plans.
fn map_values(key: &Plan, value: &Plan, array: &ArrayRef) -> Result<Vec<Option<Value>>, String> {
    let (ranges, entries) = map_parts(array)?;
    let column = |n: &str, i: usize| {
        entries
            .column_by_name(n)
            .or_else(|| entries.columns().get(i))
            .cloned()
            .ok_or_else(|| format!("map entries have no `{n}`"))
    };
    let mut keys = values(key, &column("key", 0)?)?;
    let mut vals = values(value, &column("value", 1)?)?;
    let mut out = Vec::with_capacity(array.len());
    for range in ranges {
        let Some(range) = range else {
            out.push(None);
            continue;
        };
        out.push(Some(map_row(&mut keys, &mut vals, range)?));
    }
    Ok(out)
}

/// The entry range of each row of a map column (`None` for null rows), and its entries.
type MapParts = (Vec<Option<Range<usize>>>, StructArray);

fn map_parts(array: &ArrayRef) -> Result<MapParts, String> {
    if let Some(map) = array.as_map_opt() {
        let offsets = map.value_offsets();
        let ranges = (0..array.len())
            .map(|row| {
                (!map.is_null(row)).then(|| {
                    let start = offsets.get(row).copied().unwrap_or(0);
                    let end = offsets.get(row + 1).copied().unwrap_or(start);
                    usize::try_from(start).unwrap_or(0)..usize::try_from(end).unwrap_or(0)
                })
            })
            .collect();
        return Ok((ranges, map.entries().clone()));
    }
    let (ranges, items) = list_parts(array)?;
    let Some(entries) = items.as_struct_opt() else {
        return Err(format!(
            "expected Struct<key, value> entries, found {}",
            items.data_type()
        ));
    };
    Ok((ranges, entries.clone()))
}

/// The map of one row: the keys and values in `range`, taken out of `keys` and `vals`.
fn map_row(
    keys: &mut [Option<Value>],
    vals: &mut [Option<Value>],
    range: Range<usize>,
) -> Result<Value, String> {
    let mut map = HashMap::with_capacity(range.len());
    let ks = take_range(keys, range.clone())
        .ok_or_else(|| "a null map key: protobuf maps cannot hold nulls".to_string())?;
    let vs = take_range(vals, range)
        .ok_or_else(|| "a null map value: protobuf maps cannot hold nulls".to_string())?;
    for (k, v) in ks.into_iter().zip(vs) {
        let k = k
            .into_map_key()
            .ok_or_else(|| "a map key of a type protobuf keys cannot have".to_string())?;
        map.insert(k, v);
    }
    Ok(Value::Map(map))
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
