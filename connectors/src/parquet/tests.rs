use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::builder::{
    FixedSizeListBuilder, Float32Builder, ListBuilder, StringBuilder, StructBuilder,
};
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use riffle_dataflow::sink::{Committer, Sink};
use serde_json::json;

use super::layout::{partition_segment, Staged};
use super::*;

fn config(value: serde_json::Value) -> Result<ParquetSinkConfig, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

fn local(dir: &Path, roll_rows: u64, partition_by: &[&str]) -> ParquetSinkConfig {
    config(json!({
        "path": dir,
        "partition_by": partition_by,
        "roll": { "rows": roll_rows, "seconds": 3600 },
    }))
    .unwrap()
}

fn open(config: &ParquetSinkConfig) -> (Box<dyn Sink>, Box<dyn Committer>) {
    let factory = config.build().unwrap();
    let sink = factory.open().unwrap();
    let committer = factory.committer().unwrap().unwrap();
    (sink, committer)
}

/// `id` and `country` rows.
fn rows(ids: &[i64], countries: &[Option<&str>]) -> RecordBatch {
    RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
        (
            "country",
            Arc::new(StringArray::from(countries.to_vec())) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// Files under `dir` (relative, sorted): `staged` picks those under `_staging/`, else the rest.
fn files(dir: &Path, staged: bool) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let name = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.retain(|n| n.starts_with("_staging/") == staged);
    out.sort();
    out
}

fn read(path: &Path) -> Vec<RecordBatch> {
    let bytes = bytes::Bytes::from(std::fs::read(path).unwrap());
    ParquetRecordBatchReaderBuilder::try_new(bytes)
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn ids(path: &Path) -> Vec<i64> {
    read(path)
        .iter()
        .flat_map(|b| {
            let col = b.column_by_name("id").unwrap();
            let col = col.as_any().downcast_ref::<Int64Array>().unwrap();
            col.values().to_vec()
        })
        .collect()
}

#[test]
fn staged_files_are_published_only_when_their_epoch_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut committer) = open(&local(dir.path(), 1, &[]));
    sink.begin_epoch(7, 0);
    sink.write_batch(&rows(&[1, 2, 3], &[None; 3])).unwrap();
    sink.flush().unwrap();
    sink.begin_epoch(7, 1);
    sink.write_batch(&rows(&[4, 5], &[None; 2])).unwrap();
    sink.flush().unwrap();
    assert_eq!(
        files(dir.path(), true),
        [
            "_staging/7/0-0-0.parquet.staged",
            "_staging/7/1-1-1.parquet.staged"
        ]
    );
    assert!(
        files(dir.path(), false).is_empty(),
        "nothing visible before a commit"
    );
    assert_eq!(sink.durable().unwrap().load(Ordering::Acquire), 5);
    assert_eq!(
        sink.position(),
        Some(5),
        "every file closed: the plain count"
    );

    committer.commit(7, 0).unwrap();
    assert_eq!(files(dir.path(), false), ["part-7-0-0.parquet"]);
    assert_eq!(ids(&dir.path().join("part-7-0-0.parquet")), [1, 2, 3]);
    committer.commit(7, 1).unwrap();
    assert_eq!(
        files(dir.path(), false),
        ["part-7-0-0.parquet", "part-7-1-1.parquet"]
    );
    assert!(files(dir.path(), true).is_empty());
    assert!(
        !dir.path().join("_staging/7").exists(),
        "emptied staging folders are removed"
    );
}

#[test]
fn an_epoch_inside_an_open_file_cannot_be_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _) = open(&local(dir.path(), 100, &[]));
    let durable = sink.durable().unwrap();
    sink.begin_epoch(1, 0);
    sink.write_batch(&rows(&[1, 2, 3], &[None; 3])).unwrap();
    sink.flush().unwrap();
    let inside = sink.position().unwrap();
    assert!(inside >= OPEN_FILE_MARK, "open: {inside}");
    sink.begin_epoch(1, 1);
    sink.write_batch(&rows(&[4], &[None])).unwrap();
    sink.finish().unwrap();
    // The file closed: the epoch inside it still does not qualify, the end does.
    assert!(inside > durable.load(Ordering::Acquire));
    assert_eq!(sink.position(), Some(4));
    assert_eq!(durable.load(Ordering::Acquire), 4);
    assert_eq!(
        files(dir.path(), true),
        ["_staging/1/0-1-0.parquet.staged"],
        "one file over both epochs"
    );
}

#[test]
fn a_repeated_commit_finishes_what_a_crash_left() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut committer) = open(&local(dir.path(), 1, &[]));
    for epoch in 0..3 {
        sink.begin_epoch(5, epoch);
        sink.write_batch(&rows(&[epoch as i64], &[None])).unwrap();
        sink.flush().unwrap();
    }
    let staged: Vec<Staged> = files(dir.path(), true)
        .iter()
        .map(|n| Staged::parse(n).unwrap())
        .collect();
    assert_eq!(staged.len(), 3);
    // A crash mid-commit: the first renamed; the second copied but not deleted (an object
    // store's rename is copy, then delete).
    std::fs::rename(
        dir.path().join(staged[0].name()),
        dir.path().join(staged[0].published()),
    )
    .unwrap();
    std::fs::copy(
        dir.path().join(staged[1].name()),
        dir.path().join(staged[1].published()),
    )
    .unwrap();
    committer.commit(5, 2).unwrap();
    committer.commit(5, 2).unwrap();
    let published = files(dir.path(), false);
    assert_eq!(
        published,
        [
            "part-5-0-0.parquet",
            "part-5-1-1.parquet",
            "part-5-2-2.parquet"
        ]
    );
    assert!(files(dir.path(), true).is_empty());
    let all: Vec<i64> = published
        .iter()
        .flat_map(|n| ids(&dir.path().join(n)))
        .collect();
    assert_eq!(all, [0, 1, 2], "each row once");
}

#[test]
fn fence_removes_the_staged_files_of_other_runs() {
    let dir = tempfile::tempdir().unwrap();
    let config = local(dir.path(), 1, &["country"]);
    let (mut crashed, _) = open(&config);
    for epoch in 0..3 {
        crashed.begin_epoch(1, epoch);
        crashed
            .write_batch(&rows(&[epoch as i64], &[Some("DE")]))
            .unwrap();
        crashed.flush().unwrap();
    }
    drop(crashed);
    // The restart: its checkpoint covered epoch 0 of run 1.
    let (mut sink, mut committer) = open(&config);
    committer.commit(1, 0).unwrap();
    committer.fence(2).unwrap();
    sink.begin_epoch(2, 1);
    sink.write_batch(&rows(&[1], &[Some("DE")])).unwrap();
    sink.flush().unwrap();
    committer.fence(2).unwrap();
    assert_eq!(
        files(dir.path(), true),
        ["_staging/2/country=DE/1-1-0.parquet.staged"],
        "run 1's uncommitted files are gone, run 2's kept"
    );
    assert_eq!(files(dir.path(), false), ["country=DE/part-1-0-0.parquet"]);
    assert!(!dir.path().join("_staging/1").exists());
}

#[test]
fn partitions_are_hive_folders_without_their_columns() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut committer) = open(&local(dir.path(), 1000, &["country"]));
    sink.begin_epoch(3, 0);
    let batch = rows(
        &[1, 2, 3, 4, 5],
        &[Some("DE"), Some("a#b"), None, Some("DE"), Some("")],
    );
    sink.write_batch(&batch).unwrap();
    sink.finish().unwrap();
    committer.commit(3, 0).unwrap();
    let published = files(dir.path(), false);
    assert_eq!(
        published,
        [
            "country=DE/part-3-0-0.parquet",
            "country=__HIVE_DEFAULT_PARTITION__/part-3-0-1.parquet",
            // The store escapes `#` as Hive does, and the commit finds the file all the same.
            "country=a%23b/part-3-0-2.parquet",
        ]
    );
    let de = read(&dir.path().join(&published[0]));
    assert!(
        de[0].column_by_name("country").is_none(),
        "the folder holds it"
    );
    assert_eq!(ids(&dir.path().join(&published[0])), [1, 4]);
    assert_eq!(ids(&dir.path().join(&published[1])), [3, 5]);
    assert!(files(dir.path(), true).is_empty());
}

#[test]
fn without_checkpoints_files_are_published_as_they_close() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _) = open(&local(dir.path(), 2, &[]));
    sink.write_batch(&rows(&[1], &[None])).unwrap();
    sink.flush().unwrap();
    assert!(files(dir.path(), false).is_empty(), "not due: 1 row of 2");
    sink.write_batch(&rows(&[2], &[None])).unwrap();
    sink.flush().unwrap();
    let published = files(dir.path(), false);
    assert_eq!(published.len(), 1, "{published:?}");
    assert!(published[0].starts_with("part-") && published[0].ends_with("-0.parquet"));
    assert_eq!(ids(&dir.path().join(&published[0])), [1, 2]);
    sink.write_batch(&rows(&[3], &[None])).unwrap();
    sink.finish().unwrap();
    assert_eq!(files(dir.path(), false).len(), 2);
    assert!(files(dir.path(), true).is_empty());
}

/// detections List<Struct{label, score}>, an embedding FixedSizeList<f32; 2> with a tensor
/// shape, and a Struct.
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
    .with_field(Arc::new(Field::new(
        "item",
        DataType::Struct(fields.clone()),
        true,
    )));
    let mut embedding = FixedSizeListBuilder::new(Float32Builder::new(), 2);
    for (row, dets) in [vec![("person", 0.5f32), ("bike", 0.25)], vec![]]
        .into_iter()
        .enumerate()
    {
        for (label, score) in dets {
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
        embedding.values().append_value(row as f32);
        embedding.values().append_value(-1.0);
        embedding.append(true);
    }
    let detections = detections.finish();
    let embedding = embedding.finish();
    let best = detections.value(0);
    let best = best
        .as_any()
        .downcast_ref::<arrow_array::StructArray>()
        .unwrap()
        .slice(0, 2);
    let shape =
        std::collections::HashMap::from([("riffle.tensor.shape".to_string(), "[2]".to_string())]);
    let schema = Schema::new(vec![
        Field::new("detections", detections.data_type().clone(), true),
        Field::new("embedding", embedding.data_type().clone(), true).with_metadata(shape),
        Field::new("best", best.data_type().clone(), true),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(detections), Arc::new(embedding), Arc::new(best)],
    )
    .unwrap()
}

#[test]
fn nested_columns_stay_lists_and_structs() {
    let dir = tempfile::tempdir().unwrap();
    let batch = nested_batch();
    let config = local(dir.path(), 1000, &[]);
    config.check_input(&batch.schema()).unwrap();
    let (mut sink, _) = open(&config);
    sink.write_batch(&batch).unwrap();
    sink.finish().unwrap();
    let published = files(dir.path(), false);
    let back = read(&dir.path().join(&published[0]));
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].schema(), batch.schema(), "types and field metadata");
    assert_eq!(back[0], batch);
    // Parquet itself holds a list (not a blob): the file's own schema says so.
    let bytes = bytes::Bytes::from(std::fs::read(dir.path().join(&published[0])).unwrap());
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
    let parquet_schema = format!("{:?}", builder.parquet_schema().root_schema());
    assert!(parquet_schema.contains("LIST"), "{parquet_schema}");
}

#[test]
fn configuration_errors_name_the_key_and_what_was_expected() {
    let e = config(json!({"path": "a", "url": "s3://b/p"})).unwrap_err();
    assert!(e.contains("not both"), "{e}");
    let e = config(json!({})).unwrap_err();
    assert!(e.contains("`path`") && e.contains("`url`"), "{e}");
    let e = config(json!({"path": "a", "rol": {}})).unwrap_err();
    assert!(e.contains("unknown field `rol`"), "{e}");
    let e = config(json!({"path": "a", "endpoint": "http://x"})).unwrap_err();
    assert!(e.contains("go with `url`"), "{e}");
    let e = config(json!({"path": "a", "roll": {"row": 1}})).unwrap_err();
    assert!(e.contains("unknown field `row`"), "{e}");
    let e = config(json!({"path": "a", "partition_by": ["x", "x"]})).unwrap_err();
    assert!(e.contains("`x` is named twice"), "{e}");
    let e = config(json!({"path": "a", "compression": "lzma"})).unwrap_err();
    assert!(e.contains("lzma"), "{e}");
    let s3 = config(json!({
        "url": "s3://bucket/out", "endpoint": "http://127.0.0.1:1", "region": "r",
        "access_key_id": "k", "secret_access_key": "hush", "compression": "snappy"
    }))
    .unwrap();
    assert_eq!(s3.store.secret_access_key.as_deref(), Some("hush"));
    assert_eq!(s3.compression, Compression::Snappy);
    assert!(
        !format!("{s3:?}").contains("hush"),
        "secrets stay out of logs"
    );

    let e = local(Path::new("a"), 0, &[]).build().err().unwrap();
    assert_eq!(e.located().0, Some("roll.rows"), "{e}");
    assert!(e.to_string().contains("expected an integer from 1"), "{e}");

    let schema = nested_batch().schema();
    let e = local(Path::new("a"), 1, &["detections"])
        .check_input(&schema)
        .unwrap_err();
    assert!(
        e.contains("partition_by: column `detections` is List")
            && e.contains("expected a primitive"),
        "{e}"
    );
    let e = local(Path::new("a"), 1, &["nope"])
        .check_input(&schema)
        .unwrap_err();
    assert!(
        e.contains("no column `nope`") && e.contains("detections"),
        "{e}"
    );
    let all = rows(&[1], &[None]).schema();
    let e = local(Path::new("a"), 1, &["id", "country"])
        .check_input(&all)
        .unwrap_err();
    assert!(e.contains("every column"), "{e}");
    assert!(local(Path::new("a"), 1, &["country"])
        .check_input(&all)
        .is_ok());
}

#[test]
fn dead_letters_stay_beside_the_results() {
    let s3 = config(json!({"url": "s3://bucket/clicks/", "partition_by": ["x"]})).unwrap();
    let dl = s3.dead_letters().unwrap();
    assert_eq!(dl.url.as_deref(), Some("s3://bucket/clicks.dead-letters"));
    assert!(dl.partition_by.is_empty());
    let bucket = config(json!({"url": "s3://bucket"})).unwrap();
    assert!(bucket.dead_letters().is_none(), "no sibling of a bucket");
    let dir = config(json!({"path": "out/clicks"})).unwrap();
    assert!(
        dir.dead_letters().is_none(),
        "a JSON-lines file beside the folder"
    );
    let registry: crate::SinkConfig =
        serde_json::from_value(json!({"parquet": {"path": "out/clicks"}})).unwrap();
    assert_eq!(
        registry.default_dead_letters().kind().outputs(),
        [Path::new("out/clicks.dead-letters.jsonl")]
    );
}

#[test]
fn names_parse_back_and_values_escape() {
    let staged = Staged {
        generation: 17,
        partition: "a=1/b=x y".into(),
        first_epoch: 3,
        last_epoch: 9,
        seq: 4,
    };
    assert_eq!(staged.name(), "_staging/17/a=1/b=x y/3-9-4.parquet.staged");
    assert_eq!(staged.published(), "a=1/b=x y/part-17-9-4.parquet");
    assert_eq!(Staged::parse(&staged.name()), Some(staged));
    assert_eq!(Staged::parse("_staging/17/3-9.parquet.staged"), None);
    assert_eq!(Staged::parse("_staging/x/3-9-1.parquet.staged"), None);
    assert_eq!(partition_segment("k", Some("a/b")), "k=a%2Fb");
    assert_eq!(partition_segment("k", None), "k=__HIVE_DEFAULT_PARTITION__");
    assert_eq!(partition_segment("k", Some("50%/b")), "k=50%25%2Fb");
}

#[test]
fn a_local_file_is_written_in_the_staging_folder_while_open_and_never_left_there() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut committer) = open(&local(dir.path(), 3, &[]));
    sink.begin_epoch(9, 0);
    sink.write_batch(&rows(&[1, 2], &[None; 2])).unwrap();
    sink.flush().unwrap();
    // On disk as it is written, under a name the commit passes over.
    assert_eq!(files(dir.path(), true), ["_staging/9/open-0.parquet.open"]);
    committer.commit(9, 0).unwrap();
    assert!(
        files(dir.path(), false).is_empty(),
        "an open file is not published"
    );
    sink.begin_epoch(9, 1);
    sink.write_batch(&rows(&[3], &[None])).unwrap();
    sink.flush().unwrap();
    assert_eq!(files(dir.path(), true), ["_staging/9/0-1-0.parquet.staged"]);
    committer.commit(9, 1).unwrap();
    assert_eq!(ids(&dir.path().join("part-9-1-0.parquet")), [1, 2, 3]);

    // A sink dropped with a file open (a failed run) removes it; one that could not (the
    // process killed) leaves it to the next run's fence.
    sink.begin_epoch(9, 2);
    sink.write_batch(&rows(&[4], &[None])).unwrap();
    drop(sink);
    assert!(files(dir.path(), true).is_empty());
    let (mut killed, _) = open(&local(dir.path(), 3, &[]));
    killed.begin_epoch(10, 0);
    killed.write_batch(&rows(&[5], &[None])).unwrap();
    std::mem::forget(killed);
    assert_eq!(files(dir.path(), true), ["_staging/10/open-0.parquet.open"]);
    committer.fence(11).unwrap();
    assert!(files(dir.path(), true).is_empty());
    assert_eq!(files(dir.path(), false), ["part-9-1-0.parquet"]);
}

#[test]
fn without_checkpoints_no_staging_folder_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, _) = open(&local(dir.path(), 1, &["country"]));
    sink.write_batch(&rows(&[1, 2], &[Some("DE"), Some("FR")]))
        .unwrap();
    assert!(dir.path().join("_staging").exists(), "open files are there");
    sink.flush().unwrap();
    sink.finish().unwrap();
    assert!(!dir.path().join("_staging").exists());
    let published = files(dir.path(), false);
    assert_eq!(published.len(), 2, "{published:?}");
    assert!(published[0].starts_with("country=DE/part-"));
}

#[test]
fn an_object_store_gets_each_file_whole() {
    let url = format!("memory://parquet-sink-{}/out", std::process::id());
    let config = config(json!({"url": url, "roll": {"rows": 2, "seconds": 3600}})).unwrap();
    let (mut sink, mut committer) = open(&config);
    sink.begin_epoch(4, 0);
    sink.write_batch(&rows(&[1, 2], &[None; 2])).unwrap();
    sink.flush().unwrap();
    let at = riffle_storage::Location::parse(&url, &Default::default()).unwrap();
    let names = |at: &riffle_storage::Location| -> Vec<String> {
        at.list("").unwrap().into_iter().map(|(n, _)| n).collect()
    };
    assert_eq!(names(&at), ["_staging/4/0-0-0.parquet.staged"]);
    committer.commit(4, 0).unwrap();
    assert_eq!(names(&at), ["part-4-0-0.parquet"]);
    let bytes = at.get("part-4-0-0.parquet").unwrap().unwrap();
    let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(batches[0].num_rows(), 2);
}
