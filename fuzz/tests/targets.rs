//! Fuzz targets for everything Riffle reads from outside: pipeline files, JSON and CSV records
//! (file lines and Kafka messages), Avro and Protobuf messages, encoded images and checkpoint
//! files.
//!
//! Under `cargo test` each target replays its seed corpus (`tests/__fuzz__/<target>/corpus`)
//! and then random inputs for `RIFFLE_FUZZ_SECONDS` (default 10) seconds. With nightly and
//! `cargo install cargo-bolero`, `cargo bolero test -p riffle-fuzz <target>` fuzzes it with
//! libFuzzer's coverage guidance. What each asserts: no panic, and every input accounted for
//! (a result row or a dead letter with a reason; a checkpoint used or skipped).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
use arrow_schema::SchemaRef;
use riffle_connectors::formats::{json, Decoder, Framing, TextFormat};
use riffle_dataflow::checkpoint::CheckpointStore;
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::Stage;
use riffle_operators::vision::decode::{Decode, DecodeConfig};

fn budget() -> Duration {
    let seconds = std::env::var("RIFFLE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(seconds)
}

/// Inputs up to this size: enough for a pipeline file or a small image, fast to run.
const MAX_LEN: usize = 64 * 1024;

#[test]
fn pipeline_file() {
    // Beside the shipped pipelines, so that a seed's `../models/...` resolves and validation
    // goes past the paths into model signatures and column types.
    let pipelines = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipelines");
    let named = tempfile::Builder::new()
        .prefix(".fuzz-")
        .suffix(".yaml")
        .tempfile_in(&pipelines)
        .unwrap();
    let file = named.path().to_path_buf();
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            std::fs::write(&file, bytes).unwrap();
            // Ok or an error naming the file: never a panic.
            if let Err(e) = riffle_pipelines::load(&file, None) {
                assert_eq!(e.file, file, "{e}");
                assert!(!e.message.is_empty());
                // An excerpt of what was read, never the whole input.
                assert!(e.message.len() <= 1100 && e.field.len() <= 300, "{e}");
            }
        });
}

fn clicks_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let samples: [&[u8]; 2] = [
                br#"{"user_id": 7, "item_id": "a1", "score": 0.5, "tags": ["x"], "at": "2026-11-30T10:00:00Z"}"#,
                br#"{"user_id": 8, "item_id": "b2", "score": 1, "tags": [], "at": "2026-11-30T10:00:01Z"}"#,
            ];
            Arc::new(json::infer_schema(samples).unwrap())
        })
        .clone()
}

/// Decodes each line of `bytes` as one record; every record is a row or a dead letter (blank
/// lines of a file are no record).
fn records(format: TextFormat, framing: Framing, schema: SchemaRef, bytes: &[u8]) {
    let payloads: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let decoder = Decoder::new(format, framing, schema);
    let decoded = decoder
        .decode_or_reject(&payloads, |i, e| DeadLetter {
            stage: "source".into(),
            reason: e.to_string(),
            record: i.to_string(),
        })
        .unwrap();
    // A message is one row; a file's line may hold several records, or none when blank.
    if framing == Framing::Message {
        assert_eq!(decoded.batch.num_rows(), decoded.kept.len());
    }
    assert!(decoded.rejected.iter().all(|d| !d.reason.is_empty()));
    let rejected: Vec<usize> = decoded
        .rejected
        .iter()
        .map(|d| d.record.parse().unwrap())
        .collect();
    for (i, payload) in payloads.iter().enumerate() {
        let blank = payload.iter().all(u8::is_ascii_whitespace);
        let accounted = decoded.kept.contains(&i) || rejected.contains(&i);
        match framing {
            Framing::Message => assert!(accounted, "message {i} is a row or a dead letter"),
            Framing::FileRecord => {
                assert!(accounted || blank, "line {i} is a row or a dead letter")
            }
        }
    }
}

#[test]
fn json_records() {
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            records(
                TextFormat::Json,
                Framing::FileRecord,
                clicks_schema(),
                bytes,
            )
        });
}

#[test]
fn csv_records() {
    let header = "user_id,item_id,score,at\n7,a1,0.5,2026-11-30T10:00:00Z\n8,b2,1.5,x\n";
    let schema = Arc::new(
        riffle_connectors::formats::csv::infer_schema(header.as_bytes(), true, b',', 10).unwrap(),
    );
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            records(
                TextFormat::Csv { delimiter: b',' },
                Framing::FileRecord,
                schema.clone(),
                bytes,
            )
        });
}

#[test]
fn kafka_messages() {
    // A Kafka message holds exactly one record: anything more or less is a dead letter.
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            records(TextFormat::Json, Framing::Message, clicks_schema(), bytes)
        });
}

#[test]
fn images() {
    let mut decode = Decode::new(DecodeConfig::default());
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let batch = RecordBatch::try_from_iter(vec![
                ("frame", Arc::new(Int64Array::from(vec![0, 1])) as ArrayRef),
                (
                    "bytes",
                    Arc::new(BinaryArray::from(vec![bytes, &bytes[..bytes.len() / 2]])) as _,
                ),
            ])
            .unwrap();
            let out = decode.process_batch(&batch).unwrap();
            assert_eq!(
                out.records.num_rows() + out.rejected.len(),
                2,
                "each image is a frame or a dead letter"
            );
        });
}

#[test]
fn checkpoint_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path(), 3).unwrap();
    let path = dir.path().join("epoch-000000000001.ckpt");
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            // As written (almost always torn or corrupt: skipped), and with a valid checksum
            // so that the body itself is parsed.
            std::fs::write(&path, bytes).unwrap();
            assert!(store.latest().is_ok());
            let mut sealed = bytes.to_vec();
            sealed
                .extend_from_slice(format!("\n#crc32:{:08x}\n", crc32fast::hash(bytes)).as_bytes());
            std::fs::write(&path, sealed).unwrap();
            if let Ok(Some(checkpoint)) = store.latest() {
                assert_eq!(checkpoint.epoch, 1, "the body's epoch names its file");
            }
        });
}

/// An Avro reader schema with every kind of length-prefixed value (strings, bytes, arrays,
/// maps) and unions, where a malformed length is most likely to hurt.
const AVRO_CLICK: &str = r#"{"type": "record", "name": "Click", "fields": [
  {"name": "user_id", "type": "long"},
  {"name": "page", "type": "string"},
  {"name": "items", "type": {"type": "array", "items": "int"}},
  {"name": "attrs", "type": {"type": "map", "values": "string"}},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "blob", "type": "bytes"},
  {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "BUY"]}}]}"#;

/// Every message (a line of the input; the first byte of the input picks the framing) is a
/// row or a dead letter with a reason, and decoding never panics or aborts.
fn schemaful_messages(
    bytes: &[u8],
    decode: &dyn Fn(&[&[u8]]) -> riffle_connectors::formats::Decoded,
) {
    let payloads: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let decoded = decode(&payloads);
    assert_eq!(decoded.batch.num_rows(), decoded.kept.len());
    assert!(decoded.rejected.iter().all(|d| !d.reason.is_empty()));
    let rejected: Vec<usize> = decoded
        .rejected
        .iter()
        .map(|d| d.record.parse().unwrap())
        .collect();
    for i in 0..payloads.len() {
        assert!(
            decoded.kept.contains(&i) || rejected.contains(&i),
            "message {i} is a row or a dead letter"
        );
    }
}

fn letter(i: usize, reason: &str) -> DeadLetter {
    DeadLetter {
        stage: "source".into(),
        reason: reason.to_string(),
        record: i.to_string(),
    }
}

#[test]
fn avro_messages() {
    use riffle_connectors::formats::avro::{AvroDecoder, AvroFraming};
    use riffle_connectors::schema_registry::{RegisteredSchema, SchemaType, StaticSchemas};
    let schemas = StaticSchemas(
        [(
            1,
            Arc::new(RegisteredSchema {
                id: 1,
                schema_type: SchemaType::Avro,
                schema: AVRO_CLICK.to_string(),
                references: Vec::new(),
                subject: None,
                version: None,
            }),
        )]
        .into(),
    );
    // A panic fails the target: the decoders' state is not looked at after one.
    let decoders = AssertUnwindSafe((
        AvroDecoder::new(AVRO_CLICK, AvroFraming::Plain, None).unwrap(),
        AvroDecoder::new(AVRO_CLICK, AvroFraming::Confluent, Some(Arc::new(schemas))).unwrap(),
    ));
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let (plain, framed) = &*decoders;
            let decoder = if bytes.first().is_some_and(|b| b % 2 == 0) {
                plain
            } else {
                framed
            };
            schemaful_messages(bytes, &|payloads| {
                decoder.decode_or_reject(payloads, letter).unwrap()
            });
        });
}

#[test]
fn protobuf_messages() {
    use riffle_connectors::formats::protobuf::{ProtoFraming, ProtoSchema, ProtobufDecoder};
    let dir = tempfile::tempdir().unwrap();
    let proto = dir.path().join("click.proto");
    std::fs::write(
        &proto,
        r#"syntax = "proto3";
package fuzz;
import "google/protobuf/timestamp.proto";
message Click {
  int64 user_id = 1;
  string page = 2;
  repeated int32 items = 3;
  map<string, string> attrs = 4;
  optional string note = 5;
  bytes blob = 6;
  enum Kind { VIEW = 0; BUY = 1; }
  Kind kind = 7;
  Device device = 8;
  google.protobuf.Timestamp at = 9;
}
message Device { string os = 1; repeated Device parts_unused = 2; }
"#,
    )
    .unwrap();
    // Recursive messages are refused when the schema is built: a flat one is fuzzed.
    let schema = ProtoSchema::from_proto_file(&proto, &[], "fuzz.Click");
    let schema = match schema {
        Ok(s) => s,
        Err(_) => {
            std::fs::write(
                &proto,
                std::fs::read_to_string(&proto)
                    .unwrap()
                    .replace(" repeated Device parts_unused = 2;", ""),
            )
            .unwrap();
            ProtoSchema::from_proto_file(&proto, &[], "fuzz.Click").unwrap()
        }
    };
    let decoders = AssertUnwindSafe((
        ProtobufDecoder::new(schema.clone(), ProtoFraming::Plain, None).unwrap(),
        ProtobufDecoder::new(schema, ProtoFraming::Confluent, None).unwrap(),
    ));
    bolero::check!()
        .with_test_time(budget())
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let (plain, framed) = &*decoders;
            let decoder = if bytes.first().is_some_and(|b| b % 2 == 0) {
                plain
            } else {
                framed
            };
            schemaful_messages(bytes, &|payloads| {
                decoder.decode_or_reject(payloads, letter).unwrap()
            });
        });
}
