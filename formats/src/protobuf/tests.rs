use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use prost::Message as _;
use prost_reflect::{DynamicMessage, MapKey, MessageDescriptor, Value};
use riffle_dataflow::dead_letter::DeadLetter;

use super::*;
use crate::schema_registry::wire;
use crate::schema_registry::{
    RegisteredSchema, RegistryError, SchemaLookup, SchemaReference, SchemaType, StaticSchemas,
};

const CLICKS: &str = r#"
syntax = "proto3";
package shop;

import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

message Click {
  enum Kind {
    KIND_UNSPECIFIED = 0;
    VIEW = 1;
    BUY = 2;
  }
  message Item {
    string sku = 1;
    int32 quantity = 2;
  }
  string user = 1;
  int64 amount = 2;
  optional int32 discount = 3;
  Kind kind = 4;
  Item item = 5;
  repeated string tags = 6;
  repeated Item items = 7;
  map<string, int64> counts = 8;
  google.protobuf.Timestamp at = 9;
  bytes payload = 10;
  google.protobuf.Int64Value score = 11;
  sint64 delta = 12;
  uint64 big = 13;
  double ratio = 14;
  bool flag = 15;
}

message Refund {
  string user = 1;
  int64 amount = 2;
}
"#;

/// A newer version of CLICKS: one field more.
fn clicks_v2() -> String {
    CLICKS.replace(
        "bool flag = 15;",
        "bool flag = 15;\n  string referrer = 16;",
    )
}

/// CLICKS with `amount` a string: not readable as v1.
fn clicks_bad() -> String {
    CLICKS.replace(
        "int64 amount = 2;\n  optional",
        "string amount = 2;\n  optional",
    )
}

fn write_clicks(dir: &Path) -> PathBuf {
    let path = dir.join("clicks.proto");
    std::fs::write(&path, CLICKS).unwrap();
    path
}

fn registered(id: u32, schema_type: SchemaType, text: &str) -> Arc<RegisteredSchema> {
    Arc::new(RegisteredSchema {
        id,
        schema_type,
        schema: text.to_owned(),
        references: Vec::new(),
        subject: None,
        version: None,
    })
}

/// Schemas by id, with references, counting lookups, and able to be unreachable.
#[derive(Debug, Default)]
struct Registry {
    schemas: HashMap<u32, Arc<RegisteredSchema>>,
    references: HashMap<u32, Vec<(String, Arc<RegisteredSchema>)>>,
    lookups: AtomicUsize,
    down: AtomicBool,
}

impl SchemaLookup for Registry {
    fn by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(RegistryError::Request {
                url: "http://registry:8081".into(),
                what: "connection refused".into(),
            });
        }
        StaticSchemas(self.schemas.clone()).by_id(id)
    }

    fn references(
        &self,
        schema: &RegisteredSchema,
    ) -> Result<Vec<(String, Arc<RegisteredSchema>)>, RegistryError> {
        Ok(self.references.get(&schema.id).cloned().unwrap_or_default())
    }
}

fn registry() -> Arc<Registry> {
    let mut schemas = HashMap::new();
    schemas.insert(1, registered(1, SchemaType::Protobuf, CLICKS));
    schemas.insert(2, registered(2, SchemaType::Protobuf, &clicks_v2()));
    schemas.insert(3, registered(3, SchemaType::Protobuf, &clicks_bad()));
    schemas.insert(4, registered(4, SchemaType::Avro, r#"{"type":"string"}"#));
    Arc::new(Registry {
        schemas,
        ..Default::default()
    })
}

fn reader(message: &str) -> ProtoSchema {
    ProtoSchema::from_registered(
        &registered(1, SchemaType::Protobuf, CLICKS),
        &[],
        Some(message),
    )
    .unwrap()
}

/// The descriptor of `message` in `text`, for writing payloads.
fn writer_message(text: &str, message: &str) -> MessageDescriptor {
    ProtoSchema::from_registered(
        &registered(99, SchemaType::Protobuf, text),
        &[],
        Some(message),
    )
    .unwrap()
    .descriptor()
    .clone()
}

fn sub(message: &MessageDescriptor, field: &str) -> MessageDescriptor {
    match message.get_field_by_name(field).unwrap().kind() {
        prost_reflect::Kind::Message(m) => m,
        other => panic!("{field} is {other:?}"),
    }
}

/// A Click with every field set.
fn full_click(desc: &MessageDescriptor, user: &str, amount: i64) -> DynamicMessage {
    let mut m = DynamicMessage::new(desc.clone());
    let item_desc = sub(desc, "item");
    let item = |sku: &str, quantity: i32| {
        let mut item = DynamicMessage::new(item_desc.clone());
        item.set_field_by_name("sku", Value::String(sku.into()));
        item.set_field_by_name("quantity", Value::I32(quantity));
        Value::Message(item)
    };
    let mut at = DynamicMessage::new(sub(desc, "at"));
    at.set_field_by_name("seconds", Value::I64(1_700_000_000));
    at.set_field_by_name("nanos", Value::I32(123_456_789));
    let mut score = DynamicMessage::new(sub(desc, "score"));
    score.set_field_by_name("value", Value::I64(-7));
    let counts = HashMap::from([
        (MapKey::String("b".into()), Value::I64(2)),
        (MapKey::String("a".into()), Value::I64(1)),
    ]);
    m.set_field_by_name("user", Value::String(user.into()));
    m.set_field_by_name("amount", Value::I64(amount));
    m.set_field_by_name("discount", Value::I32(0));
    m.set_field_by_name("kind", Value::EnumNumber(2));
    m.set_field_by_name("item", item("sku-1", 3));
    m.set_field_by_name(
        "tags",
        Value::List(vec![Value::String("x".into()), Value::String("y".into())]),
    );
    m.set_field_by_name("items", Value::List(vec![item("a", 1), item("b", 2)]));
    m.set_field_by_name("counts", Value::Map(counts));
    m.set_field_by_name("at", Value::Message(at));
    m.set_field_by_name("payload", Value::Bytes(vec![0, 159, 146, 150].into()));
    m.set_field_by_name("score", Value::Message(score));
    m.set_field_by_name("delta", Value::I64(-5));
    m.set_field_by_name("big", Value::U64(u64::MAX));
    m.set_field_by_name("ratio", Value::F64(0.25));
    m.set_field_by_name("flag", Value::Bool(true));
    m
}

fn framed(id: u32, indexes: &[u8], message: &DynamicMessage) -> Vec<u8> {
    let mut out = wire::prefix(id).to_vec();
    out.extend_from_slice(indexes);
    out.extend(message.encode_to_vec());
    out
}

fn letter(i: usize, reason: &str) -> DeadLetter {
    DeadLetter {
        stage: "kafka".into(),
        reason: reason.to_owned(),
        record: i.to_string(),
    }
}

fn decode(decoder: &ProtobufDecoder, payloads: &[Vec<u8>]) -> formats::Decoded {
    let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    decoder.decode_or_reject(&slices, letter).unwrap()
}

use crate as formats;

fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    batch.column_by_name(name).unwrap()
}

#[test]
fn the_arrow_schema_follows_the_proto_types() {
    let dir = tempfile::tempdir().unwrap();
    let schema =
        ProtoSchema::from_proto_file(&write_clicks(dir.path()), &[], "shop.Click").unwrap();
    assert_eq!(schema.message_name(), "shop.Click");
    assert!(schema.proto_text().unwrap().contains("message Refund"));
    let arrow = schema.arrow_schema();
    let field = |name: &str| arrow.field_with_name(name).unwrap().clone();
    let names: Vec<&str> = arrow.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "user", "amount", "discount", "kind", "item", "tags", "items", "counts", "at",
            "payload", "score", "delta", "big", "ratio", "flag"
        ]
    );
    assert_eq!(field("user"), Field::new("user", DataType::Utf8, false));
    assert_eq!(
        field("amount"),
        Field::new("amount", DataType::Int64, false)
    );
    assert_eq!(
        field("discount"),
        Field::new("discount", DataType::Int32, true)
    );
    assert_eq!(field("kind"), Field::new("kind", DataType::Utf8, false));
    let item = DataType::Struct(
        vec![
            Field::new("sku", DataType::Utf8, false),
            Field::new("quantity", DataType::Int32, false),
        ]
        .into(),
    );
    assert_eq!(field("item"), Field::new("item", item.clone(), true));
    assert_eq!(
        field("tags").data_type(),
        &DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, false)))
    );
    assert_eq!(
        field("items").data_type(),
        &DataType::List(Arc::new(Field::new_list_field(item, false)))
    );
    assert!(!field("items").is_nullable());
    assert_eq!(
        field("counts").data_type(),
        &DataType::Map(
            super::schema::map_entries(DataType::Utf8, DataType::Int64),
            false
        )
    );
    assert_eq!(
        field("at"),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true
        )
    );
    assert_eq!(field("payload").data_type(), &DataType::Binary);
    assert_eq!(field("score"), Field::new("score", DataType::Int64, true));
    assert_eq!(field("delta").data_type(), &DataType::Int64);
    assert_eq!(field("big").data_type(), &DataType::UInt64);
    assert_eq!(field("ratio").data_type(), &DataType::Float64);
    assert_eq!(field("flag").data_type(), &DataType::Boolean);

    assert_eq!(schema.message_indexes(), [0]);
    let path = write_clicks(dir.path());
    let refund = ProtoSchema::from_proto_file(&path, &[], "Refund").unwrap();
    assert_eq!(refund.message_name(), "shop.Refund");
    assert_eq!(refund.message_indexes(), [1]);
    let item = ProtoSchema::from_proto_file(&path, &[dir.path().to_owned()], "Click.Item").unwrap();
    assert_eq!(item.message_name(), "shop.Click.Item");
    assert_eq!(item.message_indexes(), [0, 0]);
}

#[test]
fn schema_errors_name_the_file_and_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_clicks(dir.path());
    let e = ProtoSchema::from_proto_file(&path, &[], "Clik")
        .unwrap_err()
        .to_string();
    assert!(e.contains("message `Clik` not found in"), "{e}");
    assert!(
        e.contains("clicks.proto; it defines: shop.Click, shop.Click.Item, shop.Refund"),
        "{e}"
    );
    assert!(!e.contains("CountsEntry"), "{e}");

    let missing = dir.path().join("nope.proto");
    let e = ProtoSchema::from_proto_file(&missing, &[], "A")
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read") && e.contains("nope.proto"), "{e}");

    let broken = dir.path().join("broken.proto");
    std::fs::write(
        &broken,
        "syntax = \"proto3\";\nmessage A {\n  int32 x = ;\n}\n",
    )
    .unwrap();
    let e = ProtoSchema::from_proto_file(&broken, &[], "A")
        .unwrap_err()
        .to_string();
    assert!(e.contains("broken.proto") && e.contains(":3:"), "{e}");

    let importing = dir.path().join("importing.proto");
    std::fs::write(
        &importing,
        "syntax = \"proto3\";\nimport \"other/thing.proto\";\nmessage A {}\n",
    )
    .unwrap();
    let e = ProtoSchema::from_proto_file(&importing, &[], "A")
        .unwrap_err()
        .to_string();
    assert!(e.contains("other/thing.proto"), "{e}");

    let recursive = dir.path().join("tree.proto");
    std::fs::write(
        &recursive,
        "syntax = \"proto3\";\nmessage Node { repeated Node children = 1; }\n",
    )
    .unwrap();
    let e = ProtoSchema::from_proto_file(&recursive, &[], "Node")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`Node` contains itself") && e.contains("children"),
        "{e}"
    );

    let avro = registered(5, SchemaType::Avro, "{}");
    let e = ProtoSchema::from_registered(&avro, &[], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("registered schema id 5") && e.contains("AVRO"),
        "{e}"
    );
}

#[test]
fn oneof_members_are_nullable_and_decoders_are_shareable() {
    fn shareable<T: Clone + std::fmt::Debug + Send + Sync>() {}
    shareable::<ProtobufDecoder>();
    shareable::<ProtoSchema>();
    let text = "syntax = \"proto3\";\nmessage Pay { oneof how { string card = 1; int64 points = 2; } int32 n = 3; }\n";
    let schema =
        ProtoSchema::from_registered(&registered(7, SchemaType::Protobuf, text), &[], None)
            .unwrap();
    let arrow = schema.arrow_schema();
    let nullable: Vec<bool> = arrow.fields().iter().map(|f| f.is_nullable()).collect();
    assert_eq!(nullable, [true, true, false]);
    let desc = schema.descriptor().clone();
    let mut m = DynamicMessage::new(desc);
    m.set_field_by_name("points", Value::I64(0));
    let decoder = ProtobufDecoder::new(schema, ProtoFraming::Plain, None).unwrap();
    assert!(!format!("{decoder:?}").is_empty());
    let d = decode(&decoder, &[m.encode_to_vec()]);
    assert!(column(&d.batch, "card").is_null(0));
    assert_eq!(
        column(&d.batch, "points")
            .as_primitive::<Int64Type>()
            .value(0),
        0
    );
}

#[test]
fn plain_payloads_decode_into_columns() {
    let reader = reader("shop.Click");
    let desc = reader.descriptor().clone();
    let decoder = ProtobufDecoder::new(reader, ProtoFraming::Plain, None).unwrap();
    let mut unknown_kind = DynamicMessage::new(desc.clone());
    unknown_kind.set_field_by_name("kind", Value::EnumNumber(7));
    let payloads = vec![
        full_click(&desc, "ann", 42).encode_to_vec(),
        Vec::new(), // every field at its default
        unknown_kind.encode_to_vec(),
    ];
    let d = decode(&decoder, &payloads);
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert_eq!(d.kept, [0, 1, 2]);
    let b = &d.batch;
    assert_eq!(b.num_rows(), 3);
    assert_eq!(b.schema(), *decoder.schema());
    let user = column(b, "user").as_string::<i32>();
    assert_eq!((user.value(0), user.value(1)), ("ann", ""));
    assert_eq!(user.null_count(), 0);
    let amount = column(b, "amount").as_primitive::<Int64Type>();
    assert_eq!((amount.value(0), amount.value(1)), (42, 0));
    let discount = column(b, "discount").as_primitive::<Int32Type>();
    // Set to its default but present: proto3 `optional` keeps it.
    assert!(discount.is_valid(0) && discount.value(0) == 0);
    assert!(discount.is_null(1));
    let kind = column(b, "kind").as_string::<i32>();
    assert_eq!(
        (kind.value(0), kind.value(1), kind.value(2)),
        ("BUY", "KIND_UNSPECIFIED", "7")
    );
    let item = column(b, "item").as_struct();
    assert!(item.is_valid(0) && item.is_null(1));
    assert_eq!(
        item.column_by_name("sku")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "sku-1"
    );
    let tags = column(b, "tags").as_list::<i32>();
    assert_eq!(
        tags.value(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect::<Vec<_>>(),
        ["x", "y"]
    );
    assert!(tags.is_valid(1) && tags.value(1).is_empty());
    let items = column(b, "items").as_list::<i32>();
    let first = items.value(0);
    let skus = first
        .as_struct()
        .column_by_name("sku")
        .unwrap()
        .as_string::<i32>();
    assert_eq!(skus.iter().flatten().collect::<Vec<_>>(), ["a", "b"]);
    let counts = column(b, "counts").as_map();
    let row0 = counts.value(0);
    assert_eq!(
        row0.column(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(row0.column(1).as_primitive::<Int64Type>().values(), &[1, 2]);
    assert!(counts.value(1).is_empty());
    let at = column(b, "at").as_primitive::<TimestampMicrosecondType>();
    assert_eq!(at.value(0), 1_700_000_000_123_456);
    assert!(at.is_null(1));
    let payload = column(b, "payload").as_binary::<i32>();
    assert_eq!(payload.value(0), [0, 159, 146, 150]);
    assert_eq!(payload.value(1), b"");
    let score = column(b, "score").as_primitive::<Int64Type>();
    assert_eq!(score.value(0), -7);
    assert!(score.is_null(1));
    assert_eq!(column(b, "delta").as_primitive::<Int64Type>().value(0), -5);
    assert_eq!(
        column(b, "big")
            .as_primitive::<arrow_array::types::UInt64Type>()
            .value(0),
        u64::MAX
    );
    assert!(column(b, "flag").as_boolean().value(0));
}

#[test]
fn timestamps_are_utc_and_print_through_arrow_json() {
    let reader = reader("shop.Click");
    let desc = reader.descriptor().clone();
    let decoder = ProtobufDecoder::new(reader, ProtoFraming::Plain, None).unwrap();
    let d = decode(&decoder, &[full_click(&desc, "ann", 1).encode_to_vec()]);
    let at = d
        .batch
        .project(&[d.batch.schema().index_of("at").unwrap()])
        .unwrap();
    let mut out = Vec::new();
    let mut writer = arrow_json::LineDelimitedWriter::new(&mut out);
    writer.write(&at).unwrap();
    writer.finish().unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("2023-11-14T22:13:20.123456"), "{text}");
    let shown = arrow_cast::display::array_value_to_string(at.column(0), 0).unwrap();
    assert!(shown.starts_with("2023-11-14T22:13:20.123456"), "{shown}");
}

#[test]
fn message_indexes_are_written_and_read_as_confluent_frames_them() {
    let cases: [(&[i32], &[u8]); 4] = [
        (&[0], &[0]),
        (&[1], &[2, 2]),
        (&[0, 2], &[4, 0, 4]),
        (&[70], &[2, 0x8c, 0x01]),
    ];
    for (indexes, bytes) in cases {
        let mut written = Vec::new();
        write_message_indexes(indexes, &mut written);
        assert_eq!(written, bytes, "{indexes:?}");
        let mut with_body = written.clone();
        with_body.extend_from_slice(b"body");
        let mut read = Vec::new();
        let rest = read_message_indexes(&with_body, &mut read).unwrap();
        assert_eq!((read.as_slice(), rest), (indexes, &b"body"[..]));
    }
    let mut read = Vec::new();
    assert!(read_message_indexes(&[40, 0], &mut read)
        .unwrap_err()
        .contains("count 20"));
    assert!(read_message_indexes(&[2, 1], &mut read)
        .unwrap_err()
        .contains("negative"));
    assert!(read_message_indexes(&[], &mut read)
        .unwrap_err()
        .contains("framing"));
}

#[test]
fn confluent_payloads_decode_by_their_message_indexes() {
    let registry = registry();
    let click = writer_message(CLICKS, "shop.Click");
    let refund = writer_message(CLICKS, "shop.Refund");
    let mut r = DynamicMessage::new(refund);
    r.set_field_by_name("user", Value::String("bo".into()));
    r.set_field_by_name("amount", Value::I64(-3));

    // The first message, [0], as the single zero byte; no registry: indexes skipped.
    let decoder = ProtobufDecoder::new(reader("Click"), ProtoFraming::Confluent, None).unwrap();
    let d = decode(&decoder, &[framed(1, &[0], &full_click(&click, "ann", 5))]);
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert_eq!(
        column(&d.batch, "amount")
            .as_primitive::<Int64Type>()
            .value(0),
        5
    );

    // The second message, [1], checked against the writer schema.
    let lookup: Arc<dyn SchemaLookup> = registry.clone();
    let decoder =
        ProtobufDecoder::new(reader("shop.Refund"), ProtoFraming::Confluent, Some(lookup)).unwrap();
    let d = decode(
        &decoder,
        &[
            framed(1, &[2, 2], &r),
            framed(1, &[0], &full_click(&click, "ann", 5)),
        ],
    );
    assert_eq!(d.kept, [0]);
    let user = column(&d.batch, "user").as_string::<i32>();
    assert_eq!(user.value(0), "bo");
    assert_eq!(
        column(&d.batch, "amount")
            .as_primitive::<Int64Type>()
            .value(0),
        -3
    );
    assert_eq!(d.rejected.len(), 1);
    let reason = &d.rejected[0].reason;
    assert!(
        reason.contains("id 1 wrote message `shop.Click`, not the reader's `shop.Refund`"),
        "{reason}"
    );
    assert_eq!(d.rejected[0].record, "1");
}

#[test]
fn a_registered_schema_compiles_with_its_references() {
    let money = registered(
        11,
        SchemaType::Protobuf,
        "syntax = \"proto3\";\npackage common;\nmessage Money { string currency = 1; int64 units = 2; }\n",
    );
    let mut invoice = (*registered(
        10,
        SchemaType::Protobuf,
        "syntax = \"proto3\";\npackage billing;\nimport \"common/money.proto\";\n\
         message Invoice { string id = 1; common.Money total = 2; }\nmessage Other { int32 x = 1; }\n",
    ))
    .clone();
    invoice.references.push(SchemaReference {
        name: "common/money.proto".into(),
        subject: "money".into(),
        version: 1,
    });
    let invoice = Arc::new(invoice);
    let references = vec![("common/money.proto".to_owned(), money.clone())];

    let schema = ProtoSchema::from_registered(&invoice, &references, None).unwrap();
    assert_eq!(schema.message_name(), "billing.Invoice");
    assert!(schema.proto_text().unwrap().contains("message Invoice"));
    let total = schema
        .arrow_schema()
        .field_with_name("total")
        .unwrap()
        .clone();
    assert_eq!(
        total.data_type(),
        &DataType::Struct(
            vec![
                Field::new("currency", DataType::Utf8, false),
                Field::new("units", DataType::Int64, false),
            ]
            .into()
        )
    );
    let other = ProtoSchema::from_registered(&invoice, &references, Some("Other")).unwrap();
    assert_eq!(other.message_indexes(), [1]);
    let e = ProtoSchema::from_registered(&invoice, &[], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("registered schema id 10") && e.contains("common/money.proto"),
        "{e}"
    );

    // Payloads of it decode, the writer fetched with its references.
    let registry = Arc::new(Registry {
        schemas: HashMap::from([(10, invoice.clone()), (11, money)]),
        references: HashMap::from([(10, references)]),
        ..Default::default()
    });
    let desc = schema.descriptor().clone();
    let mut m = DynamicMessage::new(desc.clone());
    m.set_field_by_name("id", Value::String("inv-1".into()));
    let mut total = DynamicMessage::new(sub(&desc, "total"));
    total.set_field_by_name("units", Value::I64(12));
    m.set_field_by_name("total", Value::Message(total));
    let lookup: Arc<dyn SchemaLookup> = registry.clone();
    let decoder = ProtobufDecoder::new(schema, ProtoFraming::Confluent, Some(lookup)).unwrap();
    let d = decode(&decoder, &[framed(10, &[0], &m)]);
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    let total = column(&d.batch, "total").as_struct();
    assert_eq!(
        total
            .column_by_name("units")
            .unwrap()
            .as_primitive::<Int64Type>()
            .value(0),
        12
    );
}

#[test]
fn a_newer_writer_with_an_added_field_still_decodes() {
    let registry = registry();
    let v2 = writer_message(&clicks_v2(), "shop.Click");
    let mut m = full_click(&v2, "cy", 9);
    m.set_field_by_name("referrer", Value::String("ads".into()));
    let lookup: Arc<dyn SchemaLookup> = registry.clone();
    let decoder =
        ProtobufDecoder::new(reader("shop.Click"), ProtoFraming::Confluent, Some(lookup)).unwrap();
    for _ in 0..2 {
        let d = decode(&decoder, &[framed(2, &[0], &m), framed(2, &[0], &m)]);
        assert!(d.rejected.is_empty(), "{:?}", d.rejected);
        assert_eq!(d.batch.num_rows(), 2);
        assert!(d.batch.column_by_name("referrer").is_none());
        assert_eq!(column(&d.batch, "user").as_string::<i32>().value(1), "cy");
    }
    // Checked once, for both calls (and for clones).
    let clone = decoder.clone();
    decode(&clone, &[framed(2, &[0], &m)]);
    assert_eq!(registry.lookups.load(Ordering::SeqCst), 1);
}

#[test]
fn an_incompatible_writer_is_rejected_naming_its_id_and_field() {
    let registry = registry();
    let v1 = writer_message(CLICKS, "shop.Click");
    let bad = writer_message(&clicks_bad(), "shop.Click");
    let mut b = DynamicMessage::new(bad);
    b.set_field_by_name("amount", Value::String("12.50".into()));
    let lookup: Arc<dyn SchemaLookup> = registry.clone();
    let decoder =
        ProtobufDecoder::new(reader("shop.Click"), ProtoFraming::Confluent, Some(lookup)).unwrap();
    let payloads = [
        framed(1, &[0], &full_click(&v1, "a", 1)),
        framed(3, &[0], &b),
        framed(1, &[0], &full_click(&v1, "c", 3)),
        framed(3, &[0], &b),
    ];
    let d = decode(&decoder, &payloads);
    assert_eq!(d.kept, [0, 2]);
    assert_eq!(
        column(&d.batch, "amount")
            .as_primitive::<Int64Type>()
            .values(),
        &[1, 3]
    );
    let records: Vec<&str> = d.rejected.iter().map(|l| l.record.as_str()).collect();
    assert_eq!(records, ["1", "3"]);
    let reason = &d.rejected[0].reason;
    assert!(
        reason.contains("writer schema id 3 is incompatible with the reader's `shop.Click`: field 2 `amount`: string in the writer, int64 in the reader"),
        "{reason}"
    );
    // id 1 and id 3, each fetched once.
    assert_eq!(registry.lookups.load(Ordering::SeqCst), 2);
}

#[test]
fn writers_that_are_not_protobuf_or_unknown_are_rejected_by_id() {
    let registry = registry();
    let v1 = writer_message(CLICKS, "shop.Click");
    let m = full_click(&v1, "a", 1);
    let lookup: Arc<dyn SchemaLookup> = registry.clone();
    let decoder =
        ProtobufDecoder::new(reader("shop.Click"), ProtoFraming::Confluent, Some(lookup)).unwrap();
    let d = decode(
        &decoder,
        &[
            framed(4, &[0], &m),
            framed(99, &[0], &m),
            framed(1, &[6, 0, 0, 0], &m),
        ],
    );
    assert!(d.kept.is_empty());
    let reasons: Vec<&str> = d.rejected.iter().map(|l| l.reason.as_str()).collect();
    assert!(
        reasons[0].contains("writer schema id 4 is a AVRO schema, not PROTOBUF"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("writer schema id 99") && reasons[1].contains("no schema with id 99"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].contains("[0, 0, 0] name no message"),
        "{reasons:?}"
    );
}

#[test]
fn an_unreachable_registry_stops_the_call_and_is_asked_again_on_the_next() {
    let registry = registry();
    registry.down.store(true, Ordering::SeqCst);
    let v1 = writer_message(CLICKS, "shop.Click");
    let m = framed(1, &[0], &full_click(&v1, "a", 1));
    let lookup: Arc<dyn SchemaLookup> = registry.clone();
    let decoder =
        ProtobufDecoder::new(reader("shop.Click"), ProtoFraming::Confluent, Some(lookup)).unwrap();
    let refs: Vec<&[u8]> = vec![&m, &m, &m];
    // Good messages are not dead letters because the registry is down: the batch fails.
    let error = decoder
        .decode_or_reject(&refs, |_, _| {
            unreachable!("no dead letter while the registry is down")
        })
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("writer schema id 1") && error.contains("connection refused"),
        "{error}"
    );
    assert_eq!(
        registry.lookups.load(Ordering::SeqCst),
        1,
        "one lookup per call"
    );
    registry.down.store(false, Ordering::SeqCst);
    let d = decode(&decoder, &[m.clone(), m]);
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert_eq!(d.batch.num_rows(), 2);
}

#[test]
fn garbage_is_rejected_and_the_rest_kept() {
    let reader = reader("shop.Click");
    let desc = reader.descriptor().clone();
    let good = full_click(&desc, "a", 1).encode_to_vec();
    let plain = ProtobufDecoder::new(reader.clone(), ProtoFraming::Plain, None).unwrap();
    let d = decode(&plain, &[good.clone(), vec![0xff; 7], good.clone()]);
    assert_eq!(d.kept, [0, 2]);
    assert_eq!(d.batch.num_rows(), 2);
    assert_eq!(d.rejected.len(), 1);
    assert!(
        d.rejected[0].reason.contains("not a `shop.Click` message"),
        "{}",
        d.rejected[0].reason
    );
    assert_eq!(d.rejected[0].record, "1");

    let confluent = ProtobufDecoder::new(reader, ProtoFraming::Confluent, None).unwrap();
    let mut ok = wire::prefix(1).to_vec();
    ok.push(0);
    ok.extend(&good);
    let d = decode(
        &confluent,
        &[
            b"{\"a\":1}".to_vec(),
            ok,
            vec![0, 0, 0],
            vec![0, 0, 0, 0, 1],
        ],
    );
    assert_eq!(d.kept, [1]);
    let reasons: Vec<&str> = d.rejected.iter().map(|l| l.reason.as_str()).collect();
    assert!(reasons[0].contains("0x7b"), "{reasons:?}");
    assert!(reasons[1].contains("shorter"), "{reasons:?}");
    assert!(reasons[2].contains("framing"), "{reasons:?}");

    // Values out of a column's range reject their payload alone.
    let mut far = DynamicMessage::new(desc.clone());
    let mut at = DynamicMessage::new(sub(&desc, "at"));
    at.set_field_by_name("seconds", Value::I64(i64::MAX / 10));
    far.set_field_by_name("at", Value::Message(at));
    let d = decode(&plain, &[good.clone(), far.encode_to_vec(), good]);
    assert_eq!(d.kept, [0, 2]);
    assert!(
        d.rejected[0].reason.contains("field `at`: Timestamp"),
        "{}",
        d.rejected[0].reason
    );
}

#[test]
fn encoded_rows_decode_back_to_the_same_rows() {
    let reader = reader("shop.Click");
    let desc = reader.descriptor().clone();
    let mut sparse = DynamicMessage::new(desc.clone());
    sparse.set_field_by_name("user", Value::String("sparse".into()));
    let payloads = vec![
        full_click(&desc, "ann", 42).encode_to_vec(),
        Vec::new(),
        sparse.encode_to_vec(),
        full_click(&desc, "bob", -1).encode_to_vec(),
    ];
    let plain = ProtobufDecoder::new(reader.clone(), ProtoFraming::Plain, None).unwrap();
    let original = decode(&plain, &payloads).batch;
    let mut encoder = ProtobufEncoder::new(&original.schema(), reader.clone()).unwrap();

    let encoded = encoder.encode(&original, EncodeFraming::Plain).unwrap();
    let again = decode(
        &plain,
        &encoded.iter().map(|b| b.to_vec()).collect::<Vec<_>>(),
    );
    assert!(again.rejected.is_empty());
    assert_eq!(again.batch, original);

    let framed = encoder
        .encode(&original, EncodeFraming::Confluent(1))
        .unwrap();
    assert_eq!(&framed[0][..6], &[0, 0, 0, 0, 1, 0]);
    let registry = registry();
    let lookup: Arc<dyn SchemaLookup> = registry.clone();
    let confluent = ProtobufDecoder::new(reader, ProtoFraming::Confluent, Some(lookup)).unwrap();
    let again = decode(
        &confluent,
        &framed.iter().map(|b| b.to_vec()).collect::<Vec<_>>(),
    );
    assert!(again.rejected.is_empty(), "{:?}", again.rejected);
    assert_eq!(again.batch, original);

    // A nested message's framing carries its path.
    let refund = reader_refund_payload();
    assert_eq!(&refund[5..7], &[2, 2]);
}

fn reader_refund_payload() -> bytes::Bytes {
    let schema = Arc::new(Schema::new(vec![Field::new("user", DataType::Utf8, false)]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(vec!["u"]))]).unwrap();
    let mut encoder = ProtobufEncoder::new(&schema, reader("shop.Refund")).unwrap();
    encoder
        .encode(&batch, EncodeFraming::Confluent(1))
        .unwrap()
        .remove(0)
}

#[test]
fn the_encoder_takes_columns_by_name_and_checks_their_types() {
    let reader = reader("shop.Click");
    let e = ProtobufEncoder::new(
        &Schema::new(vec![Field::new("nope", DataType::Utf8, true)]),
        reader.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("column `nope`")
            && e.contains("has no field of this name; it has: user, amount"),
        "{e}"
    );
    let e = ProtobufEncoder::new(
        &Schema::new(vec![Field::new("amount", DataType::Utf8, true)]),
        reader.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("column `amount`") && e.contains("expects an integer type, found Utf8"),
        "{e}"
    );
    let e = ProtobufEncoder::new(
        &Schema::new(vec![Field::new(
            "item",
            DataType::Struct(vec![Field::new("colour", DataType::Utf8, true)].into()),
            true,
        )]),
        reader.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("column `item.colour`"), "{e}");

    // Other types that fit, a subset of the fields; the rest stay unset.
    let schema = Arc::new(Schema::new(vec![
        Field::new("amount", DataType::Int32, true),
        Field::new("kind", DataType::Utf8, true),
        Field::new("at", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        Field::new("discount", DataType::Int64, true),
        Field::new("score", DataType::Int16, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int32Array::from(vec![Some(7), None])),
            Arc::new(StringArray::from(vec![Some("VIEW"), None])),
            Arc::new(arrow_array::TimestampNanosecondArray::from(vec![
                Some(-1_500),
                None,
            ])),
            Arc::new(Int64Array::from(vec![Some(3), None])),
            Arc::new(arrow_array::Int16Array::from(vec![None, Some(4)])),
        ],
    )
    .unwrap();
    let mut encoder = ProtobufEncoder::new(&schema, reader.clone()).unwrap();
    let payloads = encoder.encode(&batch, EncodeFraming::Plain).unwrap();
    let decoder = ProtobufDecoder::new(reader.clone(), ProtoFraming::Plain, None).unwrap();
    let d = decode(
        &decoder,
        &payloads.iter().map(|b| b.to_vec()).collect::<Vec<_>>(),
    );
    let b = &d.batch;
    assert_eq!(
        column(b, "amount").as_primitive::<Int64Type>().values(),
        &[7, 0]
    );
    let kind = column(b, "kind").as_string::<i32>();
    assert_eq!((kind.value(0), kind.value(1)), ("VIEW", "KIND_UNSPECIFIED"));
    let at = column(b, "at").as_primitive::<TimestampMicrosecondType>();
    assert_eq!(
        at.value(0),
        -2,
        "-1500 ns is 1 µs and 500 ns before the epoch: floor"
    );
    assert!(at.is_null(1));
    let discount = column(b, "discount").as_primitive::<Int32Type>();
    assert!(discount.value(0) == 3 && discount.is_null(1));
    let score = column(b, "score").as_primitive::<Int64Type>();
    assert!(score.is_null(0) && score.value(1) == 4);
    assert_eq!(column(b, "user").as_string::<i32>().value(0), "");

    // Values that do not fit: an error naming the column.
    let bad = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int32Array::from(vec![Some(7), None])),
            Arc::new(StringArray::from(vec![Some("SELL"), None])),
            Arc::new(arrow_array::TimestampNanosecondArray::from(vec![
                None, None,
            ])),
            Arc::new(Int64Array::from(vec![Some(i64::MAX), None])),
            Arc::new(arrow_array::Int16Array::from(vec![None, None])),
        ],
    )
    .unwrap();
    let e = encoder
        .encode(&bad, EncodeFraming::Plain)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column `kind`") && e.contains("`SELL` is not a value of enum shop.Click.Kind"),
        "{e}"
    );
    let bad = RecordBatch::try_new(
        schema.clone(),
        vec![
            bad.column(0).clone(),
            Arc::new(StringArray::from(vec![Some("BUY"), None])),
            bad.column(2).clone(),
            bad.column(3).clone(),
            bad.column(4).clone(),
        ],
    )
    .unwrap();
    let e = encoder
        .encode(&bad, EncodeFraming::Plain)
        .unwrap_err()
        .to_string();
    assert!(e.contains("column `discount`"), "{e}");
}

#[test]
fn a_descriptor_set_file_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_clicks(dir.path());
    let mut compiler = protox::Compiler::new([dir.path()]).unwrap();
    compiler.include_imports(true);
    compiler.open_file("clicks.proto").unwrap();
    let set = dir.path().join("clicks.desc");
    std::fs::write(&set, compiler.encode_file_descriptor_set()).unwrap();

    let from_set = ProtoSchema::from_descriptor_set(&set, "shop.Click").unwrap();
    let from_file = ProtoSchema::from_proto_file(&path, &[], "shop.Click").unwrap();
    assert_eq!(from_set.arrow_schema(), from_file.arrow_schema());
    assert_eq!(from_set.message_indexes(), [0]);
    assert!(from_set.proto_text().is_none());
    assert_eq!(
        ProtoSchema::from_descriptor_set(&set, "Refund")
            .unwrap()
            .message_indexes(),
        [1]
    );
    let e = ProtoSchema::from_descriptor_set(&set, "Nope")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("clicks.desc; it defines: shop.Click") && !e.contains("google"),
        "{e}"
    );

    // Without its imports, and not a descriptor set at all.
    let pool = from_file.descriptor().parent_pool().clone();
    let main = pool.get_file_by_name("clicks.proto").unwrap();
    let alone = dir.path().join("alone.desc");
    let set_without_imports = prost_types_file_set(main.encode_to_vec());
    std::fs::write(&alone, set_without_imports).unwrap();
    let e = ProtoSchema::from_descriptor_set(&alone, "shop.Click")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("alone.desc") && e.contains("--include_imports"),
        "{e}"
    );
    let text = dir.path().join("text.desc");
    std::fs::write(&text, "hello").unwrap();
    let e = ProtoSchema::from_descriptor_set(&text, "shop.Click")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("text.desc") && e.contains("FileDescriptorSet"),
        "{e}"
    );
}

/// A FileDescriptorSet holding one encoded FileDescriptorProto (field 1, length-delimited).
fn prost_types_file_set(file: Vec<u8>) -> Vec<u8> {
    let mut out = vec![0x0a];
    prost::encoding::encode_varint(file.len() as u64, &mut out);
    out.extend(file);
    out
}

const BENCH: &str = r#"
syntax = "proto3";
package bench;
message Event {
  enum Level { DEBUG = 0; INFO = 1; WARN = 2; }
  string id = 1;
  int64 ts = 2;
  int32 count = 3;
  double score = 4;
  bool ok = 5;
  string name = 6;
  Level level = 7;
  uint64 big = 8;
  float ratio = 9;
  string tag = 10;
}
"#;

/// Compares decoding routes on a 10-field message: prost-reflect alone (the floor), this
/// decoder (straight into builders), and arrow-json's `Decoder::serialize` over prost-reflect's
/// serde. `cargo test --release -p riffle-connectors --lib protobuf::tests::decoding_routes -- --ignored --nocapture`
#[test]
#[ignore = "benchmark: run by hand, in release"]
fn decoding_routes_benchmark() {
    use std::time::Instant;
    let schema =
        ProtoSchema::from_registered(&registered(1, SchemaType::Protobuf, BENCH), &[], None)
            .unwrap();
    let desc = schema.descriptor().clone();
    let n = 50_000;
    let payloads: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut m = DynamicMessage::new(desc.clone());
            m.set_field_by_name("id", Value::String(format!("evt-{i:08}")));
            m.set_field_by_name("ts", Value::I64(1_700_000_000_000 + i as i64));
            m.set_field_by_name("count", Value::I32(i as i32 % 1000));
            m.set_field_by_name("score", Value::F64(i as f64 * 0.5));
            m.set_field_by_name("ok", Value::Bool(i % 2 == 0));
            m.set_field_by_name("name", Value::String("some-service-name".into()));
            m.set_field_by_name("level", Value::EnumNumber((i % 3) as i32));
            m.set_field_by_name("big", Value::U64(u64::MAX - i as u64));
            m.set_field_by_name("ratio", Value::F32(0.75));
            m.set_field_by_name("tag", Value::String("eu-west".into()));
            m.encode_to_vec()
        })
        .collect();
    let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let decoder = ProtobufDecoder::new(schema.clone(), ProtoFraming::Plain, None).unwrap();
    let rounds = 5;
    let time = |label: &str, f: &mut dyn FnMut() -> usize| {
        let mut best = f64::MAX;
        for _ in 0..rounds {
            let start = Instant::now();
            assert_eq!(f(), n);
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!(
            "{label:<44} {:>8.1} ms  {:>6.0} k msg/s",
            best * 1e3,
            n as f64 / best / 1e3
        );
    };
    time("prost-reflect decode only", &mut || {
        slices.iter().fold(0, |n, p| {
            std::hint::black_box(DynamicMessage::decode(desc.clone(), *p).unwrap());
            n + 1
        })
    });
    time("ProtobufDecoder (builders)", &mut || {
        decoder
            .decode_or_reject(&slices, letter)
            .unwrap()
            .batch
            .num_rows()
    });
    struct Row<'a>(&'a DynamicMessage, &'a prost_reflect::SerializeOptions);
    impl serde::Serialize for Row<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.0.serialize_with_options(s, self.1)
        }
    }
    let options = prost_reflect::SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    time("arrow-json Decoder::serialize (serde)", &mut || {
        let messages: Vec<DynamicMessage> = slices
            .iter()
            .map(|p| DynamicMessage::decode(desc.clone(), *p).unwrap())
            .collect();
        let rows: Vec<Row> = messages.iter().map(|m| Row(m, &options)).collect();
        let mut json = arrow_json::ReaderBuilder::new(schema.arrow_schema())
            .with_batch_size(n)
            .build_decoder()
            .unwrap();
        json.serialize(&rows).unwrap();
        json.flush().unwrap().unwrap().num_rows()
    });
    // Same rows both ways.
    let ours = decoder
        .decode_or_reject(&slices[..100], letter)
        .unwrap()
        .batch;
    let messages: Vec<DynamicMessage> = slices[..100]
        .iter()
        .map(|p| DynamicMessage::decode(desc.clone(), *p).unwrap())
        .collect();
    let rows: Vec<Row> = messages.iter().map(|m| Row(m, &options)).collect();
    let mut json = arrow_json::ReaderBuilder::new(schema.arrow_schema())
        .build_decoder()
        .unwrap();
    json.serialize(&rows).unwrap();
    assert_eq!(json.flush().unwrap().unwrap(), ours);
}
