//! Batches → PostgreSQL's binary COPY format (`COPY … FROM STDIN BINARY`), written straight
//! from the Arrow arrays: per row a field count, then per column the value's length and its
//! bytes in the binary form of the column's [`Wire`] type (length -1: NULL).

use std::io::Write as _;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, LargeBinaryArray, LargeStringArray, PrimitiveArray,
    RecordBatch, StringArray, StringViewArray,
};
use arrow_buffer::NullBuffer;
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_json::writer::{EncoderOptions, NullableEncoder};
use arrow_schema::{DataType, Field, FieldRef, TimeUnit};

use super::json;
use super::types::{SqlType, Wire};

/// The signature, flags (no OIDs) and an empty header extension.
pub const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// A field count of -1 ends the data.
pub const TRAILER: &[u8] = &[0xff, 0xff];

/// PostgreSQL's epoch, 2000-01-01, in microseconds and days since the Unix epoch.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
const PG_EPOCH_DAYS: i32 = 10_957;

/// A batch's columns cast to what their wire forms are written from; [`Columns::rows`]
/// borrows them.
pub struct Columns {
    columns: Vec<Prepared>,
    json: EncoderOptions,
}

/// A column cast for its wire form, with its name and (for JSON) a field describing it.
struct Prepared {
    name: String,
    array: ArrayRef,
    field: FieldRef,
    wire: Wire,
    sql: SqlType,
}

impl Columns {
    /// `batch`'s columns, to be written as `wires` (one per column, the plan's). The error
    /// names the column.
    pub fn new(batch: &RecordBatch, wires: &[Wire], sql: &[SqlType]) -> Result<Columns, String> {
        if wires.len() != batch.num_columns() || sql.len() != batch.num_columns() {
            return Err(format!(
                "a batch of {} column(s) for a plan of {}",
                batch.num_columns(),
                wires.len()
            ));
        }
        if i16::try_from(wires.len()).is_err() {
            return Err(format!("{} columns are more than COPY takes", wires.len()));
        }
        let schema = batch.schema();
        let mut columns = Vec::with_capacity(wires.len());
        for ((column, field), (wire, sql)) in batch
            .columns()
            .iter()
            .zip(schema.fields())
            .zip(wires.iter().zip(sql))
        {
            let array = prepare(column, *wire, *sql)
                .map_err(|e| format!("column `{}`: {e}", field.name()))?;
            columns.push(Prepared {
                name: field.name().clone(),
                field: std::sync::Arc::new(Field::new(
                    field.name(),
                    array.data_type().clone(),
                    true,
                )),
                array,
                wire: *wire,
                sql: *sql,
            });
        }
        Ok(Columns {
            columns,
            json: json::options(),
        })
    }

    /// The writer of the rows.
    pub fn rows(&self) -> Result<Rows<'_>, String> {
        let mut columns = Vec::with_capacity(self.columns.len());
        for c in &self.columns {
            let column = Column::new(&c.array, &c.field, c.wire, c.sql, &self.json)
                .map_err(|e| format!("column `{}`: {e}", c.name))?;
            columns.push((c.name.as_str(), column));
        }
        Ok(Rows {
            count: (columns.len() as i16).to_be_bytes(),
            columns,
        })
    }
}

/// `array` as the Arrow type its wire form is written from (casts as Arrow makes them: a
/// timestamp's nanoseconds are cut to microseconds).
fn prepare(array: &ArrayRef, wire: Wire, sql: SqlType) -> Result<ArrayRef, String> {
    let cast =
        |to: &DataType| arrow_cast::cast(array, to).map_err(|e| format!("converting to {to}: {e}"));
    let keep = |types: &[DataType]| types.contains(array.data_type());
    match wire {
        Wire::Bool => cast(&DataType::Boolean),
        Wire::Int2 => cast(&DataType::Int16),
        Wire::Int4 => cast(&DataType::Int32),
        Wire::Int8 => cast(&DataType::Int64),
        Wire::Float4 => cast(&DataType::Float32),
        Wire::Float8 => cast(&DataType::Float64),
        // Times and decimals are shown as text, from the array as it is.
        Wire::Text if sql != SqlType::Text => Ok(array.clone()),
        Wire::Text if keep(&[DataType::Utf8, DataType::LargeUtf8, DataType::Utf8View]) => {
            Ok(array.clone())
        }
        Wire::Text => cast(&DataType::Utf8),
        Wire::Bytea if keep(&[DataType::Binary, DataType::LargeBinary]) => Ok(array.clone()),
        Wire::Bytea => cast(&DataType::LargeBinary),
        Wire::Timestamp => {
            let tz = match array.data_type() {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            cast(&DataType::Timestamp(TimeUnit::Microsecond, tz))
        }
        Wire::Date => cast(&DataType::Date32),
        Wire::Numeric | Wire::Jsonb => Ok(array.clone()),
    }
}

/// Writes rows in the binary COPY format.
pub struct Rows<'a> {
    count: [u8; 2],
    columns: Vec<(&'a str, Column<'a>)>,
}

impl Rows<'_> {
    /// Appends row `row` to `out`; the error names the column.
    pub fn write(&mut self, row: usize, out: &mut Vec<u8>) -> Result<(), String> {
        out.extend_from_slice(&self.count);
        for (name, column) in &mut self.columns {
            column
                .write(row, out)
                .map_err(|e| format!("column `{name}`: {e}"))?;
        }
        Ok(())
    }
}

/// One column's values and how they are written.
struct Column<'a> {
    nulls: Option<NullBuffer>,
    values: Values<'a>,
}

enum Values<'a> {
    Bool(&'a BooleanArray),
    Int2(&'a PrimitiveArray<Int16Type>),
    Int4(&'a PrimitiveArray<Int32Type>),
    Int8(&'a PrimitiveArray<Int64Type>),
    Float4(&'a PrimitiveArray<Float32Type>),
    Float8(&'a PrimitiveArray<Float64Type>),
    Utf8(&'a StringArray),
    LargeUtf8(&'a LargeStringArray),
    Utf8View(&'a StringViewArray),
    Binary(&'a BinaryArray),
    LargeBinary(&'a LargeBinaryArray),
    /// Microseconds since the Unix epoch.
    Timestamp(&'a PrimitiveArray<TimestampMicrosecondType>),
    /// Days since the Unix epoch.
    Date(&'a PrimitiveArray<Date32Type>),
    /// As Arrow displays them, for PostgreSQL to parse (`12:30:00.5`, `12.50`).
    Shown(ArrayFormatter<'a>),
    /// As Arrow displays them, written as `numeric`.
    Numeric(ArrayFormatter<'a>, String),
    Json(NullableEncoder<'a>),
}

impl<'a> Column<'a> {
    fn new(
        array: &'a ArrayRef,
        field: &'a FieldRef,
        wire: Wire,
        sql: SqlType,
        json: &'a EncoderOptions,
    ) -> Result<Column<'a>, String> {
        let shown = || {
            ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default())
                .map_err(|e| e.to_string())
        };
        let values = match wire {
            Wire::Bool => Values::Bool(array.as_boolean()),
            Wire::Int2 => Values::Int2(array.as_primitive()),
            Wire::Int4 => Values::Int4(array.as_primitive()),
            Wire::Int8 => Values::Int8(array.as_primitive()),
            Wire::Float4 => Values::Float4(array.as_primitive()),
            Wire::Float8 => Values::Float8(array.as_primitive()),
            Wire::Text if sql != SqlType::Text => Values::Shown(shown()?),
            Wire::Text => match array.data_type() {
                DataType::LargeUtf8 => Values::LargeUtf8(array.as_string::<i64>()),
                DataType::Utf8View => Values::Utf8View(array.as_string_view()),
                _ => Values::Utf8(array.as_string::<i32>()),
            },
            Wire::Bytea => match array.data_type() {
                DataType::Binary => Values::Binary(array.as_binary::<i32>()),
                _ => Values::LargeBinary(array.as_binary::<i64>()),
            },
            Wire::Timestamp => Values::Timestamp(array.as_primitive()),
            Wire::Date => Values::Date(array.as_primitive()),
            Wire::Numeric => Values::Numeric(shown()?, String::new()),
            Wire::Jsonb => Values::Json(json::encoder(field, array.as_ref(), json)?),
        };
        // A dictionary's null values and a run's nulls are NULLs too.
        let nulls = match wire {
            Wire::Jsonb => array.logical_nulls(),
            _ => array.nulls().cloned(),
        };
        Ok(Column { nulls, values })
    }

    fn write(&mut self, row: usize, out: &mut Vec<u8>) -> Result<(), String> {
        if self.nulls.as_ref().is_some_and(|n| n.is_null(row)) {
            out.extend_from_slice(&(-1i32).to_be_bytes());
            return Ok(());
        }
        let fixed = |out: &mut Vec<u8>, bytes: &[u8]| {
            out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
            out.extend_from_slice(bytes);
        };
        match &mut self.values {
            Values::Bool(v) => fixed(out, &[u8::from(v.value(row))]),
            Values::Int2(v) => fixed(out, &v.value(row).to_be_bytes()),
            Values::Int4(v) => fixed(out, &v.value(row).to_be_bytes()),
            Values::Int8(v) => fixed(out, &v.value(row).to_be_bytes()),
            Values::Float4(v) => fixed(out, &v.value(row).to_be_bytes()),
            Values::Float8(v) => fixed(out, &v.value(row).to_be_bytes()),
            Values::Utf8(v) => bytes(out, v.value(row).as_bytes())?,
            Values::LargeUtf8(v) => bytes(out, v.value(row).as_bytes())?,
            Values::Utf8View(v) => bytes(out, v.value(row).as_bytes())?,
            Values::Binary(v) => bytes(out, v.value(row))?,
            Values::LargeBinary(v) => bytes(out, v.value(row))?,
            Values::Timestamp(v) => {
                let us = v.value(row);
                let since = us
                    .checked_sub(PG_EPOCH_MICROS)
                    .ok_or_else(|| format!("timestamp {us} µs after 1970 is out of range"))?;
                fixed(out, &since.to_be_bytes());
            }
            Values::Date(v) => {
                let days = v.value(row);
                let since = days
                    .checked_sub(PG_EPOCH_DAYS)
                    .ok_or_else(|| format!("date {days} days after 1970 is out of range"))?;
                fixed(out, &since.to_be_bytes());
            }
            Values::Shown(f) => {
                let at = open(out);
                write!(out, "{}", f.value(row)).map_err(|e| e.to_string())?;
                close(out, at)?;
            }
            Values::Numeric(f, text) => {
                text.clear();
                std::fmt::Write::write_fmt(text, format_args!("{}", f.value(row)))
                    .map_err(|e| e.to_string())?;
                numeric(text, out)?;
            }
            Values::Json(encoder) => {
                let at = open(out);
                // jsonb's binary form: a version byte, then the JSON text.
                out.push(1);
                encoder.encode(row, out);
                close(out, at)?;
            }
        }
        Ok(())
    }
}

/// A variable-length value.
fn bytes(out: &mut Vec<u8>, value: &[u8]) -> Result<(), String> {
    let len = i32::try_from(value.len())
        .map_err(|_| format!("a value of {} bytes is over 2 GiB", value.len()))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// Room for a length, filled in by [`close`] once the value is written.
fn open(out: &mut Vec<u8>) -> usize {
    out.extend_from_slice(&[0; 4]);
    out.len()
}

fn close(out: &mut [u8], at: usize) -> Result<(), String> {
    let len = out.len().saturating_sub(at);
    let len = i32::try_from(len).map_err(|_| format!("a value of {len} bytes is over 2 GiB"))?;
    let slot = out
        .get_mut(at.saturating_sub(4)..at)
        .ok_or("a value's length has no room")?;
    slot.copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// `numeric`'s binary form of a decimal written `-123.4500`: base-10000 digits around the
/// decimal point, the weight of the first, the sign, and the scale.
fn numeric(text: &str, out: &mut Vec<u8>) -> Result<(), String> {
    let bad = || format!("`{text}` is not a decimal number");
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) {
        return Err(bad());
    }
    let scale = u16::try_from(frac.len())
        .ok()
        .filter(|s| *s <= 0x3fff)
        .ok_or_else(bad)?;
    let int = int.trim_start_matches('0');
    let group = |s: &str| s.bytes().fold(0i16, |n, b| n * 10 + i16::from(b - b'0'));
    let mut groups = Vec::with_capacity(int.len() / 4 + frac.len() / 4 + 2);
    // The integer part's groups end at the decimal point: the first may be short.
    let (head, rest) = int.split_at(int.len() % 4);
    if !head.is_empty() {
        groups.push(group(head));
    }
    for chunk in rest.as_bytes().chunks(4) {
        groups.push(group(std::str::from_utf8(chunk).map_err(|_| bad())?));
    }
    let mut weight = i16::try_from(groups.len()).map_err(|_| bad())? - 1;
    for chunk in frac.as_bytes().chunks(4) {
        let mut g = group(std::str::from_utf8(chunk).map_err(|_| bad())?);
        for _ in chunk.len()..4 {
            g *= 10;
        }
        groups.push(g);
    }
    let lead = groups.iter().take_while(|g| **g == 0).count();
    groups.drain(..lead);
    weight -= i16::try_from(lead).map_err(|_| bad())?;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    let sign: u16 = if negative && !groups.is_empty() {
        0x4000
    } else {
        0
    };
    if groups.is_empty() {
        weight = 0;
    }
    let count = i16::try_from(groups.len()).map_err(|_| bad())?;
    let at = open(out);
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&weight.to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&scale.to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
    close(out, at)
}

#[cfg(test)]
mod tests;
