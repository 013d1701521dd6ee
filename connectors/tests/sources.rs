use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use riffle_connectors::SourceConfig;
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::SourceFactory;

fn config(json: serde_json::Value) -> SourceConfig {
    serde_json::from_value(json).unwrap()
}

/// Every batch of every partition, and every dead letter, for `peers` workers.
fn read_all(factory: &dyn SourceFactory, peers: usize) -> (Vec<RecordBatch>, Vec<DeadLetter>) {
    let mut batches = Vec::new();
    let mut rejected = Vec::new();
    for index in 0..peers {
        let mut source = factory.partition(index, peers).unwrap();
        while let Some(batch) = source.next_batch().unwrap() {
            assert_eq!(batch.records.schema(), factory.schema().unwrap());
            batches.push(batch.records);
            rejected.extend(batch.rejected);
        }
    }
    (batches, rejected)
}

fn write(path: &Path, contents: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

/// (camera_id, frame) -> (path, bytes) over all rows; panics on a duplicate row.
type ImageRows = BTreeMap<(String, i64), (String, Vec<u8>)>;

fn image_rows(batches: &[RecordBatch]) -> ImageRows {
    let mut rows = BTreeMap::new();
    for b in batches {
        let cams = b.column_by_name("camera_id").unwrap().as_string::<i32>();
        let frames = b
            .column_by_name("frame")
            .unwrap()
            .as_primitive::<Int64Type>();
        let paths = b.column_by_name("path").unwrap().as_string::<i32>();
        let bytes = b.column_by_name("bytes").unwrap().as_binary::<i32>();
        for i in 0..b.num_rows() {
            let key = (cams.value(i).to_string(), frames.value(i));
            let value = (paths.value(i).to_string(), bytes.value(i).to_vec());
            assert!(
                rows.insert(key.clone(), value).is_none(),
                "duplicate {key:?}"
            );
        }
    }
    rows
}

fn image_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("frames");
    for n in [7, 8, 9, 10, 11] {
        write(
            &root.join(format!("bikes/{n:04}.jpg")),
            format!("bike {n}").as_bytes(),
        );
    }
    write(&root.join("cars/0100.JPEG"), b"car 100");
    write(&root.join("cars/0101.png"), b"car 101");
    write(&root.join("cover.png"), b"cover");
    write(&root.join("cars/notes.txt"), b"not an image");
    write(&root.join(".thumbs/0001.jpg"), b"hidden");
    dir
}

#[test]
fn images_cover_every_file_once_for_any_peers() {
    let dir = image_dir();
    let root = dir.path().join("frames");
    let factory = config(serde_json::json!({"images": {"path": root, "batch_size": 2}}))
        .build()
        .unwrap();
    assert_eq!(factory.total_records(), Some(8));

    let mut expected = BTreeMap::new();
    for n in [7, 8, 9, 10, 11] {
        let path = root.join(format!("bikes/{n:04}.jpg"));
        expected.insert(
            ("bikes".to_string(), n),
            (path.display().to_string(), format!("bike {n}").into_bytes()),
        );
    }
    expected.insert(
        ("cars".to_string(), 100),
        (
            root.join("cars/0100.JPEG").display().to_string(),
            b"car 100".to_vec(),
        ),
    );
    expected.insert(
        ("cars".to_string(), 101),
        (
            root.join("cars/0101.png").display().to_string(),
            b"car 101".to_vec(),
        ),
    );
    // No digits in the name: the frame is the position within the camera; a file directly in
    // the folder belongs to the camera named after the folder.
    expected.insert(
        ("frames".to_string(), 0),
        (
            root.join("cover.png").display().to_string(),
            b"cover".to_vec(),
        ),
    );

    for peers in [1, 3, 10] {
        let (batches, rejected) = read_all(factory.as_ref(), peers);
        assert!(rejected.is_empty());
        assert!(batches.iter().all(|b| b.num_rows() <= 2));
        assert_eq!(image_rows(&batches), expected, "peers {peers}");
    }

    // Worker 1 of 3 reads chunks 1 and 4 of [bikes x5, cars x2, default]: rows 2,3 only.
    let mut source = factory.partition(1, 3).unwrap();
    let first = source.next_batch().unwrap().unwrap().records;
    let frames = first
        .column_by_name("frame")
        .unwrap()
        .as_primitive::<Int64Type>();
    assert_eq!(frames.values(), &[9, 10]);
    assert!(source.next_batch().unwrap().is_none());
    assert!(factory.partition(3, 3).is_err());
}

#[test]
fn images_split_directories_into_cameras_and_repeat() {
    let dir = image_dir();
    let root = dir.path().join("frames");
    let factory = config(serde_json::json!({
        "images": {"path": root, "cameras": 2, "repeat": 2, "batch_size": 3}
    }))
    .build()
    .unwrap();
    assert_eq!(factory.total_records(), Some(16));
    let (batches, _) = read_all(factory.as_ref(), 2);
    let rows = image_rows(&batches);
    let keys: Vec<(String, i64)> = rows.keys().cloned().collect();
    // Frames are offset by span = max frame + 1 = 102 in the second repetition.
    let mut want = Vec::new();
    for rep in [0, 102] {
        want.extend([
            ("bikes-0", 7 + rep),
            ("bikes-0", 8 + rep),
            ("bikes-0", 9 + rep),
            ("bikes-1", 10 + rep),
            ("bikes-1", 11 + rep),
            ("cars-0", 100 + rep),
            ("cars-1", 101 + rep),
            // The one root file is segment 0; segment 1 is empty.
            ("frames-0", rep),
        ]);
    }
    let mut want: Vec<(String, i64)> = want.into_iter().map(|(c, f)| (c.to_string(), f)).collect();
    want.sort();
    assert_eq!(keys, want);
    assert_eq!(rows[&("bikes-1".to_string(), 112)].1, b"bike 10");
}

#[test]
fn unreadable_image_is_a_dead_letter() {
    let dir = image_dir();
    let root = dir.path().join("frames");
    let factory = config(serde_json::json!({"images": {"path": root}}))
        .build()
        .unwrap();
    // Listed at build time, gone when read.
    let gone = root.join("bikes/0008.jpg");
    fs::remove_file(&gone).unwrap();
    let (batches, rejected) = read_all(factory.as_ref(), 1);
    assert_eq!(image_rows(&batches).len(), 7);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].stage, "source");
    let record: serde_json::Value = serde_json::from_str(&rejected[0].record).unwrap();
    assert_eq!(record["path"], gone.display().to_string());
    assert_eq!(record["frame"], 8);
}

#[test]
fn images_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let empty = config(serde_json::json!({"images": {"path": dir.path()}}));
    assert!(empty.build().is_err(), "no images");
    let bad: Result<SourceConfig, _> =
        serde_json::from_value(serde_json::json!({"images": {"path": "x", "camera": 2}}));
    assert!(bad.is_err(), "unknown field");
    let zero = config(serde_json::json!({"images": {"path": dir.path(), "batch_size": 0}}));
    assert!(zero.build().is_err());
}

#[test]
fn paths_can_be_rewritten() {
    let mut c = config(serde_json::json!({"csv": {"path": "data/x.csv"}}));
    for p in c.kind_mut().paths_mut() {
        *p = Path::new("/base").join(&*p);
    }
    assert_eq!(c.kind().inputs(), vec![Path::new("/base/data/x.csv")]);
}

#[test]
fn jsonl_bad_lines_are_rejected_and_good_lines_emitted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    let lines = [
        r#"{"id": 1, "tags": ["a"], "pos": {"x": 1.5}}"#,
        r#"{"id": 2, "tags": [], "pos": {"x": 2.5}}"#,
        r#"{"id": 3, "tags": ["b", "c"], "pos": {"x""#, // truncated
        "",
        r#"{"id": {"nested": true}}"#, // conflicts with the inferred type
        r#"{"id": 5, "pos": null}"#,
        r#"not json"#,
        r#"{"id": 7, "tags": ["d"], "pos": {"x": 7}}"#,
    ];
    fs::write(&path, lines.join("\n")).unwrap();
    let factory = config(serde_json::json!({"jsonl": {"path": path, "batch_size": 3}}))
        .build()
        .unwrap();
    let schema = factory.schema().unwrap();
    assert_eq!(
        schema.field_with_name("id").unwrap().data_type(),
        &DataType::Int64
    );

    for peers in [1, 2] {
        let (batches, mut rejected) = read_all(factory.as_ref(), peers);
        let mut ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
                ids.values().to_vec()
            })
            .collect();
        ids.sort();
        assert_eq!(ids, [1, 2, 5, 7], "peers {peers}");

        rejected.sort_by_key(|r| r.record.clone());
        let lines: Vec<i64> = rejected
            .iter()
            .map(|r| {
                assert_eq!(r.stage, "source");
                assert!(!r.reason.is_empty());
                let record: serde_json::Value = serde_json::from_str(&r.record).unwrap();
                assert_eq!(record["path"], path.display().to_string());
                record["line"].as_i64().unwrap()
            })
            .collect();
        assert_eq!(lines, [3, 5, 7], "peers {peers}");
    }
}

#[test]
fn csv_round_trip_with_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.csv");
    let mut text = String::from("id,name,score\n");
    for i in 0..1100 {
        match i {
            // Wrong number of fields.
            5 => text.push_str("5,five\n"),
            // Past the inference sample, so `id` is still Int64 and this does not parse.
            1050 => text.push_str("abc,x,1.0\n"),
            // A quoted field with the delimiter and a newline in it.
            7 => text.push_str("7,\"seven, \nor so\",7.5\n"),
            _ => text.push_str(&format!("{i},name{i},{}.25\n", i)),
        }
    }
    fs::write(&path, &text).unwrap();
    let factory = config(serde_json::json!({"csv": {"path": path, "batch_size": 100}}))
        .build()
        .unwrap();
    let schema = factory.schema().unwrap();
    let types: Vec<&DataType> = schema.fields().iter().map(|f| f.data_type()).collect();
    assert_eq!(
        types,
        [&DataType::Int64, &DataType::Utf8, &DataType::Float64]
    );

    for peers in [1, 3] {
        let (batches, rejected) = read_all(factory.as_ref(), peers);
        let mut rows = BTreeMap::new();
        for b in &batches {
            let ids = b.column(0).as_primitive::<Int64Type>();
            let names = b.column(1).as_string::<i32>();
            let scores = b.column(2).as_primitive::<Float64Type>();
            for i in 0..b.num_rows() {
                rows.insert(ids.value(i), (names.value(i).to_string(), scores.value(i)));
            }
        }
        assert_eq!(rows.len(), 1098, "peers {peers}");
        assert_eq!(rows[&7], ("seven, \nor so".to_string(), 7.5));
        assert_eq!(rows[&1099], ("name1099".to_string(), 1099.25));

        let mut lines: Vec<(i64, String)> = rejected
            .iter()
            .map(|r| {
                let record: serde_json::Value = serde_json::from_str(&r.record).unwrap();
                (record["line"].as_i64().unwrap(), r.reason.clone())
            })
            .collect();
        lines.sort();
        // File lines: header is line 1, row i is line i + 2 (+1 after the two-line row 7).
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].0, 7);
        assert!(lines[0].1.contains("line 7"), "{}", lines[0].1);
        assert_eq!(lines[1].0, 1053);
        assert!(lines[1].1.contains("abc"), "{}", lines[1].1);
    }
}

#[test]
fn csv_without_header_and_custom_delimiter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.tsv");
    fs::write(&path, "1\ta\n2\tb\n3\tc\n").unwrap();
    let factory = config(serde_json::json!({
        "csv": {"path": path, "has_header": false, "delimiter": "\t", "batch_size": 2}
    }))
    .build()
    .unwrap();
    let (batches, rejected) = read_all(factory.as_ref(), 2);
    assert!(rejected.is_empty());
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    assert_eq!(factory.schema().unwrap().field(0).name(), "column_1");
}

#[test]
fn ipc_batches_are_dealt_round_robin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.arrow");
    let make = |start: i64, n: i64| {
        RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(start..start + n)) as _,
            ),
            (
                "name",
                Arc::new(StringArray::from_iter_values(
                    (start..start + n).map(|i| format!("r{i}")),
                )) as _,
            ),
        ])
        .unwrap()
    };
    let batches: Vec<RecordBatch> = (0..5).map(|i| make(i * 10, i + 1)).collect();
    let mut writer = arrow_ipc::writer::FileWriter::try_new(
        fs::File::create(&path).unwrap(),
        &batches[0].schema(),
    )
    .unwrap();
    for b in &batches {
        writer.write(b).unwrap();
    }
    writer.finish().unwrap();

    let factory = config(serde_json::json!({"ipc": {"path": path}}))
        .build()
        .unwrap();
    assert_eq!(factory.schema().unwrap(), batches[0].schema());
    for peers in [1, 2, 3, 7] {
        let mut ids: Vec<i64> = Vec::new();
        for index in 0..peers {
            let mut source = factory.partition(index, peers).unwrap();
            let mut k = index;
            while let Some(batch) = source.next_batch().unwrap() {
                // Worker `index` gets exactly batches index, index + peers, ...
                assert_eq!(batch.records, batches[k]);
                k += peers;
                let col = batch.records.column(0).as_primitive::<Int64Type>();
                ids.extend(col.values().iter());
            }
            assert!(k >= batches.len());
        }
        ids.sort();
        let want: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(ids, want, "peers {peers}");
        assert_eq!(ids.len(), 15);
        assert!(batches.iter().all(|b| b.column(0).null_count() == 0));
    }
}
