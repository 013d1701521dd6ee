//! Images source: the image files under a directory, one row per file with its raw bytes.
//!
//! Each directory holding images is a camera, named by its path relative to the configured
//! directory (`frames/bikes/0007.jpg` under `frames` is camera `bikes`; files directly in it
//! are camera `default`). A file's frame number is the last run of digits in its name
//! (`0007.jpg` is frame 7), or its position among the camera's files when it has none.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::source::SourceBatch;
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::kind::Limits;
use crate::kind::{shared, SourceKind};
use riffle_dataflow::range::Range;

mod listing;

use listing::{assign_cameras, list_images};

/// Column names of the images source.
pub const CAMERA_ID: &str = "camera_id";
pub const FRAME: &str = "frame";
pub const PATH: &str = "path";
pub const BYTES: &str = "bytes";

/// The camera of files directly in a folder without a name of its own (`/`).
pub const DEFAULT_CAMERA: &str = "default";

/// `source: { images: { path, cameras, batch_size, repeat, extensions } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    /// Directory searched recursively for images.
    pub path: PathBuf,
    /// Splits each directory's files into this many contiguous cameras, `<dir>-0` ..
    /// `<dir>-(N-1)`, keeping the files' frame numbers.
    #[serde(default)]
    pub cameras: Option<usize>,
    /// Images per batch, and per chunk dealt to a worker.
    #[serde_inline_default(8)]
    pub batch_size: usize,
    /// Reads the whole list this many times (benchmarks); repetition `r` adds `r * span` to
    /// every frame, `span` being more than any frame number, so rows stay unique.
    #[serde_inline_default(1)]
    pub repeat: usize,
    /// File extensions that count as images, matched case-insensitively.
    #[serde_inline_default(["jpg", "jpeg", "png", "webp"].map(String::from).to_vec())]
    pub extensions: Vec<String>,
    /// How files are dealt to workers: `batch` (chunks round-robin: even load) or `camera`
    /// (camera k to worker k mod workers, its frames in order, interleaved with the worker's
    /// other cameras as live streams would arrive: per-camera order end to end).
    #[serde(default)]
    pub partition_by: PartitionBy,
    /// Live pace: at most this many images per second per worker (unset: as fast as they can
    /// be read), e.g. 25 × the worker's cameras to replay them as real-time streams.
    #[serde(default)]
    pub max_records_per_second: Option<f64>,
    /// Live cameras: each camera's k-th frame is read k / fps seconds after the start, as a
    /// camera streaming at this frame rate delivers it (needs `partition_by: camera`). A
    /// batch holds the frames due by then, up to `batch_size`; between frames the worker runs
    /// its stages instead of waiting.
    #[serde(default)]
    pub fps: Option<f64>,
    /// Largest file read; a larger one is a dead letter naming it and its size.
    #[serde_inline_default(DEFAULT_MAX_FILE_BYTES)]
    pub max_file_bytes: u64,
}

/// Default `max_file_bytes`: 64 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;
/// The most bytes a Binary column (32-bit offsets) holds: a batch's files stay within it.
const BINARY_LIMIT: u64 = i32::MAX as u64;
/// A file must fit one batch's Binary column.
const MAX_FILE_BYTES: Range = Range::int("max_file_bytes", 1, BINARY_LIMIT as i64);

/// See [`ImagesConfig::partition_by`].
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PartitionBy {
    #[default]
    Batch,
    Camera,
}

/// Schema of the images source: `camera_id` Utf8, `frame` Int64, `path` Utf8, `bytes` Binary.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(CAMERA_ID, DataType::Utf8, false),
        Field::new(FRAME, DataType::Int64, false),
        Field::new(PATH, DataType::Utf8, false),
        Field::new(BYTES, DataType::Binary, false),
    ]))
}

/// One image file and the row it becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageEntry {
    pub path: PathBuf,
    pub camera_id: String,
    pub frame: i64,
}

/// A configured images source: the files are listed once, sorted by camera, then path; their
/// contents are read a batch at a time by the worker that owns the batch. The list (repeated
/// `repeat` times) is cut into chunks of `batch_size` and chunk `c` goes to worker
/// `c % peers`.
#[derive(Debug)]
pub struct ImagesSource {
    entries: Arc<[ImageEntry]>,
    batch_size: usize,
    repeat: usize,
    partition_by: PartitionBy,
    /// Frame offset between repetitions.
    span: i64,
    pace: Option<f64>,
    fps: Option<f64>,
    /// With `fps`: the cameras' common start, set by the first partition to look (workers of
    /// one process share it, so their frames k are due together).
    started: Arc<std::sync::OnceLock<std::time::Instant>>,
    max_file_bytes: u64,
    /// Most file bytes in one batch (a Binary column's limit; lowered by tests).
    batch_bytes: u64,
}

impl ImagesSource {
    pub fn new(config: &ImagesConfig) -> DataflowResult<Self> {
        let config_error = |m: String| DataflowError::Config(format!("images source: {m}"));
        if config.batch_size == 0 {
            return Err(config_error("batch_size must be at least 1".into()));
        }
        if config.repeat == 0 {
            return Err(config_error("repeat must be at least 1".into()));
        }
        if config.cameras == Some(0) {
            return Err(config_error("cameras must be at least 1".into()));
        }
        if config.fps.is_some() && config.partition_by != PartitionBy::Camera {
            return Err(config_error(
                "fps replays cameras: it needs partition_by: camera".into(),
            ));
        }
        MAX_FILE_BYTES.check_int(config.max_file_bytes)?;
        if !config.path.is_dir() {
            return Err(config_error(format!(
                "{} is not a directory",
                config.path.display()
            )));
        }
        let extensions: Vec<String> = config
            .extensions
            .iter()
            .map(|e| e.trim_start_matches('.').to_ascii_lowercase())
            .collect();
        let mut files = Vec::new();
        let mut visited = HashSet::new();
        list_images(&config.path, &extensions, &mut visited, &mut files)?;
        if files.is_empty() {
            return Err(config_error(format!(
                "no files with extensions {:?} under {}",
                extensions,
                config.path.display()
            )));
        }
        let entries = assign_cameras(&config.path, files, config.cameras);
        let max_frame = entries.iter().map(|e| e.frame).max().unwrap_or(0);
        let span = i64::try_from(entries.len())
            .unwrap_or(i64::MAX)
            .max(max_frame.saturating_add(1));
        // The last repetition's frames must still fit in an i64.
        let last_rep = i64::try_from(config.repeat - 1).unwrap_or(i64::MAX);
        if last_rep
            .checked_mul(span)
            .and_then(|o| o.checked_add(max_frame))
            .is_none()
            || entries.len().checked_mul(config.repeat).is_none()
        {
            return Err(config_error(format!(
                "repeat {} is too large",
                config.repeat
            )));
        }
        Ok(ImagesSource {
            entries: entries.into(),
            batch_size: config.batch_size,
            repeat: config.repeat,
            partition_by: config.partition_by,
            span,
            pace: config.max_records_per_second,
            fps: config.fps,
            started: Arc::default(),
            max_file_bytes: config.max_file_bytes,
            batch_bytes: BINARY_LIMIT,
        })
    }

    /// The images in reading order (one repetition).
    pub fn entries(&self) -> &[ImageEntry] {
        &self.entries
    }
}

impl ImagesSource {
    /// Rows of the cameras worker `index` owns (the k-th camera in sorted order goes to worker
    /// k mod peers): frame by frame across its cameras, each camera in frame order. Each row
    /// comes with its position in its camera's stream (repetitions included).
    #[allow(
        clippy::indexing_slicing,
        reason = "row indices are positions in `self.entries`"
    )]
    fn camera_rows(&self, index: usize, peers: usize) -> Vec<(usize, usize)> {
        let mut cameras: Vec<&str> = self.entries.iter().map(|e| e.camera_id.as_str()).collect();
        cameras.sort_unstable();
        cameras.dedup();
        let mine: Vec<Vec<usize>> = cameras
            .iter()
            .enumerate()
            .filter(|(k, _)| k % peers == index)
            .map(|(_, camera)| {
                // Entries are sorted by camera then path, so this is frame order.
                (0..self.entries.len())
                    .filter(|i| self.entries[*i].camera_id == *camera)
                    .collect()
            })
            .collect();
        let longest = mine.iter().map(Vec::len).max().unwrap_or(0);
        let len = self.entries.len();
        let mut rows = Vec::new();
        for r in 0..self.repeat {
            for k in 0..longest {
                for camera in &mine {
                    if let Some(i) = camera.get(k) {
                        rows.push((r * len + i, r * camera.len() + k));
                    }
                }
            }
        }
        rows
    }
}

impl SourceFactory for ImagesSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(schema())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        crate::check_partition(index, peers)?;
        let total = self.entries.len() * self.repeat;
        let (rows, due) = match self.partition_by {
            PartitionBy::Batch => (
                (0..total)
                    .filter(|i| (i / self.batch_size) % peers == index)
                    .collect(),
                None,
            ),
            PartitionBy::Camera => {
                let (rows, ordinals): (Vec<usize>, Vec<usize>) =
                    self.camera_rows(index, peers).into_iter().unzip();
                let due = self.fps.map(|fps| {
                    ordinals
                        .iter()
                        .map(|k| std::time::Duration::from_secs_f64(*k as f64 / fps))
                        .collect()
                });
                (rows, due)
            }
        };
        Ok(Box::new(ImagesPartition {
            entries: self.entries.clone(),
            rows,
            next: 0,
            batch_size: self.batch_size,
            span: self.span,
            schema: schema(),
            paced: self.pace.map(crate::pace::Pacer::new),
            due,
            started: self.started.clone(),
            max_file_bytes: self.max_file_bytes,
            batch_bytes: self.batch_bytes,
        }))
    }

    fn total_records(&self) -> Option<u64> {
        u64::try_from(self.entries.len() * self.repeat).ok()
    }
}

struct ImagesPartition {
    entries: Arc<[ImageEntry]>,
    /// This worker's rows, as indices into the list repeated `repeat` times, in reading order.
    rows: Vec<usize>,
    next: usize,
    batch_size: usize,
    span: i64,
    schema: SchemaRef,
    /// `max_records_per_second`.
    paced: Option<crate::pace::Pacer>,
    /// With `fps`: when each row is due, after `started` (the first look at the schedule).
    due: Option<Vec<std::time::Duration>>,
    started: Arc<std::sync::OnceLock<std::time::Instant>>,
    max_file_bytes: u64,
    batch_bytes: u64,
}

/// Reads a whole image file of at most `max` bytes: `Ok(Err(size))` when it is larger (only
/// `max + 1` bytes are read, whatever its size claims).
fn read_limited(path: &Path, max: u64) -> DataflowResult<Result<Vec<u8>, u64>> {
    use std::io::Read;
    let (file, meta) = crate::files::open_regular(path)?;
    if meta.len() > max {
        return Ok(Err(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| DataflowError::io(format!("reading {}", path.display()), e))?;
    // It grew since `stat`.
    if bytes.len() as u64 > max {
        return Ok(Err(bytes.len() as u64));
    }
    Ok(Ok(bytes))
}

impl ImagesPartition {
    fn started(&self) -> std::time::Instant {
        *self.started.get_or_init(std::time::Instant::now)
    }

    /// With `fps`: when row `i` of this partition is due.
    fn due_at(&self, i: usize) -> Option<std::time::Instant> {
        let due = self.due.as_ref()?.get(i)?;
        Some(self.started() + *due)
    }

    /// Rows from `start` to read now: those due (at least one, waited for), up to a batch.
    fn due_end(&self, start: usize) -> usize {
        let end = start.saturating_add(self.batch_size).min(self.rows.len());
        if self.due.is_none() {
            return end;
        }
        if let Some(wait) = self
            .due_at(start)
            .and_then(|at| at.checked_duration_since(std::time::Instant::now()))
        {
            std::thread::sleep(wait);
        }
        let now = std::time::Instant::now();
        (start + 1..end)
            .find(|i| self.due_at(*i).is_some_and(|at| at > now))
            .unwrap_or(end)
    }
}

impl Source for ImagesPartition {
    fn next_due(&self) -> Option<std::time::Instant> {
        self.due_at(self.next)
    }

    fn clocked(&self) -> bool {
        self.due.is_some()
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`start..end` lies within `self.rows`, and entries are indexed modulo their length"
    )]
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        let start = self.next;
        if start >= self.rows.len() {
            return Ok(None);
        }
        let end = self.due_end(start);
        if let Some(pacer) = self.paced.as_mut() {
            pacer.admit((end - start) as u64);
        }
        self.next = end;

        let rows = end - start;
        let mut camera_ids = Vec::with_capacity(rows);
        let mut frames = Vec::with_capacity(rows);
        let mut paths = Vec::with_capacity(rows);
        let mut contents = Vec::with_capacity(rows);
        let mut rejected = Vec::new();
        let len = self.entries.len();
        let mut batch_bytes = 0u64;
        for (k, &i) in self.rows[start..end].iter().enumerate() {
            let entry = &self.entries[i % len];
            // Checked at construction not to overflow.
            let frame = entry.frame + (i / len) as i64 * self.span;
            let path = entry.path.to_string_lossy();
            let reason = match read_limited(&entry.path, self.max_file_bytes) {
                Ok(Ok(bytes)) => {
                    let size = bytes.len() as u64;
                    if !contents.is_empty() && batch_bytes + size > self.batch_bytes {
                        // The column would pass its 2 GiB: this file starts the next batch.
                        self.next = start + k;
                        break;
                    }
                    batch_bytes += size;
                    camera_ids.push(entry.camera_id.as_str());
                    frames.push(frame);
                    paths.push(path);
                    contents.push(bytes);
                    continue;
                }
                Ok(Err(size)) => format!(
                    "{path} is {size} bytes, over max_file_bytes ({})",
                    self.max_file_bytes
                ),
                Err(e) => e.to_string(),
            };
            // One unreadable or oversized file must not stop the stream.
            rejected.push(DeadLetter {
                stage: "source".to_string(),
                reason,
                record: serde_json::json!({
                    "path": path,
                    "camera_id": entry.camera_id,
                    "frame": frame,
                })
                .to_string(),
            });
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(camera_ids)),
            Arc::new(Int64Array::from(frames)),
            Arc::new(StringArray::from_iter_values(paths)),
            Arc::new(BinaryArray::from_iter_values(contents)),
        ];
        let records = RecordBatch::try_new(self.schema.clone(), columns)?;
        Ok(Some(SourceBatch::new(records, rejected)))
    }
}

impl SourceKind for ImagesConfig {
    fn kind(&self) -> &'static str {
        "images"
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        vec![&mut self.path]
    }
    fn inputs(&self) -> Vec<&Path> {
        vec![&self.path]
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Ok(Box::new(ImagesSource::new(self)?))
    }
}

impl Limits for ImagesConfig {
    const RANGES: &'static [Range] = &[
        shared::BATCH_SIZE,
        shared::CAMERAS,
        shared::MAX_RECORDS_PER_SECOND,
        Range::int("repeat", 1, 1_000_000),
        Range::real("fps", 1e-6, 1000.0),
        MAX_FILE_BYTES,
    ];
}

#[cfg(test)]
mod tests {
    use super::listing::frame_number;
    use super::*;

    fn config(path: &Path) -> ImagesConfig {
        serde_json::from_value(serde_json::json!({ "path": path })).unwrap()
    }

    /// Every batch of a one-worker partition: (paths read, dead-letter reasons) per batch.
    fn batches(source: &ImagesSource) -> Vec<(Vec<String>, Vec<String>)> {
        let mut partition = source.partition(0, 1).unwrap();
        let mut out = Vec::new();
        while let Some(batch) = partition.next_batch().unwrap() {
            let paths = batch
                .records
                .column(2)
                .as_any()
                .downcast_ref::<StringArray>();
            let names = paths
                .unwrap()
                .iter()
                .flatten()
                .map(|p| Path::new(p).file_name().unwrap().to_string_lossy().into())
                .collect();
            let reasons = batch.rejected.iter().map(|l| l.reason.clone()).collect();
            out.push((names, reasons));
        }
        out
    }

    #[test]
    fn files_over_max_file_bytes_are_dead_letters_and_batches_stay_within_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for (name, size) in [("0.jpg", 10), ("1.jpg", 300), ("2.jpg", 10), ("3.jpg", 10)] {
            std::fs::write(dir.path().join(name), vec![0u8; size]).unwrap();
        }
        let mut c = config(dir.path());
        c.max_file_bytes = 100;
        let mut source = ImagesSource::new(&c).unwrap();
        let got = batches(&source);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, ["0.jpg", "2.jpg", "3.jpg"]);
        assert_eq!(got[0].1.len(), 1);
        let reason = &got[0].1[0];
        assert!(
            reason.ends_with("1.jpg is 300 bytes, over max_file_bytes (100)"),
            "{reason}"
        );

        // A batch holding no more than 25 bytes: the rest of the chunk comes next.
        source.batch_bytes = 25;
        let got = batches(&source);
        let names: Vec<Vec<String>> = got.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names, [vec!["0.jpg", "2.jpg"], vec!["3.jpg"]]);

        c.max_file_bytes = 0;
        assert!(ImagesSource::new(&c).is_err());
    }

    #[test]
    fn a_fifo_named_like_an_image_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0.jpg"), b"x").unwrap();
        let fifo = dir.path().join("1.jpg");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = ImagesSource::new(&config(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("1.jpg is a FIFO (named pipe), not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn frame_numbers_come_from_the_last_digits() {
        assert_eq!(frame_number(Path::new("a/0007.jpg")), Some(7));
        assert_eq!(frame_number(Path::new("cam2_0013.png")), Some(13));
        assert_eq!(frame_number(Path::new("still.jpg")), None);
        assert_eq!(frame_number(Path::new("99999999999999999999.jpg")), None);
    }

    #[test]
    fn segments_are_contiguous_and_positions_restart() {
        let root = Path::new("/r");
        let files: Vec<PathBuf> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| root.join("cam").join(format!("{n}.jpg")))
            .collect();
        let got: Vec<(String, i64)> = assign_cameras(root, files, Some(2))
            .into_iter()
            .map(|e| (e.camera_id, e.frame))
            .collect();
        let want = [
            ("cam-0", 0),
            ("cam-0", 1),
            ("cam-0", 2),
            ("cam-1", 0),
            ("cam-1", 1),
        ];
        assert_eq!(
            got,
            want.map(|(c, f)| (c.to_string(), f)).to_vec(),
            "{got:?}"
        );
    }

    #[test]
    fn fps_reads_each_cameras_frames_when_due_and_says_when_the_next_is() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..6 {
            std::fs::write(dir.path().join(format!("{i}.jpg")), [0u8; 4]).unwrap();
        }
        let mut c = config(dir.path());
        c.fps = Some(20.0);
        c.cameras = Some(2);
        c.batch_size = 8;
        assert!(
            ImagesSource::new(&c).is_err(),
            "fps without partition_by: camera"
        );
        c.partition_by = PartitionBy::Camera;
        let source = ImagesSource::new(&c).unwrap();
        let mut partition = source.partition(0, 1).unwrap();
        let first = partition.next_due().unwrap();
        let mut reads = Vec::new();
        while let Some(batch) = partition.next_batch().unwrap() {
            reads.push((batch.records.num_rows(), first.elapsed()));
            if let Some(due) = partition.next_due() {
                // Frame k of both cameras is due at k × 50 ms.
                let k = reads.len() as u32;
                assert_eq!(due - first, std::time::Duration::from_millis(50) * k);
            }
        }
        // Both cameras' frame k come together, however large the batch may be.
        assert_eq!(reads.iter().map(|r| r.0).collect::<Vec<_>>(), [2, 2, 2]);
        assert!(
            reads[2].1 >= std::time::Duration::from_millis(100),
            "{reads:?}"
        );
    }
}
