use std::sync::Arc;

use super::*;
use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, ListBuilder};
use arrow_array::{
    Date32Array, Decimal128Array, Float64Array, Int64Array, Int8Array, StructArray,
    TimestampNanosecondArray, UInt64Array,
};
use arrow_schema::Schema;

/// The fields of each row of a COPY stream written by [`Rows`] (without header or trailer).
fn fields(mut data: &[u8]) -> Vec<Vec<Option<Vec<u8>>>> {
    let mut rows = Vec::new();
    while !data.is_empty() {
        let count = i16::from_be_bytes([data[0], data[1]]);
        data = &data[2..];
        let mut row = Vec::new();
        for _ in 0..count {
            let len = i32::from_be_bytes(data[..4].try_into().unwrap());
            data = &data[4..];
            if len < 0 {
                row.push(None);
            } else {
                row.push(Some(data[..len as usize].to_vec()));
                data = &data[len as usize..];
            }
        }
        rows.push(row);
    }
    rows
}

/// The COPY fields of one column written as `wire`.
fn column(array: ArrayRef, wire: Wire, sql: SqlType) -> Vec<Option<Vec<u8>>> {
    let schema = Schema::new(vec![Field::new("c", array.data_type().clone(), true)]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![array]).unwrap();
    let columns = Columns::new(&batch, &[wire], &[sql]).unwrap();
    let mut rows = columns.rows().unwrap();
    let mut out = Vec::new();
    for row in 0..batch.num_rows() {
        rows.write(row, &mut out).unwrap();
    }
    fields(&out).into_iter().map(|mut r| r.remove(0)).collect()
}

#[test]
fn scalars_keep_their_values_and_nulls() {
    let ints: ArrayRef = Arc::new(Int8Array::from(vec![Some(-3), None, Some(7)]));
    assert_eq!(
        column(ints.clone(), Wire::Int2, SqlType::Int2),
        [
            Some((-3i16).to_be_bytes().to_vec()),
            None,
            Some(7i16.to_be_bytes().to_vec())
        ]
    );
    assert_eq!(
        column(ints, Wire::Int8, SqlType::Int2)[2],
        Some(7i64.to_be_bytes().to_vec()),
        "widened into a bigint column"
    );
    let flags: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true), None]));
    assert_eq!(
        column(flags, Wire::Bool, SqlType::Bool),
        [Some(vec![1]), None]
    );
    let text: ArrayRef = Arc::new(StringArray::from(vec![Some("aé"), None]));
    assert_eq!(
        column(text, Wire::Text, SqlType::Text),
        [Some("aé".as_bytes().to_vec()), None]
    );
    let floats: ArrayRef = Arc::new(Float64Array::from(vec![0.5]));
    assert_eq!(
        column(floats, Wire::Float8, SqlType::Float8),
        [Some(0.5f64.to_be_bytes().to_vec())]
    );
    let days: ArrayRef = Arc::new(Date32Array::from(vec![19_753, 0]));
    assert_eq!(
        column(days.clone(), Wire::Date, SqlType::Date),
        [
            Some(8_796i32.to_be_bytes().to_vec()),
            Some((-10_957i32).to_be_bytes().to_vec())
        ],
        "days since 2000-01-01"
    );
}

#[test]
fn values_postgresql_parses_are_shown_as_before() {
    let money: ArrayRef = Arc::new(
        Decimal128Array::from(vec![Some(1250), None])
            .with_precision_and_scale(10, 2)
            .unwrap(),
    );
    assert_eq!(
        column(money, Wire::Text, SqlType::Numeric),
        [Some(b"12.50".to_vec()), None],
        "a decimal into a bigint column is text for PostgreSQL to parse"
    );
}

/// `numeric`'s binary form: digit count, weight, sign, scale, base-10000 digits.
fn numeric_of(text: &str) -> (i16, i16, u16, u16, Vec<i16>) {
    let mut out = Vec::new();
    numeric(text, &mut out).unwrap();
    let v = |i: usize| [out[4 + i], out[5 + i]];
    let count = i16::from_be_bytes(v(0));
    let digits = (0..count as usize)
        .map(|d| i16::from_be_bytes(v(8 + 2 * d)))
        .collect();
    let len = i32::from_be_bytes(out[..4].try_into().unwrap());
    assert_eq!(
        len as usize,
        out.len() - 4,
        "{text}: the length covers the value"
    );
    (
        count,
        i16::from_be_bytes(v(2)),
        u16::from_be_bytes(v(4)),
        u16::from_be_bytes(v(6)),
        digits,
    )
}

#[test]
fn decimals_become_base_10000_numerics() {
    assert_eq!(numeric_of("12.50"), (2, 0, 0, 2, vec![12, 5000]));
    assert_eq!(numeric_of("-0.0012"), (1, -1, 0x4000, 4, vec![12]));
    assert_eq!(
        numeric_of("18446744073709551615"),
        (5, 4, 0, 0, vec![1844, 6744, 737, 955, 1615])
    );
    assert_eq!(numeric_of("100000000"), (1, 2, 0, 0, vec![1]));
    assert_eq!(numeric_of("0.00000001"), (1, -2, 0, 8, vec![1]));
    assert_eq!(numeric_of("0.000001"), (1, -2, 0, 6, vec![100]));
    assert_eq!(
        numeric_of("-0.00"),
        (0, 0, 0, 2, vec![]),
        "zero has no sign"
    );
    assert_eq!(numeric_of("12345.6789"), (3, 1, 0, 4, vec![1, 2345, 6789]));
    for bad in ["", "-", "1e5", "1.2.3", "NaN"] {
        assert!(numeric(bad, &mut Vec::new()).is_err(), "{bad:?}");
    }
    let big: ArrayRef = Arc::new(UInt64Array::from(vec![u64::MAX]));
    let field = column(big, Wire::Numeric, SqlType::Numeric)
        .remove(0)
        .unwrap();
    let mut expected = Vec::new();
    numeric("18446744073709551615", &mut expected).unwrap();
    assert_eq!(
        field,
        expected[4..],
        "unsigned 64-bit values are sent whole"
    );
}

#[test]
fn timestamps_are_microseconds_since_2000_before_and_after_1970() {
    let ns: ArrayRef = Arc::new(
        TimestampNanosecondArray::from(vec![Some(1_500_000_000_123_456_789), Some(-1_000), None])
            .with_timezone("UTC"),
    );
    let micros = |f: &Option<Vec<u8>>| i64::from_be_bytes(f.clone().unwrap().try_into().unwrap());
    let values = column(ns, Wire::Timestamp, SqlType::Timestamptz);
    assert_eq!(micros(&values[0]), 1_500_000_000_123_456 - PG_EPOCH_MICROS);
    assert_eq!(micros(&values[1]), -1 - PG_EPOCH_MICROS);
    assert_eq!(values[2], None);
}

/// What the sink sent before it wrote COPY: each value through Arrow's JSON writer, parsed
/// into a `serde_json::Value` and written again by serde_json.
fn through_serde(array: &ArrayRef) -> Vec<Option<Vec<u8>>> {
    let schema = Schema::new(vec![Field::new("v", array.data_type().clone(), true)]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![array.clone()]).unwrap();
    let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
    writer.write(&batch).unwrap();
    writer.finish().unwrap();
    let text = writer.into_inner();
    text.split(|b| *b == b'\n')
        .take(array.len())
        .map(|line| {
            let mut row: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(line).unwrap();
            row.remove("v").map(|v| {
                let mut jsonb = vec![1];
                serde_json::to_writer(&mut jsonb, &v).unwrap();
                jsonb
            })
        })
        .collect()
}

#[test]
fn lists_become_jsonb_arrays() {
    let mut b = FixedSizeListBuilder::new(Float32Builder::new(), 2);
    b.values().append_slice(&[0.5, 1.5]);
    b.append(true);
    b.values().append_slice(&[0.0, 0.0]);
    b.append(false);
    let list: ArrayRef = Arc::new(b.finish());
    assert_eq!(
        column(list, Wire::Jsonb, SqlType::Jsonb),
        [Some(b"\x01[0.5,1.5]".to_vec()), None]
    );
    let mut b = ListBuilder::new(arrow_array::builder::Int64Builder::new());
    b.values().append_slice(&[1, -2, i64::MAX]);
    b.append(true);
    b.append(true);
    let list: ArrayRef = Arc::new(b.finish());
    assert_eq!(
        column(list.clone(), Wire::Jsonb, SqlType::Jsonb),
        [
            Some(format!("\x01[1,-2,{}]", i64::MAX).into_bytes()),
            Some(b"\x01[]".to_vec())
        ]
    );
    assert_eq!(
        column(list.clone(), Wire::Jsonb, SqlType::Jsonb),
        through_serde(&list)
    );
}

fn float_list(values: ArrayRef) -> ArrayRef {
    let field = Arc::new(Field::new("item", values.data_type().clone(), true));
    let offsets = arrow_buffer::OffsetBuffer::from_lengths(vec![1; values.len()]);
    Arc::new(arrow_array::ListArray::new(field, offsets, values, None))
}

/// Each value of `values` in a list: ours and the serde_json round trip's JSON text.
fn both_ways(values: ArrayRef) -> Vec<(String, String)> {
    let list = float_list(values);
    let text = |v: &Option<Vec<u8>>| String::from_utf8_lossy(v.as_ref().unwrap()).to_string();
    column(list.clone(), Wire::Jsonb, SqlType::Jsonb)
        .iter()
        .zip(&through_serde(&list))
        .map(|(a, b)| (text(a), text(b)))
        .collect()
}

fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// Floats and decimals in lists come out as the serde_json round trip wrote them.
#[test]
fn float_lists_are_written_as_serde_json_wrote_them() {
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    let mut singles: Vec<f32> = vec![
        0.1,
        1.0,
        -3.0,
        0.0,
        -0.0,
        1e-7,
        1.5e-7,
        1e7,
        16_777_215.0,
        16_777_216.0,
        1e10,
        1.234_567_9e11,
        3.4e38,
        f32::MIN_POSITIVE,
        f32::NAN,
        f32::INFINITY,
        123_456.79,
        0.3,
    ];
    let mut doubles: Vec<f64> = vec![
        0.1,
        1.0,
        -0.0,
        1e-7,
        1e16,
        1e15,
        123_456_789_012.5,
        f64::MAX,
        0.3,
        f64::NAN,
    ];
    // Scores, probabilities, embeddings.
    for _ in 0..20_000 {
        let bits = next();
        singles.push((bits % 2_000_000) as f32 / 1000.0 - 1000.0);
        singles.push(f32::from_bits(bits as u32 & 0x3fff_ffff | 0x3c00_0000) - 1.0);
        doubles.push((bits % 2_000_000_000) as f64 / 1e6);
        doubles.push(f64::from_bits(bits >> 12 | 0x3ff0_0000_0000_0000) - 1.0);
    }
    let singles: ArrayRef = Arc::new(arrow_array::Float32Array::from(singles));
    let halves = arrow_cast::cast(&singles, &DataType::Float16).unwrap();
    let decimals: ArrayRef = Arc::new(
        Decimal128Array::from(
            (0..1000)
                .map(|i| i128::from(i) * 7_919 - 3_000_000)
                .collect::<Vec<_>>(),
        )
        .with_precision_and_scale(20, 4)
        .unwrap(),
    );
    for values in [
        singles,
        Arc::new(Float64Array::from(doubles)),
        halves,
        decimals,
    ] {
        let kind = values.data_type().clone();
        for (i, (ours, theirs)) in both_ways(values).iter().enumerate() {
            assert_eq!(ours, theirs, "{kind} value {i}");
        }
    }
}

/// Floats of any bits too, where serde_json's reading missed the nearest double.
#[test]
fn floats_of_any_bits_are_written_as_serde_json_wrote_them() {
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let singles: Vec<f32> = (0..20_000).map(|_| f32::from_bits(next() as u32)).collect();
    let doubles: Vec<f64> = (0..20_000).map(|_| f64::from_bits(next())).collect();
    for values in [
        Arc::new(arrow_array::Float32Array::from(singles)) as ArrayRef,
        Arc::new(Float64Array::from(doubles)),
    ] {
        let kind = values.data_type().clone();
        for (i, (ours, theirs)) in both_ways(values).iter().enumerate() {
            assert_eq!(ours, theirs, "{kind} value {i}");
        }
    }
}

#[test]
fn structs_keep_their_fields_and_values() {
    let ids: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
    let names: ArrayRef = Arc::new(StringArray::from(vec![Some("a\"b"), Some("c")]));
    let s: ArrayRef = Arc::new(StructArray::from(vec![
        (Arc::new(Field::new("id", DataType::Int64, true)), ids),
        (Arc::new(Field::new("name", DataType::Utf8, true)), names),
    ]));
    let ours = column(s.clone(), Wire::Jsonb, SqlType::Jsonb);
    assert_eq!(
        ours[0],
        Some(b"\x01{\"id\":1,\"name\":\"a\\\"b\"}".to_vec())
    );
    let parsed = |v: &Option<Vec<u8>>| -> serde_json::Value {
        serde_json::from_slice(&v.as_ref().unwrap()[1..]).unwrap()
    };
    for (a, b) in ours.iter().zip(&through_serde(&s)) {
        assert_eq!(parsed(a), parsed(b));
    }
}
