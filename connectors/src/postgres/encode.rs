//! A column of a batch → the array parameter its values are sent in (`Vec<Option<T>>`, which
//! the `postgres` crate sends as a PostgreSQL array with NULLs).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use postgres::types::ToSql;

use super::types::SqlType;

/// One column's values, owned, as the parameter type of its [`SqlType`].
#[derive(Debug, PartialEq)]
pub enum Param {
    Bool(Vec<Option<bool>>),
    Int2(Vec<Option<i16>>),
    Int4(Vec<Option<i32>>),
    Int8(Vec<Option<i64>>),
    Float4(Vec<Option<f32>>),
    Float8(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
    Bytes(Vec<Option<Vec<u8>>>),
    Time(Vec<Option<SystemTime>>),
    Json(Vec<Option<serde_json::Value>>),
}

impl Param {
    pub fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Bool(v) => v,
            Param::Int2(v) => v,
            Param::Int4(v) => v,
            Param::Int8(v) => v,
            Param::Float4(v) => v,
            Param::Float8(v) => v,
            Param::Text(v) => v,
            Param::Bytes(v) => v,
            Param::Time(v) => v,
            Param::Json(v) => v,
        }
    }
}

/// `array`'s values as `sql`'s parameter; the error says what failed (a value JSON cannot
/// hold, a cast Arrow cannot make).
pub fn encode(array: &ArrayRef, sql: SqlType) -> Result<Param, String> {
    let cast =
        |to: &DataType| arrow_cast::cast(array, to).map_err(|e| format!("converting to {to}: {e}"));
    Ok(match sql {
        SqlType::Bool => Param::Bool(cast(&DataType::Boolean)?.as_boolean().iter().collect()),
        SqlType::Int2 => Param::Int2(
            cast(&DataType::Int16)?
                .as_primitive::<Int16Type>()
                .iter()
                .collect(),
        ),
        SqlType::Int4 => Param::Int4(
            cast(&DataType::Int32)?
                .as_primitive::<Int32Type>()
                .iter()
                .collect(),
        ),
        SqlType::Int8 => Param::Int8(
            cast(&DataType::Int64)?
                .as_primitive::<Int64Type>()
                .iter()
                .collect(),
        ),
        SqlType::Float4 => Param::Float4(
            cast(&DataType::Float32)?
                .as_primitive::<Float32Type>()
                .iter()
                .collect(),
        ),
        SqlType::Float8 => Param::Float8(
            cast(&DataType::Float64)?
                .as_primitive::<Float64Type>()
                .iter()
                .collect(),
        ),
        SqlType::Text => Param::Text(
            cast(&DataType::Utf8)?
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_string))
                .collect(),
        ),
        SqlType::Bytea => Param::Bytes(
            cast(&DataType::LargeBinary)?
                .as_binary::<i64>()
                .iter()
                .map(|v| v.map(<[u8]>::to_vec))
                .collect(),
        ),
        SqlType::Timestamptz => {
            let tz = match array.data_type() {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            Param::Time(
                cast(&DataType::Timestamp(TimeUnit::Microsecond, tz))?
                    .as_primitive::<TimestampMicrosecondType>()
                    .iter()
                    .map(|v| v.map(from_micros))
                    .collect(),
            )
        }
        SqlType::Date => {
            let days = match array.data_type() {
                DataType::Date64 => cast(&DataType::Date32)?,
                _ => array.clone(),
            };
            Param::Text(display(&days)?)
        }
        SqlType::Time | SqlType::Numeric => Param::Text(display(array)?),
        SqlType::Jsonb => Param::Json(json(array)?),
    })
}

/// Microseconds since the Unix epoch (before it when negative).
fn from_micros(us: i64) -> SystemTime {
    let magnitude = Duration::from_micros(us.unsigned_abs());
    let at = if us >= 0 {
        UNIX_EPOCH.checked_add(magnitude)
    } else {
        UNIX_EPOCH.checked_sub(magnitude)
    };
    at.unwrap_or(UNIX_EPOCH)
}

/// Each value as Arrow displays it (dates `2024-01-31`, decimals `12.50`), for casts in SQL.
fn display(array: &ArrayRef) -> Result<Vec<Option<String>>, String> {
    let options = FormatOptions::default();
    let formatter = ArrayFormatter::try_new(array.as_ref(), &options).map_err(|e| e.to_string())?;
    Ok((0..array.len())
        .map(|i| (!array.is_null(i)).then(|| formatter.value(i).to_string()))
        .collect())
}

/// Each value as JSON (lists, structs, maps), through Arrow's JSON writer.
fn json(array: &ArrayRef) -> Result<Vec<Option<serde_json::Value>>, String> {
    const NAME: &str = "v";
    let schema = Schema::new(vec![Field::new(NAME, array.data_type().clone(), true)]);
    let batch = RecordBatch::try_new(std::sync::Arc::new(schema), vec![array.clone()])
        .map_err(|e| e.to_string())?;
    let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
    writer
        .write(&batch)
        .and_then(|()| writer.finish())
        .map_err(|e| format!("as JSON: {e}"))?;
    let text = writer.into_inner();
    let mut values = Vec::with_capacity(array.len());
    for (i, line) in text.split(|b| *b == b'\n').take(array.len()).enumerate() {
        if array.is_null(i) {
            values.push(None);
            continue;
        }
        let mut row: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(line).map_err(|e| format!("as JSON: {e}"))?;
        values.push(row.remove(NAME));
    }
    if values.len() != array.len() {
        return Err(format!(
            "as JSON: {} of {} rows written",
            values.len(),
            array.len()
        ));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    use arrow_array::{
        BooleanArray, Date32Array, Decimal128Array, Int8Array, StringArray,
        TimestampNanosecondArray, UInt64Array,
    };

    #[test]
    fn scalars_keep_their_values_and_nulls() {
        let ints: ArrayRef = Arc::new(Int8Array::from(vec![Some(-3), None, Some(7)]));
        assert_eq!(
            encode(&ints, SqlType::Int2).unwrap(),
            Param::Int2(vec![Some(-3), None, Some(7)])
        );
        let flags: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true), None]));
        assert_eq!(
            encode(&flags, SqlType::Bool).unwrap(),
            Param::Bool(vec![Some(true), None])
        );
        let text: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None]));
        assert_eq!(
            encode(&text, SqlType::Text).unwrap(),
            Param::Text(vec![Some("a".into()), None])
        );
        let big: ArrayRef = Arc::new(UInt64Array::from(vec![u64::MAX]));
        assert_eq!(
            encode(&big, SqlType::Numeric).unwrap(),
            Param::Text(vec![Some(u64::MAX.to_string())]),
            "unsigned 64-bit values are sent whole"
        );
        let money: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(1250), None])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        );
        assert_eq!(
            encode(&money, SqlType::Numeric).unwrap(),
            Param::Text(vec![Some("12.50".into()), None])
        );
        let days: ArrayRef = Arc::new(Date32Array::from(vec![19_753]));
        assert_eq!(
            encode(&days, SqlType::Date).unwrap(),
            Param::Text(vec![Some("2024-01-31".into())])
        );
    }

    #[test]
    fn timestamps_become_instants_before_and_after_1970() {
        let ns: ArrayRef = Arc::new(
            TimestampNanosecondArray::from(vec![
                Some(1_500_000_000_123_456_789),
                Some(-1_000),
                None,
            ])
            .with_timezone("UTC"),
        );
        let Param::Time(times) = encode(&ns, SqlType::Timestamptz).unwrap() else {
            panic!("timestamps are sent as instants");
        };
        assert_eq!(
            times[0].unwrap().duration_since(UNIX_EPOCH).unwrap(),
            Duration::from_micros(1_500_000_000_123_456)
        );
        assert_eq!(
            UNIX_EPOCH.duration_since(times[1].unwrap()).unwrap(),
            Duration::from_micros(1)
        );
        assert_eq!(times[2], None);
    }

    #[test]
    fn lists_become_json_arrays() {
        let mut b = FixedSizeListBuilder::new(Float32Builder::new(), 2);
        b.values().append_slice(&[0.5, 1.5]);
        b.append(true);
        b.values().append_slice(&[0.0, 0.0]);
        b.append(false);
        let list: ArrayRef = Arc::new(b.finish());
        assert_eq!(
            encode(&list, SqlType::Jsonb).unwrap(),
            Param::Json(vec![Some(serde_json::json!([0.5, 1.5])), None])
        );
    }
}
