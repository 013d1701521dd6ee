use std::fs;
use std::sync::Arc;

use arrow_array::builder::{
    FixedSizeListBuilder, Float32Builder, ListBuilder, StringBuilder, StructBuilder,
};
use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Fields};
use riffle_connectors::SinkConfig;
use serde_json::json;

fn sink_config(json: serde_json::Value) -> SinkConfig {
    serde_json::from_value(json).unwrap()
}

/// Two rows: frame, detections List<Struct{label, score}>, embedding FixedSizeList<f32; 2>,
/// and raw bytes.
fn nested_batch() -> RecordBatch {
    let fields = Fields::from(vec![
        Field::new("label", DataType::Utf8, false),
        Field::new("score", DataType::Float32, false),
    ]);
    let mut detections = ListBuilder::new(StructBuilder::new(
        fields.clone(),
        vec![
            Box::new(StringBuilder::new()),
            Box::new(Float32Builder::new()),
        ],
    ))
    .with_field(Arc::new(Field::new("item", DataType::Struct(fields), true)));
    for (label, score) in [("person", 0.5f32), ("bike", 0.25)] {
        let s = detections.values();
        s.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value(label);
        s.field_builder::<Float32Builder>(1)
            .unwrap()
            .append_value(score);
        s.append(true);
    }
    detections.append(true);
    detections.append(true); // no detections

    let mut embedding = FixedSizeListBuilder::new(Float32Builder::new(), 2);
    for v in [[1.0f32, 2.0], [3.0, 4.5]] {
        embedding.values().append_slice(&v);
        embedding.append(true);
    }

    RecordBatch::try_from_iter(vec![
        ("frame", Arc::new(Int64Array::from(vec![7, 8])) as ArrayRef),
        ("detections", Arc::new(detections.finish()) as ArrayRef),
        ("embedding", Arc::new(embedding.finish()) as ArrayRef),
        (
            "bytes",
            Arc::new(BinaryArray::from_vec(vec![b"\xff\xd8", b"\x00"])) as ArrayRef,
        ),
    ])
    .unwrap()
}

#[test]
fn jsonl_sink_writes_nested_rows_without_binary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out/deeper/results.jsonl");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, "stale\n").unwrap();
    let factory = sink_config(json!({"jsonl": {"path": path}}))
        .build()
        .unwrap();
    let mut sink = factory.open().unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), "", "truncated on open");
    let batch = nested_batch();
    sink.write_batch(&batch).unwrap();
    sink.write_batch(&batch.slice(1, 1)).unwrap();
    sink.flush().unwrap();

    let text = fs::read_to_string(&path).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows,
        vec![
            json!({
                "frame": 7,
                "detections": [{"label": "person", "score": 0.5}, {"label": "bike", "score": 0.25}],
                "embedding": [1.0, 2.0],
            }),
            json!({"frame": 8, "detections": [], "embedding": [3.0, 4.5]}),
            json!({"frame": 8, "detections": [], "embedding": [3.0, 4.5]}),
        ]
    );
}

#[test]
fn ipc_sink_is_readable_after_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out/results.arrow");
    let factory = sink_config(json!({"ipc": {"path": path}})).build().unwrap();
    let batch = nested_batch();
    {
        let mut sink = factory.open().unwrap();
        sink.write_batch(&batch).unwrap();
        sink.flush().unwrap();
        sink.write_batch(&batch.slice(0, 1)).unwrap();

        // A batch of another schema is refused, naming both.
        let other = RecordBatch::try_from_iter(vec![(
            "frame",
            Arc::new(Int64Array::from(vec![1])) as ArrayRef,
        )])
        .unwrap();
        let err = sink.write_batch(&other).unwrap_err().to_string();
        assert!(
            err.contains("detections") && err.contains("differs"),
            "{err}"
        );
        sink.flush().unwrap();
    }
    let reader =
        arrow_ipc::reader::FileReader::try_new(fs::File::open(&path).unwrap(), None).unwrap();
    assert_eq!(reader.schema(), batch.schema());
    let read: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    assert_eq!(read, vec![batch.clone(), batch.slice(0, 1)]);
}

#[test]
fn ipc_sink_without_batches_leaves_an_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.arrow");
    let sink = sink_config(json!({"ipc": {"path": path}}))
        .build()
        .unwrap()
        .open()
        .unwrap();
    drop(sink);
    let reader =
        arrow_ipc::reader::FileReader::try_new(fs::File::open(&path).unwrap(), None).unwrap();
    assert_eq!(reader.num_batches(), 0);
}

#[test]
fn sink_configs_parse() {
    assert!(sink_config(json!({"stdout": {}}))
        .kind()
        .outputs()
        .is_empty());
    assert!(serde_json::from_value::<SinkConfig>(json!({"jsonl": {"path": "a", "x": 1}})).is_err());
    let mut ipc = sink_config(json!({"ipc": {"path": "rel/out.arrow"}}));
    for p in ipc.kind_mut().paths_mut() {
        *p = std::path::Path::new("/abs").join(&*p);
    }
    assert_eq!(
        ipc.kind().outputs(),
        vec![std::path::Path::new("/abs/rel/out.arrow")]
    );
}
