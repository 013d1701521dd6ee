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
    let declared = BTreeMap::from([("n".to_string(), ColumnType::Int64)]);
    let schema = declared_schema(&declared).unwrap();
    assert_eq!(schema.field(0).data_type(), &DataType::Int64);
    assert!(declared_schema(&BTreeMap::new()).is_none());
    let column = ColumnType::Bool.parse_column([Some(" TRUE "), Some("x"), None].into_iter());
    assert_eq!(column.null_count(), 2);
}
