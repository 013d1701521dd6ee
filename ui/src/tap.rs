//! The live view's tap: what a person watching a running camera pipeline sees, taken from
//! the side of the dataflow ([`LiveObserver`]) without holding anything up in it.
//!
//! Each batch a source reads is offered ([`LiveTap::sample_frames`]): at most
//! `frames_per_second` frames per camera are copied out (JPEG/PNG bytes as read, or raw RGB
//! pixels of a decoded frame), the rest are not touched. The sink offers every result and dead
//! letter as it arrives, before its epoch commits ([`LiveTap::results`],
//! [`LiveTap::dead_letters`]). The view drains the tap now and then ([`LiveTap::drain`]).
//! Everything is bounded: a viewer that stops draining costs a few frames and rows of memory,
//! never a stalled worker. What a camera frame is (`camera_id`, `frame`, `bytes` or `pixels`
//! with `width` and `height`) is known here, not in the engine.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, UInt32Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use riffle_dataflow::observe::live::LiveObserver;

/// Frames waiting for a viewer, over all cameras; older ones are dropped first.
const MAX_WAITING_FRAMES: usize = 64;
/// Results of camera frames waiting for a viewer (to be matched with sampled frames, which may
/// have been sampled in another process).
const MAX_CAMERA_ROWS: usize = 512;

/// How a sampled frame's picture is held.
#[derive(Clone, Debug)]
pub enum FrameImage {
    /// The file or message bytes as read (JPEG, PNG).
    Encoded(Vec<u8>),
    /// Packed RGB, 3 bytes a pixel, row by row (a decoded frame of a stream).
    Rgb {
        width: u32,
        height: u32,
        pixels: Vec<u8>,
    },
}

/// One sampled frame of a camera.
#[derive(Clone, Debug)]
pub struct Frame {
    pub camera_id: String,
    pub frame: i64,
    pub image: FrameImage,
}

/// What accumulated since the last [`LiveTap::drain`].
#[derive(Debug, Default)]
pub struct Drained {
    pub frames: Vec<Frame>,
    /// The latest result rows as JSON objects (binary columns left out), oldest first.
    pub rows: Vec<String>,
    /// Every result row that has a `camera_id` and a `frame` (up to a bound), as JSON objects:
    /// a viewer matches them with the sampled frames.
    pub camera_rows: Vec<String>,
    /// Dead letters as JSON objects (`stage`, `reason`, `record`), oldest first.
    pub dead_letters: Vec<String>,
    /// Results and dead letters that arrived (more than `rows` and `dead_letters` hold when
    /// they came faster than the viewer drained).
    pub results_count: u64,
    pub dead_letters_count: u64,
}

#[derive(Default)]
struct State {
    sampled_at: HashMap<String, Instant>,
    frames: VecDeque<Frame>,
    rows: VecDeque<String>,
    camera_rows: VecDeque<String>,
    dead_letters: VecDeque<String>,
    results_count: u64,
    dead_letters_count: u64,
}

/// See the [module documentation](self).
pub struct LiveTap {
    frame_interval: Duration,
    max_rows: usize,
    state: Mutex<State>,
}

impl LiveTap {
    /// A tap keeping at most `frames_per_second` frames per camera and the latest `max_rows`
    /// results and dead letters.
    pub fn new(frames_per_second: f64, max_rows: usize) -> Self {
        let frame_interval = if frames_per_second > 0.0 && frames_per_second.is_finite() {
            Duration::from_secs_f64(1.0 / frames_per_second)
        } else {
            Duration::MAX
        };
        LiveTap {
            frame_interval,
            max_rows: max_rows.max(1),
            state: Mutex::new(State::default()),
        }
    }

    /// Copies out the frames of `batch` that are due: a batch with a `camera_id` (Utf8) and
    /// `frame` (Int64) column, and either the encoded picture in `bytes` (Binary) or a decoded
    /// frame in `pixels` (Binary, RGB) with `width` and `height` (UInt32). Other batches are
    /// left alone.
    pub fn sample_frames(&self, batch: &RecordBatch) {
        let (Some(cameras), Some(frames)) = (
            batch
                .column_by_name("camera_id")
                .and_then(|c| c.as_string_opt::<i32>()),
            batch
                .column_by_name("frame")
                .and_then(|c| c.as_primitive_opt::<Int64Type>()),
        ) else {
            return;
        };
        let encoded = batch
            .column_by_name("bytes")
            .filter(|c| c.data_type() == &DataType::Binary)
            .map(|c| c.as_binary::<i32>());
        let raw = match (
            batch
                .column_by_name("pixels")
                .filter(|c| c.data_type() == &DataType::Binary)
                .map(|c| c.as_binary::<i32>()),
            batch
                .column_by_name("width")
                .and_then(|c| c.as_primitive_opt::<UInt32Type>()),
            batch
                .column_by_name("height")
                .and_then(|c| c.as_primitive_opt::<UInt32Type>()),
        ) {
            (Some(p), Some(w), Some(h)) => Some((p, w, h)),
            _ => None,
        };
        if encoded.is_none() && raw.is_none() {
            return;
        }
        let now = Instant::now();
        let mut state = self.lock();
        for row in 0..batch.num_rows() {
            if cameras.is_null(row) || frames.is_null(row) {
                continue;
            }
            let camera = cameras.value(row);
            let due = state
                .sampled_at
                .get(camera)
                .is_none_or(|at| now.duration_since(*at) >= self.frame_interval);
            if !due {
                continue;
            }
            let image = if let Some(bytes) = encoded.filter(|b| !b.is_null(row)) {
                FrameImage::Encoded(bytes.value(row).to_vec())
            } else if let Some((p, w, h)) = raw.filter(|(p, _, _)| !p.is_null(row)) {
                let (width, height) = (w.value(row), h.value(row));
                let pixels = p.value(row);
                if pixels.len() as u64 != u64::from(width) * u64::from(height) * 3 {
                    continue;
                }
                FrameImage::Rgb {
                    width,
                    height,
                    pixels: pixels.to_vec(),
                }
            } else {
                continue;
            };
            state.sampled_at.insert(camera.to_string(), now);
            if state.frames.len() >= MAX_WAITING_FRAMES {
                state.frames.pop_front();
            }
            state.frames.push_back(Frame {
                camera_id: camera.to_string(),
                frame: frames.value(row),
                image,
            });
        }
    }

    /// Keeps the latest result rows of `batch`, and every row of a camera's frame (bounded).
    pub fn results(&self, batch: &RecordBatch) {
        let of_cameras = batch
            .column_by_name("camera_id")
            .is_some_and(|c| c.as_string_opt::<i32>().is_some())
            && batch
                .column_by_name("frame")
                .is_some_and(|c| c.as_primitive_opt::<Int64Type>().is_some());
        // Camera pipelines make tens to hundreds of rows a second: all of them are turned into
        // JSON. Tabular ones may make many thousands: only the tail is.
        let rows = json_rows(
            batch,
            if of_cameras {
                usize::MAX
            } else {
                self.max_rows
            },
        );
        let mut state = self.lock();
        state.results_count += batch.num_rows() as u64;
        if of_cameras {
            let tail = rows.len().saturating_sub(self.max_rows);
            let latest = rows.iter().skip(tail).cloned().collect();
            push_bounded(&mut state.rows, latest, self.max_rows);
            push_bounded(&mut state.camera_rows, rows, MAX_CAMERA_ROWS);
        } else {
            push_bounded(&mut state.rows, rows, self.max_rows);
        }
    }

    /// Keeps the latest dead letters of `batch` (in [`riffle_dataflow::dead_letter::schema`]).
    pub fn dead_letters(&self, batch: &RecordBatch) {
        let rows = json_rows(batch, self.max_rows);
        let mut state = self.lock();
        state.dead_letters_count += batch.num_rows() as u64;
        push_bounded(&mut state.dead_letters, rows, self.max_rows);
    }

    /// Takes what accumulated since the last call.
    pub fn drain(&self) -> Drained {
        let mut state = self.lock();
        Drained {
            frames: state.frames.drain(..).collect(),
            rows: state.rows.drain(..).collect(),
            camera_rows: state.camera_rows.drain(..).collect(),
            dead_letters: state.dead_letters.drain(..).collect(),
            results_count: std::mem::take(&mut state.results_count),
            dead_letters_count: std::mem::take(&mut state.dead_letters_count),
        }
    }

    // A poisoned lock only means a worker panicked mid-update; what is there is still usable.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LiveObserver for LiveTap {
    fn source_batch(&self, batch: &RecordBatch) {
        self.sample_frames(batch);
    }
    fn results(&self, batch: &RecordBatch) {
        LiveTap::results(self, batch);
    }
    fn dead_letters(&self, batch: &RecordBatch) {
        LiveTap::dead_letters(self, batch);
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

fn push_bounded(queue: &mut VecDeque<String>, rows: Vec<String>, max: usize) {
    for row in rows {
        if queue.len() >= max {
            queue.pop_front();
        }
        queue.push_back(row);
    }
}

/// The last `max` rows of `batch` as JSON objects, binary columns left out (frames, tensors of
/// bytes: nothing a table can show).
fn json_rows(batch: &RecordBatch, max: usize) -> Vec<String> {
    let keep: Vec<usize> = batch
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            !matches!(
                f.data_type(),
                DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeBinary(_)
            )
        })
        .map(|(i, _)| i)
        .collect();
    let Ok(projected) = batch.project(&keep) else {
        return Vec::new();
    };
    let from = projected.num_rows().saturating_sub(max);
    let tail = projected.slice(from, projected.num_rows() - from);
    let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
    if writer.write(&tail).and_then(|()| writer.finish()).is_err() {
        return Vec::new();
    }
    String::from_utf8_lossy(&writer.into_inner())
        .lines()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    fn frames(cameras: &[&str], first: i64) -> RecordBatch {
        let n = cameras.len();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("camera_id", DataType::Utf8, false),
                Field::new("frame", DataType::Int64, false),
                Field::new("bytes", DataType::Binary, false),
            ])),
            vec![
                Arc::new(StringArray::from(cameras.to_vec())),
                Arc::new(Int64Array::from_iter_values(first..first + n as i64)),
                Arc::new(BinaryArray::from_iter_values((0..n).map(|_| b"jpeg"))),
            ],
        )
        .unwrap()
    }

    #[test]
    fn samples_at_most_the_rate_per_camera() {
        let tap = LiveTap::new(1.0, 10);
        tap.sample_frames(&frames(&["a", "a", "b", "a", "b"], 0));
        let drained = tap.drain();
        let got: Vec<(String, i64)> = drained
            .frames
            .iter()
            .map(|f| (f.camera_id.clone(), f.frame))
            .collect();
        // One frame a second per camera: the first of each.
        assert_eq!(got, vec![("a".into(), 0), ("b".into(), 2)]);
        tap.sample_frames(&frames(&["a"], 5));
        assert!(tap.drain().frames.is_empty(), "a second has not passed");
    }

    #[test]
    fn keeps_the_latest_rows_without_binary_columns() {
        let tap = LiveTap::new(5.0, 3);
        tap.results(&frames(&["a", "b", "c", "d"], 0));
        tap.results(&frames(&["e"], 4));
        let drained = tap.drain();
        assert_eq!(drained.results_count, 5);
        assert_eq!(drained.camera_rows.len(), 5, "every row of a camera");
        let rows = drained.rows;
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0], r#"{"camera_id":"c","frame":2}"#);
        assert_eq!(rows[2], r#"{"camera_id":"e","frame":4}"#);
        assert!(tap.drain().rows.is_empty());
    }
}
