use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{
    ArrayRef, BinaryArray, DictionaryArray, Float64Array, Int32Array, Int64Array, ListArray,
    RecordBatch, StringArray, StructArray, TimestampMillisecondArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use riffle_dataflow::dead_letter::DeadLetter;

use super::*;
use crate::schema_registry::{
    wire, RegisteredSchema, RegistryError, SchemaLookup, SchemaReference, SchemaType, StaticSchemas,
};
use crate::Decoded;

const V1: &str = r#"{"type": "record", "name": "Click", "namespace": "com.example", "fields": [
    {"name": "id", "type": "long"},
    {"name": "url", "type": "string"}]}"#;

/// V1 and a field with a default.
const V2: &str = r#"{"type": "record", "name": "Click", "namespace": "com.example", "fields": [
    {"name": "id", "type": "long"},
    {"name": "url", "type": "string"},
    {"name": "score", "type": "double", "default": 1.5}]}"#;

/// `id` changed type: not readable as V1 or V2.
const INCOMPATIBLE: &str = r#"{"type": "record", "name": "Click", "namespace": "com.example",
    "fields": [{"name": "id", "type": "string"}, {"name": "url", "type": "string"}]}"#;

fn registered(id: u32, schema_type: SchemaType, text: &str) -> Arc<RegisteredSchema> {
    Arc::new(RegisteredSchema {
        id,
        schema_type,
        schema: text.to_string(),
        references: Vec::new(),
        subject: None,
        version: None,
    })
}

fn schemas(entries: &[(u32, &str)]) -> StaticSchemas {
    StaticSchemas(
        entries
            .iter()
            .map(|&(id, text)| (id, registered(id, SchemaType::Avro, text)))
            .collect(),
    )
}

fn lookup(entries: &[(u32, &str)]) -> Option<Arc<dyn SchemaLookup>> {
    Some(Arc::new(schemas(entries)))
}

/// Counts lookups, and fails them as an unreachable registry would while `down`.
#[derive(Debug)]
struct Counting {
    inner: StaticSchemas,
    calls: AtomicUsize,
    down: AtomicBool,
}

impl SchemaLookup for Counting {
    fn by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(RegistryError::Request {
                url: "http://registry:8081".into(),
                what: "connection refused".into(),
            });
        }
        self.inner.by_id(id)
    }

    fn references(
        &self,
        schema: &RegisteredSchema,
    ) -> Result<Vec<(String, Arc<RegisteredSchema>)>, RegistryError> {
        self.inner.references(schema)
    }
}

fn letter(i: usize, reason: &str) -> DeadLetter {
    DeadLetter {
        stage: "source".into(),
        reason: format!("{i}: {reason}"),
        record: String::new(),
    }
}

fn decode(decoder: &AvroDecoder, payloads: &[Vec<u8>]) -> Decoded {
    let payloads: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    decoder.decode_or_reject(&payloads, letter).unwrap()
}

fn reasons(decoded: &Decoded) -> Vec<&str> {
    decoded.rejected.iter().map(|l| l.reason.as_str()).collect()
}

/// Rows `(id, url)` as payloads written with `schema` (V1's columns and, for V2, `score`).
fn clicks(schema: &str, framing: EncodeFraming, rows: &[(i64, &str)]) -> Vec<Vec<u8>> {
    let ids = Int64Array::from_iter_values(rows.iter().map(|r| r.0));
    let urls = StringArray::from_iter_values(rows.iter().map(|r| r.1));
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("url", DataType::Utf8, false),
    ];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(ids), Arc::new(urls)];
    if schema.contains("score") {
        fields.push(Field::new("score", DataType::Float64, false));
        columns.push(Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.0 as f64 * 10.0),
        )));
    }
    let input = Schema::new(fields);
    let batch = RecordBatch::try_new(Arc::new(input.clone()), columns).unwrap();
    let mut encoder = AvroEncoder::new(&input, Some(schema), "unused").unwrap();
    encoder
        .encode(&batch, framing)
        .unwrap()
        .into_iter()
        .map(|b| b.to_vec())
        .collect()
}

fn longs(batch: &RecordBatch, name: &str) -> Vec<i64> {
    let column = batch.column_by_name(name).unwrap();
    column.as_primitive::<Int64Type>().values().to_vec()
}

fn doubles(batch: &RecordBatch, name: &str) -> Vec<f64> {
    let column = batch.column_by_name(name).unwrap();
    column.as_primitive::<Float64Type>().values().to_vec()
}

fn strings(batch: &RecordBatch, name: &str) -> Vec<String> {
    let column = batch.column_by_name(name).unwrap().as_string::<i32>();
    column.iter().map(|s| s.unwrap().to_string()).collect()
}

#[test]
fn a_producer_moving_to_a_new_schema_version_is_read_into_the_reader_schema() {
    let writers = lookup(&[(1, V1), (2, V2)]);
    let mut payloads = clicks(V1, EncodeFraming::Confluent(1), &[(1, "a"), (2, "b")]);
    payloads.extend(clicks(V2, EncodeFraming::Confluent(2), &[(3, "c")]));
    payloads.extend(clicks(V1, EncodeFraming::Confluent(1), &[(4, "d")]));

    // Reader v2: v1 messages get the default.
    let decoder = AvroDecoder::new(V2, AvroFraming::Confluent, writers.clone()).unwrap();
    let decoded = decode(&decoder, &payloads);
    assert!(decoded.rejected.is_empty(), "{:?}", reasons(&decoded));
    assert_eq!(decoded.kept, [0, 1, 2, 3]);
    let batch = &decoded.batch;
    assert_eq!(batch.schema(), *decoder.schema());
    assert_eq!(longs(batch, "id"), [1, 2, 3, 4]);
    assert_eq!(strings(batch, "url"), ["a", "b", "c", "d"]);
    assert_eq!(doubles(batch, "score"), [1.5, 1.5, 30.0, 1.5]);

    // Reader v1: v2's added field is left out.
    let decoder = AvroDecoder::new(V1, AvroFraming::Confluent, writers).unwrap();
    let decoded = decode(&decoder, &payloads);
    assert!(decoded.rejected.is_empty(), "{:?}", reasons(&decoded));
    assert_eq!(decoded.batch.num_columns(), 2);
    assert_eq!(longs(&decoded.batch, "id"), [1, 2, 3, 4]);
}

#[test]
fn only_the_payloads_of_an_unreadable_writer_are_rejected_naming_its_id() {
    let mut entries = schemas(&[(1, V1), (7, INCOMPATIBLE)]);
    entries.0.insert(
        8,
        registered(8, SchemaType::Protobuf, "syntax = \"proto3\";"),
    );
    let mut referring = registered(10, SchemaType::Avro, V1).as_ref().clone();
    referring.references.push(SchemaReference {
        name: "com.example.Other".into(),
        subject: "other".into(),
        version: 1,
    });
    entries.0.insert(10, Arc::new(referring));
    let counting = Arc::new(Counting {
        inner: entries,
        calls: AtomicUsize::new(0),
        down: AtomicBool::new(false),
    });
    let decoder = AvroDecoder::new(
        V1,
        AvroFraming::Confluent,
        Some(counting.clone() as Arc<dyn SchemaLookup>),
    )
    .unwrap();
    let good = clicks(
        V1,
        EncodeFraming::Confluent(1),
        &[(1, "a"), (2, "b"), (3, "c")],
    );
    let mut incompatible = clicks(V1, EncodeFraming::Confluent(1), &[(9, "x")]).remove(0);
    incompatible[1..5].copy_from_slice(&7u32.to_be_bytes());
    let mut protobuf = incompatible.clone();
    protobuf[1..5].copy_from_slice(&8u32.to_be_bytes());
    let mut unknown = incompatible.clone();
    unknown[1..5].copy_from_slice(&9u32.to_be_bytes());
    let mut referencing = incompatible.clone();
    referencing[1..5].copy_from_slice(&10u32.to_be_bytes());
    let payloads = vec![
        good[0].clone(),
        incompatible.clone(),
        good[1].clone(),
        protobuf,
        unknown,
        referencing,
        incompatible,
        good[2].clone(),
    ];
    let decoded = decode(&decoder, &payloads);
    assert_eq!(decoded.kept, [0, 2, 7]);
    assert_eq!(longs(&decoded.batch, "id"), [1, 2, 3]);
    let r = reasons(&decoded);
    assert_eq!(r.len(), 5, "{r:?}");
    assert!(
        r[0].starts_with("1: writer schema id 7 cannot be read as the reader schema: "),
        "{}",
        r[0]
    );
    assert_eq!(r[1], "3: writer schema id 8 is a PROTOBUF schema, not Avro");
    assert!(
        r[2].starts_with("4: writer schema id 9 could not be fetched: ")
            && r[2].contains("no schema with id 9"),
        "{}",
        r[2]
    );
    assert!(
        r[3].contains("writer schema id 10 references other schemas (com.example.Other)"),
        "{}",
        r[3]
    );
    assert!(r[4].starts_with("6: writer schema id 7 cannot"), "{}", r[4]);
    // One lookup per id, failures included, for the decoder's life.
    assert_eq!(counting.calls.load(Ordering::SeqCst), 5);
    let again = decode(&decoder, &payloads);
    assert_eq!(again.kept, [0, 2, 7]);
    assert_eq!(counting.calls.load(Ordering::SeqCst), 5);
}

#[test]
fn an_unreachable_registry_stops_the_batch_and_is_asked_again_with_the_next() {
    let counting = Arc::new(Counting {
        inner: schemas(&[(1, V1)]),
        calls: AtomicUsize::new(0),
        down: AtomicBool::new(true),
    });
    let decoder = AvroDecoder::new(
        V1,
        AvroFraming::Confluent,
        Some(counting.clone() as Arc<dyn SchemaLookup>),
    )
    .unwrap();
    let mut payloads = clicks(V1, EncodeFraming::Confluent(1), &[(1, "a"), (2, "b")]);
    // A run of another id between two runs of id 1: still one lookup of id 1 in this call.
    payloads.insert(
        1,
        clicks(V1, EncodeFraming::Confluent(5), &[(5, "e")]).remove(0),
    );
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    // Good messages are not dead letters because the registry is down: the batch fails.
    let error = decoder
        .decode_or_reject(&refs, |_, _| {
            unreachable!("no dead letter while the registry is down")
        })
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("could not be fetched") && error.contains("connection refused"),
        "{error}"
    );
    assert_eq!(
        counting.calls.load(Ordering::SeqCst),
        2,
        "ids 1 and 5, once each"
    );

    counting.down.store(false, Ordering::SeqCst);
    let decoded = decode(&decoder, &payloads);
    assert_eq!(decoded.kept, [0, 2]);
    assert!(reasons(&decoded)[0].contains("no schema with id 5"));
    assert_eq!(counting.calls.load(Ordering::SeqCst), 4);
}

#[test]
fn bad_payloads_are_rejected_with_a_reason_and_the_others_kept_in_order() {
    let decoder = AvroDecoder::new(V1, AvroFraming::Confluent, lookup(&[(1, V1)])).unwrap();
    let good = clicks(
        V1,
        EncodeFraming::Confluent(1),
        &[(1, "a"), (2, "b"), (3, "c"), (4, "d")],
    );
    let mut trailing = good[1].clone();
    trailing.push(0);
    // `url`'s length says 40 bytes; 1 follows.
    let truncated = [wire::prefix(1).as_slice(), &[0x02, 0x50, b'x']].concat();
    let payloads = vec![
        good[0].clone(),
        b"{\"id\": 1}".to_vec(),
        truncated,
        good[1].clone(),
        trailing,
        vec![0, 0],
        good[2].clone(),
        Vec::new(),
        good[3].clone(),
    ];
    let decoded = decode(&decoder, &payloads);
    assert_eq!(decoded.kept, [0, 3, 6, 8]);
    assert_eq!(longs(&decoded.batch, "id"), [1, 2, 3, 4]);
    assert_eq!(strings(&decoded.batch, "url"), ["a", "b", "c", "d"]);
    let r = reasons(&decoded);
    assert_eq!(r.len(), 5, "{r:?}");
    assert!(
        r[0].starts_with("1: payload starts with byte 0x7b"),
        "{}",
        r[0]
    );
    assert!(
        r[1].starts_with("2: Avro datum does not decode with writer schema id 1: "),
        "{}",
        r[1]
    );
    assert_eq!(
        r[2],
        "4: 1 byte left over after the Avro datum (3 of 4 bytes read, writer schema id 1)"
    );
    assert!(
        r[3].contains("shorter than the schema registry's 5-byte prefix"),
        "{}",
        r[3]
    );
    assert!(r[4].starts_with("7: empty payload"), "{}", r[4]);

    // A reason quoting a whole payload is cut.
    let long = vec![b'x'; 4000];
    let decoded = decode(&decoder, &[long]);
    assert!(decoded.rejected[0].reason.len() < 400);
}

#[test]
fn plain_payloads_are_bare_datums_of_the_reader_schema() {
    let decoder = AvroDecoder::new(V1, AvroFraming::Plain, None).unwrap();
    let mut payloads = clicks(V1, EncodeFraming::Plain, &[(1, "a"), (2, "bc")]);
    // id 1 (zigzag 2), then "a": no prefix.
    assert_eq!(payloads[0], [0x02, 0x02, b'a']);
    payloads.push(vec![0x02]);
    let decoded = decode(&decoder, &payloads);
    assert_eq!(decoded.kept, [0, 1]);
    assert_eq!(strings(&decoded.batch, "url"), ["a", "bc"]);
    assert!(
        reasons(&decoded)[0].starts_with("2: Avro datum does not decode: "),
        "{:?}",
        reasons(&decoded)
    );
    // The clone has decoders of its own and reads the same.
    let clone = decoder.clone();
    assert_eq!(decode(&clone, &payloads).kept, [0, 1]);
    assert_eq!(decode(&decoder, &[]).batch.num_rows(), 0);
}

#[test]
fn bad_reader_schemas_and_missing_lookups_are_errors() {
    let e = AvroDecoder::new("{\"type\": \"record\"", AvroFraming::Plain, None).unwrap_err();
    assert!(
        e.to_string().starts_with("invalid Avro reader schema: "),
        "{e}"
    );
    let e = AvroDecoder::new("\"long\"", AvroFraming::Plain, None).unwrap_err();
    assert!(
        e.to_string().starts_with("invalid Avro reader schema: "),
        "{e}"
    );
    let e = AvroDecoder::new(V1, AvroFraming::Confluent, None).unwrap_err();
    assert!(matches!(e, AvroFormatError::NoLookup), "{e}");
}

/// Every kind of value the brief names: nested record, array, nullable union, enum,
/// timestamp-millis, bytes.
const RICH: &str = r#"{"type": "record", "name": "Event", "namespace": "com.example", "fields": [
    {"name": "id", "type": "long"},
    {"name": "user", "type": {"type": "record", "name": "User", "fields": [
        {"name": "name", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}}]}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "CLICK"]}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "blob", "type": "bytes"}]}"#;

fn rich_batch(schema: &arrow_schema::SchemaRef) -> RecordBatch {
    let field = |name: &str| schema.field_with_name(name).unwrap().clone();
    let DataType::Struct(user_fields) = field("user").data_type().clone() else {
        panic!("user is {}", field("user").data_type());
    };
    let DataType::List(item) = user_fields[1].data_type().clone() else {
        panic!("tags is {}", user_fields[1].data_type());
    };
    let tags = ListArray::new(
        item,
        OffsetBuffer::from_lengths([2, 0]),
        Arc::new(StringArray::from(vec!["a", "b"])),
        None,
    );
    let user = StructArray::new(
        user_fields,
        vec![
            Arc::new(StringArray::from(vec!["ann", "bob"])),
            Arc::new(tags),
        ],
        None,
    );
    let kind = DictionaryArray::new(
        Int32Array::from(vec![1, 0]),
        Arc::new(StringArray::from(vec!["VIEW", "CLICK"])),
    );
    let at = TimestampMillisecondArray::from(vec![1_700_000_000_123, 0])
        .with_data_type(field("at").data_type().clone());
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2])),
        Arc::new(user),
        Arc::new(StringArray::from(vec![Some("hi"), None])),
        Arc::new(kind),
        Arc::new(at),
        Arc::new(BinaryArray::from_vec(vec![b"\x00\xff", b""])),
    ];
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

#[test]
fn rich_values_map_to_arrow_types_and_round_trip_through_the_registry_framing() {
    let decoder = AvroDecoder::new(RICH, AvroFraming::Confluent, lookup(&[(258, RICH)])).unwrap();
    let schema = decoder.schema().clone();
    assert_eq!(
        schema.field_with_name("id").unwrap().data_type(),
        &DataType::Int64
    );
    assert!(!schema.field_with_name("id").unwrap().is_nullable());
    assert!(schema.field_with_name("note").unwrap().is_nullable());
    assert_eq!(
        schema.field_with_name("note").unwrap().data_type(),
        &DataType::Utf8
    );
    assert_eq!(
        schema.field_with_name("kind").unwrap().data_type(),
        &DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
    );
    assert!(matches!(
        schema.field_with_name("at").unwrap().data_type(),
        DataType::Timestamp(TimeUnit::Millisecond, Some(_))
    ));
    assert_eq!(
        schema.field_with_name("blob").unwrap().data_type(),
        &DataType::Binary
    );

    let batch = rich_batch(&schema);
    let mut encoder = AvroEncoder::new(&schema, Some(RICH), "unused").unwrap();
    assert_eq!(encoder.record_name().as_deref(), Some("com.example.Event"));
    assert_eq!(encoder.schema_text(), RICH);
    let payloads = encoder
        .encode(&batch, EncodeFraming::Confluent(258))
        .unwrap();
    assert_eq!(payloads.len(), 2);
    for payload in &payloads {
        assert_eq!(payload[..5], [0, 0, 0, 1, 2]);
    }
    let payloads: Vec<Vec<u8>> = payloads.iter().map(|b| b.to_vec()).collect();
    let decoded = decode(&decoder, &payloads);
    assert!(decoded.rejected.is_empty(), "{:?}", reasons(&decoded));
    assert_eq!(decoded.batch, batch);

    let plain = encoder.encode(&batch, EncodeFraming::Plain).unwrap();
    for (plain, framed) in plain.iter().zip(&payloads) {
        assert_eq!(plain[..], framed[5..]);
    }
}

#[test]
fn a_derived_schema_is_named_as_asked_and_round_trips() {
    let input = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("url", DataType::Utf8, true),
        Field::new("score", DataType::Float64, false),
    ]);
    let batch = RecordBatch::try_new(
        Arc::new(input.clone()),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
            Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5])),
        ],
    )
    .unwrap();
    let mut encoder = AvroEncoder::new(&input, None, "riffle.clicks_out").unwrap();
    assert_eq!(encoder.record_name().as_deref(), Some("riffle.clicks_out"));
    let text: serde_json::Value = serde_json::from_str(encoder.schema_text()).unwrap();
    assert_eq!(text["name"], "clicks_out");
    assert_eq!(text["namespace"], "riffle");
    let payloads = encoder.encode(&batch, EncodeFraming::Confluent(3)).unwrap();
    assert_eq!(payloads[0][..5], wire::prefix(3));
    let decoder = AvroDecoder::new(
        encoder.schema_text(),
        AvroFraming::Confluent,
        lookup(&[(3, encoder.schema_text())]),
    )
    .unwrap();
    let payloads: Vec<Vec<u8>> = payloads.iter().map(|b| b.to_vec()).collect();
    let decoded = decode(&decoder, &payloads);
    assert_eq!(decoded.batch.columns(), batch.columns());
    assert_eq!(decoded.batch.schema().fields(), input.fields());

    let bare = AvroEncoder::new(&input, None, "Click").unwrap();
    assert_eq!(bare.record_name().as_deref(), Some("Click"));

    // A batch of other columns is refused.
    let other = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![1]))],
    )
    .unwrap();
    let e = encoder.encode(&other, EncodeFraming::Plain).unwrap_err();
    assert!(
        e.to_string()
            .contains("not those the Avro encoder was built for"),
        "{e}"
    );
}

#[test]
fn a_declared_schema_must_cover_the_columns_and_fills_defaulted_fields() {
    let input = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("url", DataType::Utf8, false),
    ]);
    // `score` is not a column: written with its default.
    let mut encoder = AvroEncoder::new(&input, Some(V2), "unused").unwrap();
    let batch = RecordBatch::try_new(
        Arc::new(input.clone()),
        vec![
            Arc::new(Int64Array::from(vec![7, 8])),
            Arc::new(StringArray::from(vec!["x", "y"])),
        ],
    )
    .unwrap();
    let payloads = encoder.encode(&batch, EncodeFraming::Plain).unwrap();
    let payloads: Vec<Vec<u8>> = payloads.iter().map(|b| b.to_vec()).collect();
    let decoder = AvroDecoder::new(V2, AvroFraming::Plain, None).unwrap();
    let decoded = decode(&decoder, &payloads);
    assert_eq!(longs(&decoded.batch, "id"), [7, 8]);
    assert_eq!(doubles(&decoded.batch, "score"), [1.5, 1.5]);

    let only_id = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
    let e = AvroEncoder::new(&only_id, Some(V1), "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("field `url` has no default and is not among the results' columns"),
        "{e}"
    );
    let mut wide = input.fields().to_vec();
    wide.push(Arc::new(Field::new("extra", DataType::Int64, false)));
    let e = AvroEncoder::new(&Schema::new(wide), Some(V1), "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("result column `extra` is not in the Avro schema"),
        "{e}"
    );
    let wrong_type = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("url", DataType::Utf8, false),
    ]);
    let e = AvroEncoder::new(&wrong_type, Some(V1), "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot be written with the declared Avro schema"),
        "{e}"
    );
    assert!(e.contains("`id` is Utf8"), "{e}");
    // A nullable column for a field that is not: nulls are refused with the batch.
    let nullable = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("url", DataType::LargeUtf8, true),
    ]);
    let mut encoder = AvroEncoder::new(&nullable, Some(V1), "x").unwrap();
    let batch = RecordBatch::try_new(
        Arc::new(nullable),
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(arrow_array::LargeStringArray::from(vec!["a", "b"])),
        ],
    )
    .unwrap();
    let e = encoder
        .encode(&batch, EncodeFraming::Plain)
        .unwrap_err()
        .to_string();
    assert!(e.contains("id"), "{e}");
    let ok = encoder
        .encode(&batch.slice(0, 1), EncodeFraming::Plain)
        .unwrap();
    assert_eq!(ok[0][..], [0x02, 0x02, b'a']);
    let e = AvroEncoder::new(&input, Some("\"long\""), "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("invalid Avro writer schema: expected a record"),
        "{e}"
    );
}

#[test]
fn a_large_batch_of_one_writer_decodes_in_one_pass() {
    let rows: Vec<(i64, String)> = (0..5000).map(|i| (i, format!("u{i}"))).collect();
    let rows: Vec<(i64, &str)> = rows.iter().map(|(i, s)| (*i, s.as_str())).collect();
    let payloads = clicks(V1, EncodeFraming::Confluent(1), &rows);
    let decoder = AvroDecoder::new(V2, AvroFraming::Confluent, lookup(&[(1, V1)])).unwrap();
    let decoded = decode(&decoder, &payloads);
    assert_eq!(decoded.batch.num_rows(), 5000);
    assert_eq!(decoded.kept.len(), 5000);
    assert_eq!(longs(&decoded.batch, "id")[4999], 4999);
}

#[test]
fn the_decoder_is_shared_by_workers() {
    fn shareable<T: Clone + std::fmt::Debug + Send + Sync>() {}
    shareable::<AvroDecoder>();
    fn sendable<T: Send>() {}
    sendable::<AvroEncoder>();
}
