use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::*;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Utf8, true),
    ]))
}

fn messages(format: TextFormat) -> Decoder {
    Decoder::new(format, Framing::Message, schema())
}

const CSV: TextFormat = TextFormat::Csv { delimiter: b',' };

#[test]
fn json_needs_exactly_one_object_per_message() {
    let d = messages(TextFormat::Json);
    let batch = d
        .decode(&[b"{\"a\":1,\"b\":\"x\"}\n", b" {\"a\":2} "])
        .unwrap();
    assert_eq!(batch.num_rows(), 2);
    assert!(d.decode(&[b"{\"a\":1}{\"a\":2}"]).is_err());
    assert!(d.decode(&[b"{\"a\":1", b"}"]).is_err());
    assert!(d.decode(&[b""]).is_err());
    assert!(d.decode(&[b"5"]).is_err());
    assert!(d.decode(&[b"{\"a\":\"nope\"}"]).is_err());
}

#[test]
fn csv_needs_exactly_one_record_per_message() {
    let d = messages(CSV);
    let batch = d.decode(&[b"1,x", b"2,\"y\nz\"\r\n"]).unwrap();
    assert_eq!(batch.num_rows(), 2);
    assert!(d.decode(&[b"1,x\n2,y"]).is_err());
    assert!(d.decode(&[b"1,\"x", b"2,y"]).is_err());
    assert!(d.decode(&[b"1"]).is_err());
    assert!(d.decode(&[b"q,x"]).is_err());
    assert!(d.decode(&[b"\n"]).is_err());
}

#[test]
fn a_few_drifting_values_do_not_turn_a_csv_column_into_text() {
    let mut text = String::from("id,score,flag,name\n");
    for i in 0..19 {
        text.push_str(&format!("{i},{i}.5,true,n{i}\n"));
    }
    text.push_str("19,n/a,maybe,n19\n");
    let schema = csv::infer_schema(std::io::Cursor::new(text), true, b',', 500).unwrap();
    let types: Vec<&DataType> = schema.fields().iter().map(|f| f.data_type()).collect();
    assert_eq!(
        types,
        [
            &DataType::Int64,
            &DataType::Float64,
            &DataType::Boolean,
            &DataType::Utf8
        ]
    );
    // Half and half stays text.
    let even = "a\n1\nx\n2\ny\n";
    let schema = csv::infer_schema(std::io::Cursor::new(even), true, b',', 500).unwrap();
    assert_eq!(schema.field(0).data_type(), &DataType::Utf8);
}

#[test]
fn csv_inference_names_columns_by_position() {
    let payloads: [&[u8]; 2] = [b"1,x\n", b"2,y"];
    let schema = csv::infer_schema_from_payloads(payloads, 500).unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["column_1", "column_2"]);
    assert_eq!(schema.field(0).data_type(), &DataType::Int64);
}

#[test]
fn json_inference_keeps_the_agreeing_records() {
    // An object where a number was seen conflicts (numbers and strings merge into strings).
    let payloads: [&[u8]; 4] = [
        b"{\"a\":1}",
        b"not json",
        b"{\"a\":{\"x\":1}}",
        b"{\"b\":true}",
    ];
    let schema = json::infer_schema(payloads).unwrap();
    assert_eq!(
        schema.field_with_name("a").unwrap().data_type(),
        &DataType::Int64
    );
    assert_eq!(
        schema.field_with_name("b").unwrap().data_type(),
        &DataType::Boolean
    );
}

#[test]
fn bad_records_become_dead_letters_and_the_rest_are_kept() {
    let d = messages(TextFormat::Json);
    let decoded = d
        .decode_or_reject(&[b"{\"a\":1}", b"{\"a\":", b"{\"a\":3}"], |i, e| {
            DeadLetter {
                stage: "source".into(),
                reason: e.to_string(),
                record: i.to_string(),
            }
        })
        .unwrap();
    assert_eq!(decoded.batch.num_rows(), 2);
    assert_eq!(decoded.kept, [0, 2]);
    assert_eq!(decoded.rejected.len(), 1);
    assert_eq!(decoded.rejected[0].record, "1");
    assert!(!decoded.rejected[0].reason.is_empty());
}

#[test]
fn json_lines_may_hold_several_objects() {
    let d = Decoder::new(TextFormat::Json, Framing::FileRecord, schema());
    let batch = d
        .decode(&[b"{\"a\":1} {\"a\":2}\n", b"{\"a\":3}\n"])
        .unwrap();
    assert_eq!(batch.num_rows(), 3);
    assert!(d.decode(&[b"{\"a\":\n"]).is_err());
}

#[test]
fn declared_columns_and_header_text() {
    use std::collections::BTreeMap;
    let declared = BTreeMap::from([(
        "n".to_string(),
        DeclaredColumn {
            data: ColumnType::Int64,
            nullable: false,
        },
    )]);
    let schema = declared_schema(&declared).unwrap();
    assert_eq!(schema.field(0).data_type(), &DataType::Int64);
    assert!(declared_schema(&BTreeMap::new()).is_none());
    let column = ColumnType::Bool.parse_column([Some(" TRUE "), Some("x"), None].into_iter());
    assert_eq!(column.null_count(), 2);
}

fn reason_of(d: &Decoder, payload: &[u8]) -> String {
    let decoded = d
        .decode_or_reject(&[payload], |_, e| DeadLetter {
            stage: "source".into(),
            reason: d.reason(e, None),
            record: String::new(),
        })
        .unwrap();
    assert_eq!(decoded.batch.num_rows(), 0, "{payload:?} decoded");
    decoded.rejected[0].reason.clone()
}

#[test]
fn records_must_be_objects_with_their_required_columns() {
    for framing in [Framing::Message, Framing::FileRecord] {
        let d = Decoder::new(TextFormat::Json, framing, schema()).with_required(&["a".into()]);
        assert_eq!(d.required(), ["a"]);
        assert!(reason_of(&d, b"42").ends_with("expected a JSON object, got a number"));
        assert!(reason_of(&d, b"[1]").ends_with("expected a JSON object, got an array"));
        assert!(reason_of(&d, b"{\"foo\":1}").ends_with("missing required column `a`"));
        assert!(reason_of(&d, b"{\"a\":null}").ends_with("missing required column `a`"));
        // `b` may be missing.
        assert_eq!(d.decode(&[b"{\"a\":1}"]).unwrap().num_rows(), 1);
    }
    let d = messages(CSV).with_required(&["b".into()]);
    assert!(reason_of(&d, b"1,").ends_with("missing required column `b`"));
    assert_eq!(d.decode(&[b",x"]).unwrap().num_rows(), 1);
}

#[test]
fn nesting_deeper_than_64_levels_is_refused_without_recursion() {
    let d = messages(TextFormat::Json);
    let deep = format!(
        "{{\"b\":\"{}\",\"c\":{}{}}}",
        "[".repeat(10),
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(reason_of(&d, deep.as_bytes()).ends_with("JSON nested deeper than 64 levels"));
    // Brackets inside strings do not count.
    let shallow = format!("{{\"b\":\"{}\"}}", "[".repeat(100));
    assert_eq!(d.decode(&[shallow.as_bytes()]).unwrap().num_rows(), 1);
    let payloads: [&[u8]; 2] = [deep.as_bytes(), b"{\"a\":1}"];
    let inferred = json::infer_schema(payloads).unwrap();
    assert_eq!(inferred.fields().len(), 1);
}

#[test]
fn inferred_json_columns_keep_the_order_they_are_written_in() {
    let payloads: [&[u8]; 3] = [
        b"{\"zeta\":1,\"alpha\":\"a\",\"mid\":true}",
        b"{\"zeta\":2,\"new\":1.5}",
        b"{\"alpha\":\"b\"}",
    ];
    let schema = json::infer_schema(payloads).unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["zeta", "alpha", "mid", "new"]);
}

#[test]
fn inferred_columns_are_required_when_every_sample_had_them() {
    let d = messages(TextFormat::Json);
    let sample: [&[u8]; 3] = [b"{\"a\":1,\"b\":\"x\"}", b"{\"a\":2}", b"not json"];
    assert_eq!(d.complete_columns(&sample), ["a"]);
    assert!(d.complete_columns(&[b"nope"]).is_empty());
}

#[test]
fn declared_columns_are_required_unless_marked_nullable() {
    use std::collections::BTreeMap;
    let declared: BTreeMap<String, DeclaredColumn> =
        serde_json::from_str(r#"{"user_id": "string", "score": "float64?"}"#).unwrap();
    assert_eq!(declared_required(&declared), ["user_id"]);
    assert!(!declared["user_id"].nullable);
    assert_eq!(declared["score"].data, ColumnType::Float64);
    let e = serde_json::from_str::<DeclaredColumn>(r#""strng""#).unwrap_err();
    assert!(e.to_string().contains("unknown column type `strng`"), "{e}");
}
