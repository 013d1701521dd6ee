//! Kafka source and sink against librdkafka's in-process mock cluster.
#![cfg(feature = "kafka")]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, BinaryArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use riffle_connectors::kafka::{
    KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig, KafkaSourceFactory,
};
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{SourceBatch, SourceFactory};
use serde_json::{json, Value};

type Cluster = MockCluster<'static, DefaultProducerContext>;

fn cluster(topic: &str, partitions: i32) -> (Cluster, String) {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(topic, partitions, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    (cluster, brokers)
}

/// One message to produce.
#[derive(Default)]
struct Msg<'a> {
    partition: i32,
    key: Option<&'a str>,
    value: Option<&'a [u8]>,
    headers: &'a [(&'a str, &'a str)],
}

fn produce(brokers: &str, topic: &str, messages: &[Msg<'_>]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    for m in messages {
        let mut record = BaseRecord::<str, [u8]>::to(topic).partition(m.partition);
        if let Some(key) = m.key {
            record = record.key(key);
        }
        if let Some(value) = m.value {
            record = record.payload(value);
        }
        if !m.headers.is_empty() {
            let mut headers = OwnedHeaders::new();
            for (k, v) in m.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            record = record.headers(headers);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

fn source_config(value: Value) -> KafkaSourceConfig {
    serde_json::from_value(value).unwrap()
}

/// Every batch of one worker's partition until it ends (fails instead of hanging).
fn drain(factory: &KafkaSourceFactory, index: usize, peers: usize) -> Vec<SourceBatch> {
    let mut source = factory.partition(index, peers).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut batches = Vec::new();
    while let Some(batch) = source.next_batch().unwrap() {
        assert_eq!(batch.records.schema(), factory.schema().unwrap());
        batches.push(batch);
        assert!(Instant::now() < deadline, "source did not reach its end");
    }
    batches
}

fn concat(batches: &[SourceBatch]) -> RecordBatch {
    let records: Vec<RecordBatch> = batches.iter().map(|b| b.records.clone()).collect();
    arrow_select::concat::concat_batches(&records[0].schema(), &records).unwrap()
}

fn strings(batch: &RecordBatch, column: &str) -> Vec<Option<String>> {
    let col = batch.column_by_name(column).unwrap().as_string::<i32>();
    col.iter().map(|v| v.map(str::to_string)).collect()
}

fn ints(batch: &RecordBatch, column: &str) -> Vec<Option<i64>> {
    let col = batch
        .column_by_name(column)
        .unwrap()
        .as_primitive::<Int64Type>();
    col.iter().collect()
}

/// Offsets covered by the batches' positions, per partition; panics on overlaps.
fn covered(batches: &[SourceBatch]) -> BTreeMap<i32, BTreeSet<i64>> {
    let mut out: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
    for batch in batches {
        for p in &batch.positions {
            assert!(p.first_offset <= p.last_offset, "{p:?}");
            let set = out.entry(p.partition).or_default();
            for o in p.first_offset..=p.last_offset {
                assert!(
                    set.insert(o),
                    "offset {o} of partition {} twice",
                    p.partition
                );
            }
        }
    }
    out
}

#[test]
fn json_over_two_workers_reads_every_message_once() {
    let topic = "json-three";
    let (_cluster, brokers) = cluster(topic, 3);
    let values: Vec<String> = (0..30)
        .map(|i| json!({"id": i, "name": format!("n{i}")}).to_string())
        .collect();
    let keys: Vec<String> = (0..30).map(|i| format!("k{}", i % 10)).collect();
    let messages: Vec<Msg> = (0..30)
        .map(|i| Msg {
            partition: i as i32 % 3,
            key: Some(&keys[i]),
            value: Some(values[i].as_bytes()),
            ..Msg::default()
        })
        .collect();
    produce(&brokers, topic, &messages);

    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "json", "key": "key",
        "stop_at_end": true, "batch_size": 4, "linger_ms": 50,
    })))
    .unwrap();
    let metrics = Metrics::new().unwrap();
    factory.attach_metrics(&metrics).unwrap();
    factory.attach_metrics(&metrics).unwrap();
    assert_eq!(factory.partitions(), [0, 1, 2]);
    let schema = factory.schema().unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "name", "key"]);
    assert_eq!(schema.field(0).data_type(), &DataType::Int64);

    let first = drain(&factory, 0, 2);
    let second = drain(&factory, 1, 2);
    // Worker 0 owns partitions 0 and 2 (positions 0 and 2), worker 1 partition 1.
    assert_eq!(covered(&first).keys().copied().collect::<Vec<_>>(), [0, 2]);
    assert_eq!(covered(&second).keys().copied().collect::<Vec<_>>(), [1]);
    let mut all = first;
    all.extend(second);
    assert!(all.iter().all(|b| b.rejected.is_empty()));
    assert!(all.iter().all(|b| b.records.num_rows() <= 4));
    let batch = concat(&all);
    let ids = ints(&batch, "id");
    let keys = strings(&batch, "key");
    let names = strings(&batch, "name");
    let mut seen = BTreeMap::new();
    for row in 0..batch.num_rows() {
        let id = ids[row].unwrap();
        assert_eq!(keys[row].as_deref(), Some(format!("k{}", id % 10).as_str()));
        assert_eq!(names[row].as_deref(), Some(format!("n{id}").as_str()));
        assert!(seen.insert(id, ()).is_none(), "id {id} read twice");
    }
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (0..30).collect::<Vec<_>>()
    );
    // Ten messages per partition, at offsets 0..=9.
    let expected: BTreeMap<i32, BTreeSet<i64>> = (0..3).map(|p| (p, (0..10).collect())).collect();
    assert_eq!(covered(&all), expected);

    let text = metrics.render_prometheus().unwrap();
    assert!(
        text.contains(&format!(
            "riffle_kafka_records_in_total{{topic=\"{topic}\"}} 30"
        )),
        "{text}"
    );
}

#[test]
fn bad_json_is_rejected_with_its_partition_and_offset() {
    let topic = "json-bad";
    let (_cluster, brokers) = cluster(topic, 1);
    let values: [&[u8]; 5] = [
        br#"{"id": 1, "ok": true}"#,
        b"{not json",
        br#"{"id": 3, "ok": false}"#,
        br#"{"id": "three"}"#,
        br#"{"id": 5}"#,
    ];
    let messages: Vec<Msg> = values
        .iter()
        .map(|v| Msg {
            value: Some(v),
            ..Msg::default()
        })
        .collect();
    produce(&brokers, topic, &messages);

    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "json", "stop_at_end": true,
        "schema": {"id": "int64", "ok": "bool?"},
    })))
    .unwrap();
    let batches = drain(&factory, 0, 1);
    let batch = concat(&batches);
    assert_eq!(ints(&batch, "id"), [Some(1), Some(3), Some(5)]);
    let ok = batch.column_by_name("ok").unwrap().as_boolean();
    assert_eq!(
        ok.iter().collect::<Vec<_>>(),
        [Some(true), Some(false), None]
    );
    let rejected: Vec<_> = batches.iter().flat_map(|b| b.rejected.clone()).collect();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    for (letter, offset) in rejected.iter().zip([1, 3]) {
        assert_eq!(letter.stage, "source");
        assert!(!letter.reason.is_empty());
        let record: Value = serde_json::from_str(&letter.record).unwrap();
        assert_eq!(
            record,
            json!({"topic": topic, "partition": 0, "offset": offset})
        );
    }
    assert_eq!(covered(&batches)[&0], (0..5).collect::<BTreeSet<i64>>());
}

#[test]
fn start_offsets_and_latest() {
    let topic = "starts";
    let (_cluster, brokers) = cluster(topic, 2);
    let values: Vec<String> = (0..10).map(|i| json!({"id": i}).to_string()).collect();
    let messages: Vec<Msg> = (0..10)
        .map(|i| Msg {
            partition: i as i32 % 2,
            value: Some(values[i].as_bytes()),
            ..Msg::default()
        })
        .collect();
    produce(&brokers, topic, &messages);

    // Partition 0 (ids 0,2,4,6,8) from offset 2; partition 1 from its beginning.
    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "json", "stop_at_end": true,
        "start": {"offsets": {"0": 2}},
    })))
    .unwrap();
    let batches = drain(&factory, 0, 1);
    let mut ids: Vec<i64> = ints(&concat(&batches), "id")
        .into_iter()
        .flatten()
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(covered(&batches)[&0], (2..5).collect::<BTreeSet<i64>>());

    // Latest with stop_at_end: nothing to read, and it ends at once.
    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "json", "stop_at_end": true,
        "start": "latest",
    })))
    .unwrap();
    let started = Instant::now();
    let batches = drain(&factory, 0, 1);
    assert!(batches.iter().all(|b| b.records.num_rows() == 0));
    assert!(started.elapsed() < Duration::from_secs(5));

    // More workers than partitions: the idle worker ends at once too.
    let batches = drain(&factory, 2, 3);
    assert!(batches.is_empty());
}

#[test]
fn resume_starts_at_checkpointed_offsets_with_the_same_columns() {
    let topic = "resumes";
    let (_cluster, brokers) = cluster(topic, 2);
    let values: Vec<String> = (0..10).map(|i| json!({"id": i}).to_string()).collect();
    let messages: Vec<Msg> = (0..10)
        .map(|i| Msg {
            partition: i as i32 % 2,
            value: Some(values[i].as_bytes()),
            ..Msg::default()
        })
        .collect();
    produce(&brokers, topic, &messages);
    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "json", "stop_at_end": true,
    })))
    .unwrap();

    // Partition 0 (ids 0,2,4,6,8) from offset 3, partition 1 (ids 1,3,...) from offset 4.
    let resumed = factory
        .resume(&BTreeMap::from([(0, 3), (1, 4)]))
        .unwrap()
        .expect("a Kafka source resumes");
    assert_eq!(resumed.schema().unwrap(), factory.schema().unwrap());
    assert_eq!(resumed.checkpoint_id(), factory.checkpoint_id());
    let mut source = resumed.partition(0, 1).unwrap();
    let mut batches = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(batch) = source.next_batch().unwrap() {
        batches.push(batch);
        assert!(Instant::now() < deadline, "source did not reach its end");
    }
    let mut ids: Vec<i64> = ints(&concat(&batches), "id")
        .into_iter()
        .flatten()
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [6, 8, 9]);

    // Offsets of partitions the topic does not have are a configuration error.
    assert!(factory.resume(&BTreeMap::from([(7, 0)])).is_err());
    assert!(factory.resume(&BTreeMap::from([(0, -1)])).is_err());
}

#[test]
fn empty_topic_needs_a_schema_but_ends_when_declared() {
    let topic = "empty";
    let (_cluster, brokers) = cluster(topic, 2);
    let err = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "json", "stop_at_end": true,
    })))
    .unwrap_err();
    assert!(err.to_string().contains("schema:"), "{err}");
    assert!(err.to_string().contains(topic), "{err}");

    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "csv", "stop_at_end": true,
        "schema": {"a": "int64", "b": "string"},
    })))
    .unwrap();
    let started = Instant::now();
    let batches = drain(&factory, 0, 1);
    assert!(batches.iter().all(|b| b.records.num_rows() == 0));
    assert!(started.elapsed() < Duration::from_secs(5));

    let err = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": "no-such-topic", "format": "raw",
    })))
    .unwrap_err();
    assert!(err.to_string().contains("no-such-topic"), "{err}");
}

#[test]
fn csv_messages_decode_and_bad_ones_are_rejected() {
    let topic = "csv";
    let (_cluster, brokers) = cluster(topic, 1);
    let values: [&[u8]; 4] = [b"1,x\n", b"2,y", b"oops,z", b"4,\"w\""];
    let messages: Vec<Msg> = values
        .iter()
        .map(|v| Msg {
            value: Some(v),
            key: Some("k"),
            ..Msg::default()
        })
        .collect();
    produce(&brokers, topic, &messages);
    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "csv", "stop_at_end": true,
        "schema": {"a": "int64", "b": "string"}, "key": "k",
    })))
    .unwrap();
    let batches = drain(&factory, 0, 1);
    let batch = concat(&batches);
    assert_eq!(ints(&batch, "a"), [Some(1), Some(2), Some(4)]);
    assert_eq!(
        strings(&batch, "b"),
        [Some("x".into()), Some("y".into()), Some("w".into())]
    );
    let rejected: Vec<_> = batches.iter().flat_map(|b| b.rejected.clone()).collect();
    assert_eq!(rejected.len(), 1);
    assert!(rejected[0].record.contains("\"offset\":2"), "{rejected:?}");
}

#[test]
fn raw_messages_carry_bytes_key_position_and_typed_headers() {
    let topic = "frames";
    let (_cluster, brokers) = cluster(topic, 2);
    produce(
        &brokers,
        topic,
        &[
            Msg {
                partition: 0,
                key: Some("cam-a"),
                value: Some(b"\xff\xd8jpeg-a"),
                headers: &[("frame", "17"), ("camera", "a")],
            },
            Msg {
                partition: 1,
                key: None,
                value: Some(b"\xff\xd8jpeg-b"),
                headers: &[("frame", "not a number")],
            },
            Msg {
                partition: 1,
                key: Some("cam-c"),
                value: None,
                headers: &[],
            },
        ],
    );
    let factory = KafkaSourceFactory::new(&source_config(json!({
        "brokers": brokers, "topic": topic, "format": "jpeg", "key": "camera_id",
        "stop_at_end": true, "header_columns": {"frame": "int64"},
    })))
    .unwrap();
    let schema = factory.schema().unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "bytes",
            "camera_id",
            "partition",
            "offset",
            "timestamp",
            "headers",
            "frame"
        ]
    );
    let batches = drain(&factory, 0, 1);
    let batch = concat(&batches);
    assert_eq!(batch.num_rows(), 3);
    // Order rows by (partition, offset).
    let partitions: Vec<i32> = batch
        .column_by_name("partition")
        .unwrap()
        .as_primitive::<Int32Type>()
        .values()
        .to_vec();
    let offsets = ints(&batch, "offset");
    let mut order: Vec<usize> = (0..3).collect();
    order.sort_by_key(|&i| (partitions[i], offsets[i]));
    let bytes = batch
        .column_by_name("bytes")
        .unwrap()
        .as_any()
        .downcast_ref::<BinaryArray>()
        .unwrap();
    let keys = strings(&batch, "camera_id");
    let frames = ints(&batch, "frame");
    let headers = strings(&batch, "headers");
    let timestamps = ints(&batch, "timestamp");
    let rows: Vec<_> = order
        .iter()
        .map(|&i| {
            (
                bytes.value(i).to_vec(),
                keys[i].clone(),
                partitions[i],
                offsets[i],
                frames[i],
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                b"\xff\xd8jpeg-a".to_vec(),
                Some("cam-a".into()),
                0,
                Some(0),
                Some(17)
            ),
            (b"\xff\xd8jpeg-b".to_vec(), None, 1, Some(0), None),
            (Vec::new(), Some("cam-c".into()), 1, Some(1), None),
        ]
    );
    let first: Value = serde_json::from_str(headers[order[0]].as_deref().unwrap()).unwrap();
    assert_eq!(first, json!({"frame": "17", "camera": "a"}));
    assert_eq!(headers[order[2]], None);
    assert!(timestamps.iter().all(|t| t.is_some_and(|t| t > 0)));
}

/// The tests create their topics on the mock cluster themselves.
fn sink_config(mut value: Value) -> KafkaSinkConfig {
    value["create_topic"] = json!(false);
    serde_json::from_value(value).unwrap()
}

/// A message read back: key, value, headers.
type Consumed = (Option<String>, Vec<u8>, Vec<(String, String)>);

/// The first `count` messages of partition 0 of `topic`, in order.
fn consume_all(brokers: &str, topic: &str, count: usize) -> Vec<Consumed> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "test")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.len() < count {
        assert!(Instant::now() < deadline, "got only {} messages", out.len());
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_string(),
                                    String::from_utf8(h.value.unwrap().to_vec()).unwrap(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((
                    m.key().map(|k| String::from_utf8(k.to_vec()).unwrap()),
                    m.payload().unwrap_or_default().to_vec(),
                    headers,
                ));
            }
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    out
}

#[test]
fn sink_writes_json_rows_with_keys_and_headers() {
    let topic = "results";
    let (_cluster, brokers) = cluster(topic, 1);
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from(vec![1, 2, 3])) as Arc<dyn Array>,
        ),
        (
            "camera",
            Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])) as _,
        ),
        (
            "score",
            Arc::new(Float64Array::from(vec![Some(0.5), Some(0.25), None])) as _,
        ),
        (
            "img",
            Arc::new(BinaryArray::from_vec(vec![b"x", b"y", b"z"])) as _,
        ),
    ])
    .unwrap();
    let factory = KafkaSinkFactory::new(&sink_config(json!({
        "brokers": brokers, "topic": topic, "key": "camera",
        "headers": {"x-id": "id", "x-score": "score"},
    })))
    .unwrap();
    factory.attach_metrics(&Metrics::new().unwrap()).unwrap();
    let mut sink = factory.open().unwrap();
    sink.write_batch(&batch).unwrap();
    sink.finish().unwrap();

    let got = consume_all(&brokers, topic, 3);
    let values: Vec<Value> = got
        .iter()
        .map(|(_, v, _)| serde_json::from_slice(v).unwrap())
        .collect();
    assert_eq!(
        values,
        [
            json!({"id": 1, "camera": "a", "score": 0.5}),
            json!({"id": 2, "camera": null, "score": 0.25}),
            json!({"id": 3, "camera": "c", "score": null}),
        ]
    );
    let keys: Vec<Option<&str>> = got.iter().map(|(k, _, _)| k.as_deref()).collect();
    assert_eq!(keys, [Some("a"), None, Some("c")]);
    let headers: Vec<Vec<(String, String)>> = got.iter().map(|(_, _, h)| h.clone()).collect();
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        headers,
        [
            h(&[("x-id", "1"), ("x-score", "0.5")]),
            h(&[("x-id", "2"), ("x-score", "0.25")]),
            h(&[("x-id", "3")]),
        ]
    );

    // A key column that the results lack is named in the error.
    let factory = KafkaSinkFactory::new(&sink_config(json!({
        "brokers": brokers, "topic": topic, "key": "missing_col",
    })))
    .unwrap();
    let err = factory.open().unwrap().write_batch(&batch).unwrap_err();
    assert!(err.to_string().contains("missing_col"), "{err}");
}

#[test]
fn sink_writes_ipc_batches() {
    let topic = "ipc-out";
    let (_cluster, brokers) = cluster(topic, 1);
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from(vec![7, 8])) as Arc<dyn Array>,
        ),
        ("camera", Arc::new(StringArray::from(vec!["b", "c"])) as _),
    ])
    .unwrap();
    let factory = KafkaSinkFactory::new(&sink_config(json!({
        "brokers": brokers, "topic": topic, "format": "ipc", "key": "camera",
    })))
    .unwrap();
    let mut sink = factory.open().unwrap();
    sink.write_batch(&batch).unwrap();
    sink.finish().unwrap();
    let got = consume_all(&brokers, topic, 1);
    assert_eq!(got[0].0.as_deref(), Some("b"));
    assert_eq!(
        riffle_dataflow::batch::from_ipc_bytes(&got[0].1).unwrap(),
        batch
    );
}

#[test]
fn sink_finish_fails_when_the_broker_is_unreachable() {
    // Unreachable at the start: the sink's connection check fails its open.
    let unreachable = KafkaSinkFactory::new(&sink_config(
        json!({"brokers": "127.0.0.1:1", "topic": "nowhere"}),
    ))
    .unwrap();
    let err = unreachable.open().err().expect("no broker at 127.0.0.1:1");
    assert!(err.to_string().contains("brokers are unreachable"), "{err}");
    // Gone after the start: the end of the run fails.
    let (cluster, brokers) = cluster("nowhere", 1);
    let factory = KafkaSinkFactory::new(&sink_config(json!({
        "brokers": brokers, "topic": "nowhere", "delivery_timeout_ms": 3000,
        "options": {"message.timeout.ms": "1000"},
    })))
    .unwrap();
    let batch = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(vec![1, 2])) as Arc<dyn Array>,
    )])
    .unwrap();
    let mut sink = factory.open().unwrap();
    cluster.broker_down(1).unwrap();
    let started = Instant::now();
    sink.write_batch(&batch).unwrap();
    // Epoch flushes do not wait for the broker; the end of the run does.
    sink.flush().unwrap();
    let err = sink.finish().unwrap_err();
    assert!(err.to_string().contains("nowhere"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The failure sticks: later writes fail too.
    assert!(sink.write_batch(&batch).is_err());
}
