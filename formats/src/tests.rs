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
    let declared: DeclaredSchema = [(
        "n".to_string(),
        DeclaredColumn {
            data: ColumnType::Int64,
            list: None,
            nullable: false,
        },
    )]
    .into_iter()
    .collect();
    let schema = declared_schema(&declared).unwrap();
    assert_eq!(schema.field(0).data_type(), &DataType::Int64);
    assert!(declared_schema(&DeclaredSchema::default()).is_none());
    let column = ColumnType::Bool.parse_column([Some(" TRUE "), Some("x"), None].into_iter());
    assert_eq!(column.null_count(), 2);
    let column = ColumnType::Float32.parse_column([Some("1.5"), Some("x")].into_iter());
    assert_eq!(column.data_type(), &DataType::Float32);
    assert_eq!(column.null_count(), 1);
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
    let declared: DeclaredSchema =
        serde_json::from_str(r#"{"user_id": "string", "score": "float64?"}"#).unwrap();
    assert_eq!(declared_required(&declared), ["user_id"]);
    assert!(!declared.get("user_id").unwrap().nullable);
    assert_eq!(declared.get("score").unwrap().data, ColumnType::Float64);
    let e = serde_json::from_str::<DeclaredColumn>(r#""strng""#).unwrap_err();
    assert!(e.to_string().contains("unknown column type `strng`"), "{e}");
}

#[test]
fn declared_columns_keep_the_written_order_and_bad_types_name_their_column() {
    let yaml = "zeta: int32\nalpha: float32[4]\nmid: int64[80]?\nb: bool\n";
    let declared: DeclaredSchema = serde_saphyr::from_str(yaml).unwrap();
    let schema = declared_schema(&declared).unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["zeta", "alpha", "mid", "b"]);
    assert_eq!(schema.field(0).data_type(), &DataType::Int32);
    let DataType::FixedSizeList(item, 4) = schema.field(1).data_type() else {
        panic!("{:?}", schema.field(1));
    };
    assert_eq!(item.data_type(), &DataType::Float32);
    // A tensor column of shape [4], as a model takes it.
    assert_eq!(
        riffle_dataflow::tensor::row_shape(schema.field(1)).unwrap(),
        [4]
    );
    assert_eq!(declared.get("mid").unwrap().to_string(), "int64[80]?");
    assert_eq!(declared_required(&declared), ["zeta", "alpha", "b"]);

    let e = serde_saphyr::from_str::<DeclaredSchema>("a: int64\nscore: flaot32\n").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("schema column `score`"), "{text}");
    assert!(text.contains("unknown column type `flaot32`"), "{text}");
    assert!(text.contains("float32, float64, bool"), "{text}");
    for bad in ["float32[0]", "string[3]", "float32[x]", "float32[4"] {
        let e = serde_json::from_str::<DeclaredColumn>(&format!("{bad:?}")).unwrap_err();
        assert!(e.to_string().contains(bad), "{bad}: {e}");
    }
    let twice = serde_json::from_str::<DeclaredSchema>(r#"{"a": "int64", "a": "bool"}"#);
    assert!(twice.unwrap_err().to_string().contains("declared twice"));
}

fn declared_json(schema: &str) -> Decoder {
    let declared: DeclaredSchema = serde_json::from_str(schema).unwrap();
    Decoder::new(
        TextFormat::Json,
        Framing::FileRecord,
        declared_schema(&declared).unwrap(),
    )
    .with_required(&declared_required(&declared))
}

#[test]
fn declared_json_lists_must_have_their_length_and_numbers() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Float32Type;
    let d = declared_json(r#"{"id": "int64", "v": "float32[3]", "n": "int32?"}"#);
    let batch = d
        .decode(&[
            b"{\"v\": [1, 2.5, 3], \"id\": 7, \"extra\": \"ignored\"}\n",
            b"{\"id\": 8, \"v\": [\"4\", 5, 6], \"n\": 2}\n",
        ])
        .unwrap();
    assert_eq!(batch.num_rows(), 2);
    let names: Vec<&str> = batch
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(names, ["id", "v", "n"]);
    let v = batch.column(1).as_fixed_size_list();
    assert_eq!(
        v.values().as_primitive::<Float32Type>().values(),
        &[1.0, 2.5, 3.0, 4.0, 5.0, 6.0]
    );

    let short = reason_of(&d, b"{\"id\": 1, \"v\": [1, 2]}");
    assert!(
        short.contains("'v'") && short.contains("expected 3 but got 2"),
        "{short}"
    );
    let text = reason_of(&d, b"{\"id\": 1, \"v\": [1, \"x\", 3]}");
    assert!(text.contains("'v'") && text.contains("\"x\""), "{text}");
    let null = reason_of(&d, b"{\"id\": 1, \"v\": [1, null, 3]}");
    assert!(null.contains("'v'") && null.contains("element 1"), "{null}");
    let scalar = reason_of(&d, b"{\"id\": 1, \"v\": 3}");
    assert!(scalar.contains("'v'"), "{scalar}");
    let id = reason_of(&d, b"{\"id\": \"seven\", \"v\": [1, 2, 3]}");
    assert!(id.contains("'id'") && id.contains("seven"), "{id}");
    let missing = reason_of(&d, b"{\"id\": 1}");
    assert!(
        missing.ends_with("missing required column `v`"),
        "{missing}"
    );

    // One bad record among good ones: only it is rejected.
    let decoded = d
        .decode_or_reject(
            &[
                b"{\"id\": 1, \"v\": [1, 2, 3]}",
                b"{\"id\": 2, \"v\": [1, 2, 3, 4]}",
                b"{\"id\": 3, \"v\": [1, 2, 3]}",
            ],
            |i, e| DeadLetter {
                stage: "source".into(),
                reason: e.to_string(),
                record: i.to_string(),
            },
        )
        .unwrap();
    assert_eq!(decoded.kept, [0, 2]);
    assert_eq!(decoded.batch.num_rows(), 2);
}

#[test]
fn csv_cannot_hold_lists_and_reads_declared_columns_by_projection() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("b", DataType::Float32, true),
        Field::new("a", DataType::Int32, true),
    ]));
    // Records `a,skip,b`: read as three columns, kept as `b`, `a`.
    let read = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("skip", DataType::Utf8, true),
        Field::new("b", DataType::Float32, true),
    ]));
    let d = Decoder::new(CSV, Framing::Message, schema.clone())
        .reading(read, vec![2, 0])
        .with_required(&["a".into()]);
    let batch = d.decode(&[b"1,x,2.5", b"3,y,"]).unwrap();
    assert_eq!(batch.schema(), schema);
    assert_eq!(
        batch.column(1).as_ref(),
        &arrow_array::Int32Array::from(vec![1, 3])
    );
    assert!(reason_of(&d, b"1,x,abc").contains("abc"));
    assert!(reason_of(&d, b",x,1").ends_with("missing required column `a`"));

    let declared: DeclaredSchema = serde_json::from_str(r#"{"v": "float32[2]"}"#).unwrap();
    let d = Decoder::new(CSV, Framing::Message, declared_schema(&declared).unwrap());
    assert!(reason_of(&d, b"1").contains("column `v` is a list"));
}
