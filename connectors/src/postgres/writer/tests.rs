//! The writer against the server of `scripts/postgres.sh` (`RIFFLE_PG_URL`): COPY straight
//! into the table, its fallback to the staging table when a key is present, and the casts
//! only the staging table makes.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Int16Array,
    Int64Array, StringArray, Time64NanosecondArray, TimestampNanosecondArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use serde_json::json;

use super::*;

const HOW: &str = "start a server with `scripts/postgres.sh start` and set RIFFLE_PG_URL with \
                   `eval \"$(scripts/postgres.sh env)\"` (scripts/test.sh does both)";

#[test]
fn copy_into_a_keyed_table_is_tried_less_often_while_keys_repeat() {
    let mut a = Attempts::default();
    assert!(a.ready(), "tried first");
    a.miss();
    assert!(!a.ready(), "skipped once after a miss");
    assert!(a.ready());
    a.miss();
    let skipped = (0..10).take_while(|_| !a.ready()).count();
    assert_eq!(skipped, 3, "then 3 times");
    for _ in 0..10 {
        a.miss();
    }
    let skipped = (0..100).take_while(|_| !a.ready()).count();
    assert_eq!(skipped, 63, "at most 63 times");
    a.hit();
    a.miss();
    assert!(!a.ready() && a.ready(), "a success starts over");
}

/// `RIFFLE_PG_URL`; fails (never skips) without it.
fn url() -> String {
    std::env::var("RIFFLE_PG_URL").unwrap_or_else(|_| panic!("RIFFLE_PG_URL is not set: {HOW}"))
}

/// A table name no other test uses.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("riffle_w_{name}_{}_{nanos}", std::process::id())
}

fn config(table: &str, extra: serde_json::Value) -> PostgresSinkConfig {
    let mut c = json!({"url": url(), "table": table});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    serde_json::from_value(c).unwrap()
}

/// A client of its own, to set tables up and read them back.
fn client(config: &PostgresSinkConfig) -> Client {
    connect(config).unwrap_or_else(|e| panic!("no PostgreSQL server at RIFFLE_PG_URL ({e}): {HOW}"))
}

/// Every row as text (NULL as `-`), ordered by the first column.
fn rows_of(client: &mut Client, table: &str) -> Vec<Vec<String>> {
    let rows = client
        .simple_query(&format!("SELECT * FROM \"{table}\" ORDER BY 1"))
        .unwrap();
    rows.iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("-").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let arrays = columns.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn id_value(ids: &[i64], values: &[&str]) -> RecordBatch {
    batch(vec![
        ("id", Arc::new(Int64Array::from(ids.to_vec()))),
        ("v", Arc::new(StringArray::from(values.to_vec()))),
    ])
}

/// One transaction writing `batches`.
fn write(writer: &mut Writer, batches: &[RecordBatch]) -> DataflowResult<()> {
    let mut rows: Rows = Vec::new();
    for b in batches {
        rows.push((writer.plan(&b.schema())?, b.clone()));
    }
    writer.transaction(|tx| tx.write(&rows).map(|_| ()))
}

fn drop_table(client: &mut Client, table: &str) {
    client
        .batch_execute(&format!("DROP TABLE IF EXISTS \"{table}\" CASCADE"))
        .unwrap();
}

#[test]
fn a_keyed_insert_keeps_the_first_row_of_each_key_copied_or_staged() {
    let t = unique("first");
    let c = config(&t, json!({"key": "id"}));
    let mut check = client(&c);
    let mut w = Writer::open(&c, Some(&id_value(&[], &[]).schema())).unwrap();
    write(&mut w, &[id_value(&[1, 2], &["a", "a"])]).unwrap();
    // 2 is present and 4 comes twice: COPY fails, the staging table skips them.
    write(
        &mut w,
        &[
            id_value(&[2, 4], &["b", "b"]),
            id_value(&[4, 3], &["c", "c"]),
        ],
    )
    .unwrap();
    assert_eq!(
        w.attempts[0].skip, 1,
        "the failed COPY is skipped next time"
    );
    // Staged (COPY is skipped once): what the last transaction staged is gone.
    write(&mut w, &[id_value(&[5], &["d"])]).unwrap();
    // COPY again, succeeding.
    write(&mut w, &[id_value(&[6], &["e"])]).unwrap();
    assert_eq!((w.attempts[0].misses, w.attempts[0].skip), (0, 0));
    let expected: Vec<Vec<String>> = [(1, "a"), (2, "a"), (3, "c"), (4, "b"), (5, "d"), (6, "e")]
        .iter()
        .map(|(i, v)| vec![i.to_string(), v.to_string()])
        .collect();
    assert_eq!(rows_of(&mut check, &t), expected);
    drop_table(&mut check, &t);
}

#[test]
fn a_key_present_fails_a_long_copy_whose_rows_are_then_staged() {
    let t = unique("long");
    let c = config(&t, json!({"key": "id", "batch_rows": 100}));
    let mut check = client(&c);
    let mut w = Writer::open(&c, Some(&id_value(&[], &[]).schema())).unwrap();
    write(&mut w, &[id_value(&[1], &["first"])]).unwrap();
    let ids: Vec<i64> = (1..=20_000).collect();
    let values = vec!["later"; ids.len()];
    // Many COPY messages after the one whose first row fails.
    write(&mut w, &[id_value(&ids, &values)]).unwrap();
    assert_eq!(w.attempts[0].misses, 1, "COPY failed");
    let counts = check
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE v = 'first' AND id = 1) FROM \"{t}\""
            ),
            &[],
        )
        .unwrap();
    assert_eq!(
        (counts.get::<_, i64>(0), counts.get::<_, i64>(1)),
        (20_000, 1)
    );
    drop_table(&mut check, &t);
}

#[test]
fn an_upsert_keeps_the_last_row_of_each_key() {
    let t = unique("last");
    let c = config(&t, json!({"key": "id", "mode": "upsert"}));
    let mut check = client(&c);
    let mut w = Writer::open(&c, Some(&id_value(&[], &[]).schema())).unwrap();
    write(&mut w, &[id_value(&[1, 2], &["a", "a"])]).unwrap();
    write(
        &mut w,
        &[
            id_value(&[2, 3], &["b", "b"]),
            id_value(&[3, 2, 3], &["c", "c", "d"]),
        ],
    )
    .unwrap();
    assert_eq!(
        rows_of(&mut check, &t),
        [["1", "a"], ["2", "c"], ["3", "d"]].map(|r| r.map(String::from).to_vec())
    );
    drop_table(&mut check, &t);
}

#[test]
fn a_staging_table_used_twice_in_a_transaction_is_emptied_between() {
    let t = unique("twice");
    let c = config(&t, json!({}));
    let mut check = client(&c);
    check
        .batch_execute(&format!("CREATE TABLE \"{t}\" (id bigint, v jsonb)"))
        .unwrap();
    // Text into jsonb is cast: staged. Batches without `v` are another plan between.
    let only_ids = batch(vec![(
        "id",
        Arc::new(Int64Array::from(vec![2])) as ArrayRef,
    )]);
    let mut w = Writer::open(&c, None).unwrap();
    write(
        &mut w,
        &[
            id_value(&[1], &["[1]"]),
            only_ids,
            id_value(&[3], &["{\"a\": 1}"]),
        ],
    )
    .unwrap();
    assert_eq!(
        rows_of(&mut check, &t),
        [["1", "[1]"], ["2", "-"], ["3", "{\"a\": 1}"]].map(|r| r.map(String::from).to_vec()),
        "each row once"
    );
    drop_table(&mut check, &t);
}

#[test]
fn every_type_lands_copied_straight_into_its_own_type() {
    let t = unique("own");
    let c = config(&t, json!({}));
    let mut check = client(&c);
    check
        .batch_execute(&format!(
            "CREATE TABLE \"{t}\" (i int2, wide int8, f float8, b bool, s varchar(5), \
             bin bytea, ts timestamp, d date, big numeric(20,0), money numeric(10,2), \
             tags jsonb)"
        ))
        .unwrap();
    let tags =
        arrow_array::ListArray::from_iter_primitive::<arrow_array::types::Float32Type, _, _>(vec![
            Some(vec![Some(0.5), None]),
            None,
        ]);
    let rows = batch(vec![
        ("i", Arc::new(Int16Array::from(vec![Some(-7), None]))),
        ("wide", Arc::new(Int16Array::from(vec![Some(300), Some(1)]))),
        (
            "f",
            Arc::new(Float32Array::from(vec![Some(0.25), Some(-1.5)])),
        ),
        (
            "b",
            Arc::new(BooleanArray::from(vec![Some(true), Some(false)])),
        ),
        (
            "s",
            Arc::new(StringArray::from(vec![Some("héllo"), Some("")])),
        ),
        (
            "bin",
            Arc::new(BinaryArray::from(vec![Some(&b"\x00\xff"[..]), None])),
        ),
        (
            "ts",
            Arc::new(TimestampNanosecondArray::from(vec![
                Some(1_500_000_000_123_456_789),
                Some(-1_000),
            ])),
        ),
        (
            "d",
            Arc::new(Date32Array::from(vec![Some(19_753), Some(-1)])),
        ),
        (
            "big",
            Arc::new(UInt64Array::from(vec![Some(u64::MAX), Some(0)])),
        ),
        (
            "money",
            Arc::new(
                Decimal128Array::from(vec![Some(-1_250), Some(5)])
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
            ),
        ),
        ("tags", Arc::new(tags)),
    ]);
    let mut w = Writer::open(&c, None).unwrap();
    let plan = w.plan(&rows.schema()).unwrap();
    assert!(plan.copy.is_some() && plan.staged.is_none(), "{plan:?}");
    write(&mut w, &[rows]).unwrap();
    let got = rows_of(&mut check, &t);
    let expected = [
        vec![
            "-7",
            "300",
            "0.25",
            "t",
            "héllo",
            "\\x00ff",
            "2017-07-14 02:40:00.123456",
            "2024-01-31",
            "18446744073709551615",
            "-12.50",
            "[0.5, null]",
        ],
        vec![
            "-",
            "1",
            "-1.5",
            "f",
            "",
            "-",
            "1969-12-31 23:59:59.999999",
            "1969-12-31",
            "0",
            "0.05",
            "-",
        ],
    ];
    let mut got_sorted = got.clone();
    got_sorted.sort_by_key(|r| r[1].parse::<i64>().ok());
    let mut want: Vec<Vec<String>> = expected
        .iter()
        .map(|r| r.iter().map(|v| v.to_string()).collect())
        .collect();
    want.sort_by_key(|r| r[1].parse::<i64>().ok());
    assert_eq!(got_sorted, want);
    drop_table(&mut check, &t);
}

#[test]
fn values_postgresql_casts_are_staged_and_its_errors_named() {
    let t = unique("cast");
    let c = config(&t, json!({}));
    let mut check = client(&c);
    check
        .batch_execute(&format!(
            "CREATE TABLE \"{t}\" (id int2, n int8, at timestamptz, t time, u uuid, j json)"
        ))
        .unwrap();
    let rows = |id: i64| {
        batch(vec![
            ("id", Arc::new(Int64Array::from(vec![id])) as ArrayRef),
            (
                "n",
                Arc::new(
                    Decimal128Array::from(vec![12])
                        .with_precision_and_scale(10, 0)
                        .unwrap(),
                ),
            ),
            ("at", Arc::new(Date32Array::from(vec![19_753]))),
            (
                "t",
                Arc::new(Time64NanosecondArray::from(vec![45_000_123_456_789])),
            ),
            (
                "u",
                Arc::new(StringArray::from(vec![
                    "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
                ])),
            ),
            (
                "j",
                Arc::new(arrow_array::StructArray::from(vec![(
                    Arc::new(Field::new("b", DataType::Int64, true)),
                    Arc::new(Int64Array::from(vec![1])) as ArrayRef,
                )])),
            ),
        ])
    };
    let mut w = Writer::open(&c, None).unwrap();
    let plan = w.plan(&rows(1).schema()).unwrap();
    assert!(plan.copy.is_none() && plan.staged.is_some(), "{plan:?}");
    write(&mut w, &[rows(1)]).unwrap();
    assert_eq!(
        rows_of(&mut check, &t),
        [[
            "1",
            "12",
            "2024-01-31 00:00:00+00",
            "12:30:00.123457",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "{\"b\": 1}",
        ]]
        .map(|r| r.map(String::from).to_vec()),
        "a decimal parsed into bigint, a date into timestamptz, a time rounded, jsonb's text"
    );
    let e = write(&mut w, &[rows(70_000)]).unwrap_err().to_string();
    assert!(
        e.contains("writing 1 row(s)") && e.contains("smallint out of range"),
        "{e}"
    );
    drop_table(&mut check, &t);
}

#[test]
fn views_take_rows_through_the_staging_table() {
    let t = unique("base");
    let v = format!("{t}_view");
    let c = config(&v, json!({}));
    let mut check = client(&c);
    check
        .batch_execute(&format!(
            "CREATE TABLE \"{t}\" (id bigint, v text); \
             CREATE VIEW \"{v}\" AS SELECT id, v FROM \"{t}\""
        ))
        .unwrap();
    let mut w = Writer::open(&c, None).unwrap();
    write(&mut w, &[id_value(&[1, 2], &["a", "b"])]).unwrap();
    assert_eq!(
        rows_of(&mut check, &t),
        [["1", "a"], ["2", "b"]].map(|r| r.map(String::from).to_vec())
    );
    drop_table(&mut check, &t);
}
