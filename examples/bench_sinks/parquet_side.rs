//! Parquet: Riffle's `parquet` sink (a local folder, or a prefix on S3) against `ArrowWriter`
//! writing the same batches, with the same compression, into one file or one object.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use riffle_storage::{Location, StoreOptions};
use serde_json::json;

use crate::data::{digest_batches, schema, Digest};
use crate::{riffle_run, Side, Target};

/// The sink's own default (`compression: zstd`, at zstd's default level).
fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build()
}

/// Into a local folder: Riffle's into `<base>/riffle/`, the plain one `<base>/plain/part-0.parquet`.
pub struct LocalParquet {
    base: PathBuf,
}

impl LocalParquet {
    pub fn new(base: &Path) -> Result<LocalParquet> {
        std::fs::create_dir_all(base)?;
        Ok(LocalParquet {
            base: base.to_path_buf(),
        })
    }

    fn dir(&self, side: Side) -> PathBuf {
        self.base.join(side.name())
    }
}

impl Target for LocalParquet {
    fn label(&self) -> String {
        "parquet, local folder (zstd)".into()
    }

    fn clean(&mut self) -> Result<()> {
        for side in [Side::Riffle, Side::Plain] {
            let dir = self.dir(side);
            if dir.exists() {
                std::fs::remove_dir_all(&dir).with_context(|| dir.display().to_string())?;
            }
        }
        Ok(())
    }

    fn run(&mut self, side: Side, batches: &[RecordBatch], every: usize) -> Result<Duration> {
        let dir = self.dir(side);
        match side {
            Side::Riffle => riffle_run(
                json!({"parquet": {"path": dir, "compression": "zstd"}}),
                batches,
                every,
            ),
            Side::Plain => {
                let start = Instant::now();
                std::fs::create_dir_all(&dir)?;
                let file = File::create(dir.join("part-0.parquet"))?;
                let mut writer = ArrowWriter::try_new(file, schema(), Some(properties()))?;
                for batch in batches {
                    writer.write(batch)?;
                }
                writer.close()?;
                Ok(start.elapsed())
            }
        }
    }

    fn read_back(&mut self, side: Side) -> Result<Digest> {
        let mut files = Vec::new();
        parquet_files(&self.dir(side), &mut files)?;
        let mut batches = Vec::new();
        for path in files {
            let file = File::open(&path)?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .with_context(|| path.display().to_string())?
                .build()?;
            for batch in reader {
                batches.push(batch?);
            }
        }
        digest_batches(&batches)
    }
}

/// The published `.parquet` files under `dir`, skipping `_staging/` and hidden names as a
/// reader of the folder (DuckDB, pyarrow) does.
fn parquet_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('_') || name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            parquet_files(&path, out)?;
        } else if name.ends_with(".parquet") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

pub const S3_LABEL: &str = "parquet, S3 on S3Proxy (zstd)";

/// Onto S3 (S3Proxy here): Riffle's under `s3://<bucket>/<prefix>/riffle/`, the plain one as
/// the object `<prefix>/plain/part-0.parquet`, PUT whole once written (through
/// `riffle_storage::Location`, a thin blocking wrapper of the `object_store` crate's client).
pub struct S3Parquet {
    url: String,
}

impl S3Parquet {
    pub fn new(bucket: &str) -> S3Parquet {
        S3Parquet {
            url: format!("s3://{bucket}/bench-sinks-{}", std::process::id()),
        }
    }

    fn location(&self, side: Side) -> Result<Location> {
        let url = format!("{}/{}", self.url, side.name());
        Location::parse(&url, &StoreOptions::default()).with_context(|| url.clone())
    }
}

impl Target for S3Parquet {
    fn label(&self) -> String {
        S3_LABEL.into()
    }

    fn clean(&mut self) -> Result<()> {
        for side in [Side::Riffle, Side::Plain] {
            let at = self.location(side)?;
            for (name, _) in at.list("")? {
                at.delete(&name)?;
            }
        }
        Ok(())
    }

    fn run(&mut self, side: Side, batches: &[RecordBatch], every: usize) -> Result<Duration> {
        match side {
            Side::Riffle => riffle_run(
                json!({"parquet": {"url": format!("{}/riffle", self.url), "compression": "zstd"}}),
                batches,
                every,
            ),
            Side::Plain => {
                // The client is made before the clock starts, as the sink's is (by `build`).
                let at = self.location(side)?;
                let start = Instant::now();
                let mut writer = ArrowWriter::try_new(Vec::new(), schema(), Some(properties()))?;
                for batch in batches {
                    writer.write(batch)?;
                }
                at.put("part-0.parquet", writer.into_inner()?)?;
                Ok(start.elapsed())
            }
        }
    }

    fn read_back(&mut self, side: Side) -> Result<Digest> {
        let at = self.location(side)?;
        let mut batches = Vec::new();
        for (name, _) in at.list("")? {
            let hidden = name
                .split('/')
                .any(|part| part.starts_with('_') || part.starts_with('.'));
            if hidden || !name.ends_with(".parquet") {
                continue;
            }
            let bytes = at.get(&name)?.with_context(|| format!("{name} vanished"))?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .with_context(|| name.clone())?
                .build()?;
            for batch in reader {
                batches.push(batch?);
            }
        }
        digest_batches(&batches)
    }
}
