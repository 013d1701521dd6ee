//! Avro object container files (`.avro`): a source reading a file, a directory of them, or
//! the files a glob matches, into batches of one schema.
//!
//! Every file is read into one reader schema (arrow-avro's schema resolution): the `.avsc`
//! named by `reader_schema`, else the first file's own schema, so files written with older or
//! newer compatible versions of it (fields added with defaults, removed, promoted) give the
//! same columns. A file that cannot be read into it is refused when the source is opened.
//!
//! Files are dealt to workers whole: worker i of n reads the files at positions p (in name
//! order) with p % n == i. A corrupt block fails the run, naming the file: an object container
//! file's rows cannot be found again past a block that does not decode (arrow-avro's reader
//! has no way to skip to the next sync marker), and leaving out the rest of a file unseen would
//! lose data silently.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_avro::reader::{Reader, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, SCHEMA_METADATA_KEY};
use arrow_schema::SchemaRef;
use riffle_dataflow::range::Range;
use riffle_dataflow::source::SourceBatch;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::formats::excerpt;
use crate::kind::{shared, Limits, SourceKind};

/// `source: { avro: { path, batch_size, reader_schema } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AvroSourceConfig {
    /// A file, a directory (its `.avro` files), or a pattern with `*` and `?` in the file name
    /// (`data/part-*.avro`).
    pub path: PathBuf,
    /// Rows per batch at most; a batch never spans two files.
    #[serde_inline_default(1024)]
    pub batch_size: usize,
    /// An Avro schema (`.avsc`) every file is read into; unset: the first file's schema.
    #[serde(default)]
    pub reader_schema: Option<PathBuf>,
}

/// A configured Avro source: its files in name order and the schema they are read into.
#[derive(Debug)]
pub struct AvroSource {
    files: Vec<PathBuf>,
    reader: AvroSchema,
    schema: SchemaRef,
    batch_size: usize,
}

fn config_error(message: impl std::fmt::Display) -> DataflowError {
    DataflowError::Config(format!("avro source: {message}"))
}

impl AvroSource {
    /// Lists the files and checks that each one can be read into the reader schema.
    pub fn new(config: &AvroSourceConfig) -> DataflowResult<Self> {
        shared::BATCH_SIZE.check_int(config.batch_size as u64)?;
        let files = list(&config.path)?;
        let first = files
            .first()
            .ok_or_else(|| config_error(format!("no files in {}", config.path.display())))?;
        let reader = match &config.reader_schema {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    config_error(format!(
                        "reader_schema: cannot read {}: {e}; expected an Avro schema (.avsc)",
                        path.display()
                    ))
                })?;
                AvroSchema::new(text)
            }
            None => own_schema(first)?,
        };
        let mut schema = None;
        for file in &files {
            let opened = open(file, &reader, config.batch_size).map_err(config_error)?;
            schema.get_or_insert_with(|| opened.schema());
        }
        let schema =
            schema.ok_or_else(|| config_error(format!("no files in {}", config.path.display())))?;
        Ok(AvroSource {
            files,
            reader,
            schema,
            batch_size: config.batch_size,
        })
    }

    /// The files read, in the order they are dealt to workers.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

/// The writer schema in `path`'s header.
fn own_schema(path: &Path) -> DataflowResult<AvroSchema> {
    let (file, _) = crate::files::open_regular(path)?;
    let reader = ReaderBuilder::new()
        .build(BufReader::new(file))
        .map_err(|e| config_error(unreadable(path, &e)))?;
    let text = reader
        .avro_header()
        .get(SCHEMA_METADATA_KEY)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| {
            config_error(format!(
                "{} has no Avro schema in its header",
                path.display()
            ))
        })?;
    Ok(AvroSchema::new(text.to_string()))
}

fn unreadable(path: &Path, e: &dyn std::fmt::Display) -> String {
    excerpt(&format!(
        "{} cannot be read as an Avro object container file with the reader schema: {e}",
        path.display()
    ))
}

/// A reader of `path` into `reader`; the error says which file and why.
fn open(
    path: &Path,
    reader: &AvroSchema,
    batch_size: usize,
) -> Result<Reader<BufReader<File>>, String> {
    let (file, _) = crate::files::open_regular(path).map_err(|e| e.to_string())?;
    ReaderBuilder::new()
        .with_batch_size(batch_size)
        .with_reader_schema(reader.clone())
        .build(BufReader::new(file))
        .map_err(|e| unreadable(path, &e))
}

/// The files `path` names: itself, a directory's `.avro` files, or a pattern's matches; in
/// name order.
fn list(path: &Path) -> DataflowResult<Vec<PathBuf>> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.contains(['*', '?']) {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if dir.to_string_lossy().contains(['*', '?']) {
            return Err(config_error(format!(
                "`{}`: wildcards are allowed in the file name only",
                path.display()
            )));
        }
        let files = regular_files(dir, |file| wildcard_match(&name, file))?;
        if files.is_empty() {
            return Err(config_error(format!(
                "no file matches `{}`",
                path.display()
            )));
        }
        return Ok(files);
    }
    let meta = std::fs::metadata(path)
        .map_err(|e| DataflowError::io(format!("avro source: reading {}", path.display()), e))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let files = regular_files(path, |file| {
        !file.starts_with('.')
            && Path::new(file)
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("avro"))
    })?;
    if files.is_empty() {
        return Err(config_error(format!(
            "{} holds no .avro files",
            path.display()
        )));
    }
    Ok(files)
}

/// The regular files of `dir` whose names pass `keep`, sorted.
fn regular_files(dir: &Path, keep: impl Fn(&str) -> bool) -> DataflowResult<Vec<PathBuf>> {
    let listing = |e| DataflowError::io(format!("avro source: listing {}", dir.display()), e);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep(&name) && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Shell-style match of `name` against `pattern` with `*` (any run) and `?` (one character).
fn wildcard_match(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    // Two cursors, backtracking to the last `*`.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match (pattern.get(p), name.get(n)) {
            (Some('?'), _) => (p, n) = (p + 1, n + 1),
            (Some('*'), _) => {
                star = Some((p, n));
                p += 1;
            }
            (Some(a), Some(b)) if a == b => (p, n) = (p + 1, n + 1),
            _ => match star {
                Some((s, m)) => {
                    star = Some((s, m + 1));
                    (p, n) = (s + 1, m + 1);
                }
                None => return false,
            },
        }
    }
    pattern.iter().skip(p).all(|c| *c == '*')
}

impl SourceFactory for AvroSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(self.schema.clone())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        crate::check_partition(index, peers)?;
        let files: Vec<PathBuf> = self
            .files
            .iter()
            .enumerate()
            .filter(|(p, _)| p % peers == index)
            .map(|(_, f)| f.clone())
            .collect();
        Ok(Box::new(AvroPartition {
            files: files.into_iter(),
            current: None,
            reader: self.reader.clone(),
            schema: self.schema.clone(),
            batch_size: self.batch_size,
        }))
    }
}

/// One worker's files, read one after the other.
struct AvroPartition {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<(PathBuf, Reader<BufReader<File>>)>,
    reader: AvroSchema,
    schema: SchemaRef,
    batch_size: usize,
}

impl Source for AvroPartition {
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        loop {
            let (path, reader) = match &mut self.current {
                Some(current) => current,
                None => {
                    let Some(path) = self.files.next() else {
                        return Ok(None);
                    };
                    let reader = open(&path, &self.reader, self.batch_size)
                        .map_err(|e| DataflowError::stage("source", e))?;
                    self.current.insert((path, reader))
                }
            };
            let batch = match reader.next() {
                Some(Ok(batch)) => batch,
                Some(Err(e)) => {
                    return Err(DataflowError::stage(
                        "source",
                        excerpt(&format!(
                            "reading {}: {e} (an Avro file cannot be read past a block that does \
                             not decode)",
                            path.display()
                        )),
                    ))
                }
                None => {
                    self.current = None;
                    continue;
                }
            };
            if batch.num_rows() == 0 {
                continue;
            }
            // Every file's reader maps the reader schema to the same columns.
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            let records = RecordBatch::try_new_with_options(
                self.schema.clone(),
                batch.columns().to_vec(),
                &options,
            )?;
            return Ok(Some(SourceBatch::new(records, Vec::new())));
        }
    }
}

impl SourceKind for AvroSourceConfig {
    fn kind(&self) -> &'static str {
        "avro"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        let mut paths = vec![&mut self.path];
        paths.extend(self.reader_schema.as_mut());
        paths
    }
    /// The file or directory, or a pattern's directory; the reader schema.
    fn inputs(&self) -> Vec<&Path> {
        let is_pattern = self
            .path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(['*', '?']));
        let mut inputs = match (is_pattern, self.path.parent()) {
            (true, Some(dir)) if !dir.as_os_str().is_empty() => vec![dir],
            (true, _) => Vec::new(),
            (false, _) => vec![self.path.as_path()],
        };
        inputs.extend(self.reader_schema.as_deref());
        inputs
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Ok(Box::new(AvroSource::new(self)?))
    }
}

impl Limits for AvroSourceConfig {
    const RANGES: &'static [Range] = &[shared::BATCH_SIZE];
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Array, Float64Array, Int64Array, StringArray};
    use arrow_avro::writer::AvroWriter;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn write(path: &Path, ids: &[i64]) {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ]);
        let names: Vec<String> = ids.iter().map(|i| format!("n{i}")).collect();
        let batch = RecordBatch::try_new(
            Arc::new(schema.clone()),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap();
        let mut writer = AvroWriter::new(File::create(path).unwrap(), schema).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
    }

    fn config(value: serde_json::Value) -> AvroSourceConfig {
        serde_json::from_value(value).unwrap()
    }

    /// Every batch of worker `index` of `peers`.
    fn read(source: &AvroSource, index: usize, peers: usize) -> Vec<RecordBatch> {
        let mut partition = source.partition(index, peers).unwrap();
        let mut batches = Vec::new();
        while let Some(batch) = partition.next_batch().unwrap() {
            assert!(batch.rejected.is_empty());
            assert_eq!(batch.records.schema(), source.schema().unwrap());
            batches.push(batch.records);
        }
        batches
    }

    fn ids(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                let column = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                column.values().to_vec()
            })
            .collect()
    }

    #[test]
    fn files_are_dealt_whole_to_workers_and_every_row_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a.avro"), &[1, 2, 3]);
        write(&dir.path().join("b.avro"), &[4, 5]);
        std::fs::write(dir.path().join("notes.txt"), "not avro").unwrap();

        let source = AvroSource::new(&config(
            serde_json::json!({"path": dir.path(), "batch_size": 2}),
        ))
        .unwrap();
        assert_eq!(source.files().len(), 2);
        let schema = source.schema().unwrap();
        assert_eq!(schema.field(0).data_type(), &DataType::Int64);
        assert_eq!(schema.field(1).data_type(), &DataType::Utf8);
        let first = read(&source, 0, 2);
        let second = read(&source, 1, 2);
        assert_eq!(ids(&first), [1, 2, 3]);
        assert!(first.iter().all(|b| b.num_rows() <= 2), "batch_size holds");
        assert_eq!(ids(&second), [4, 5]);
        assert_eq!(ids(&read(&source, 0, 1)), [1, 2, 3, 4, 5]);
        assert!(ids(&read(&source, 2, 3)).is_empty());
        assert!(source.partition(2, 2).is_err());

        let pattern = dir.path().join("?.avro");
        let source = AvroSource::new(&config(serde_json::json!({"path": pattern}))).unwrap();
        assert_eq!(ids(&read(&source, 0, 1)), [1, 2, 3, 4, 5]);
        let one = dir.path().join("b.avro");
        let source = AvroSource::new(&config(serde_json::json!({"path": one}))).unwrap();
        assert_eq!(ids(&read(&source, 0, 1)), [4, 5]);

        let none = dir.path().join("*.parquet");
        let e = AvroSource::new(&config(serde_json::json!({"path": none}))).unwrap_err();
        assert!(e.to_string().contains("no file matches"), "{e}");
        let e = AvroSource::new(&config(
            serde_json::json!({"path": dir.path(), "batch_size": 0}),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("batch_size"), "{e}");
    }

    #[test]
    fn a_reader_schema_fills_added_fields_with_their_defaults_and_refuses_what_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a.avro"), &[1, 2]);
        let avsc = dir.path().join("v2.avsc");
        std::fs::write(
            &avsc,
            r#"{"type": "record", "name": "topLevelRecord", "fields": [
                {"name": "id", "type": "long"},
                {"name": "score", "type": "double", "default": 0.5}]}"#,
        )
        .unwrap();
        let c = config(serde_json::json!({"path": dir.path(), "reader_schema": avsc}));
        assert_eq!(c.inputs(), [dir.path(), avsc.as_path()]);
        let source = AvroSource::new(&c).unwrap();
        let batches = read(&source, 0, 1);
        let names: Vec<String> = source
            .schema()
            .unwrap()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["id", "score"]);
        assert_eq!(ids(&batches), [1, 2]);
        let score = batches[0]
            .column(1)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        assert_eq!(score.values().to_vec(), [0.5, 0.5]);

        // A required field the files lack: refused when the source is opened, naming the file.
        let bad = dir.path().join("bad.avsc");
        std::fs::write(
            &bad,
            r#"{"type": "record", "name": "topLevelRecord", "fields": [
                {"name": "id", "type": "long"}, {"name": "missing", "type": "string"}]}"#,
        )
        .unwrap();
        let e = AvroSource::new(&config(
            serde_json::json!({"path": dir.path(), "reader_schema": bad}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("a.avro cannot be read"), "{e}");
    }

    #[test]
    fn a_corrupt_block_fails_the_run_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.avro");
        write(&path, &[1, 2, 3]);
        // The block's sync marker (the file's last 16 bytes) no longer matches the header's.
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let source = AvroSource::new(&config(serde_json::json!({"path": path}))).unwrap();
        let mut partition = source.partition(0, 1).unwrap();
        let e = partition.next_batch().unwrap_err().to_string();
        assert!(e.contains("a.avro"), "{e}");
        assert!(e.contains("sync marker"), "{e}");
    }

    #[test]
    fn patterns_match_shell_style() {
        assert!(wildcard_match("*.avro", "part-1.avro"));
        assert!(wildcard_match("part-?.avro", "part-1.avro"));
        assert!(!wildcard_match("part-?.avro", "part-10.avro"));
        assert!(wildcard_match("p*t*.avro", "part-10.avro"));
        assert!(!wildcard_match("*.avro", "part.avro.tmp"));
        assert!(wildcard_match("*", ""));
    }
}
