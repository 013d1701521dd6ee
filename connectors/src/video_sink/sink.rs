//! The sink: rows to drawn frames, frames to each camera's current file, files rolled by stream
//! time and size; rows that cannot be drawn to the dead-letter file.

use std::collections::HashMap;
use std::path::PathBuf;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, RecordBatch};
use riffle_dataflow::dead_letter::describe_row;
use riffle_dataflow::error::{DataflowError, DataflowResult};
use riffle_dataflow::sink::{Sink, SinkFactory};

use super::encoder::{EncodeError, Live, Segment, Settings};
use super::VideoSinkConfig;
use crate::draw::{self, sanitize, Picture};
use crate::lines::AppendLines;

/// The stage named in this sink's dead letters.
const STAGE: &str = "sink.video";

pub(super) struct VideoSinkFactory {
    config: VideoSinkConfig,
}

impl VideoSinkFactory {
    pub fn new(config: VideoSinkConfig) -> Self {
        VideoSinkFactory { config }
    }
}

impl SinkFactory for VideoSinkFactory {
    fn live_stream_dir(&self) -> Option<PathBuf> {
        self.config.live.then(|| self.config.dir.clone())
    }

    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        let dir = &self.config.dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| DataflowError::io(format!("creating {}", dir.display()), e))?;
        let c = &self.config;
        Ok(Box::new(VideoSink {
            settings: Settings {
                fps: c.fps,
                crf: c.crf,
                preset: c.preset.clone(),
            },
            segment_ms: (c.segment_seconds * 1000.0).round().max(1.0) as i64,
            dead_letters: AppendLines::new(c.dead_letter_file()),
            config: self.config.clone(),
            cameras: HashMap::new(),
            rejected: 0,
        }))
    }
}

struct VideoSink {
    config: VideoSinkConfig,
    settings: Settings,
    segment_ms: i64,
    cameras: HashMap<String, Camera>,
    dead_letters: AppendLines,
    rejected: u64,
}

/// One camera's folder, open file and live stream.
struct Camera {
    folder: PathBuf,
    segment: Option<Segment>,
    live: Option<Live>,
    /// The last file's name, so that two opened within a millisecond differ.
    last_name: String,
}

/// What became of a row.
enum Outcome {
    Written,
    Rejected(String),
}

impl Sink for VideoSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let (cameras, frames) = crate::draw::frame_columns(batch, "video")?;
        let pts = batch
            .column_by_name("pts_ms")
            .and_then(|c| c.as_primitive_opt::<Int64Type>());
        let picture = Picture::of(batch, "video")?;
        let detections = batch
            .column_by_name(&self.config.detections)
            .and_then(|c| c.as_list_opt::<i32>());
        for row in 0..batch.num_rows() {
            if cameras.is_null(row) {
                self.reject(batch, row, "no `camera_id`".into())?;
                continue;
            }
            let camera = cameras.value(row);
            let t_ms = match pts.filter(|p| !p.is_null(row)) {
                Some(p) => p.value(row),
                None if !frames.is_null(row) => {
                    (frames.value(row) as f64 * 1000.0 / self.config.fps).round() as i64
                }
                None => {
                    self.reject(batch, row, "no `pts_ms` or `frame` to time it".into())?;
                    continue;
                }
            };
            let (width, height, mut pixels) = match picture.rgb(row) {
                Ok(rgb) => rgb,
                Err(why) => {
                    self.reject(batch, row, why)?;
                    continue;
                }
            };
            let boxes = detections
                .filter(|d| !d.is_null(row))
                .map(|d| draw::boxes(d.value(row).as_struct_opt()))
                .unwrap_or_default();
            draw::draw_boxes_and_labels(&mut pixels, width, height, &boxes);
            match self.encode(camera, width, height, &pixels, t_ms)? {
                Outcome::Written => {}
                Outcome::Rejected(why) => self.reject(batch, row, why)?,
            }
        }
        self.dead_letters.flush()
    }

    fn flush(&mut self) -> DataflowResult<()> {
        for camera in self.cameras.values_mut() {
            if let Some(segment) = camera.segment.as_mut() {
                segment.flush();
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> DataflowResult<()> {
        let mut first = None;
        for camera in self.cameras.values_mut() {
            if let Some(segment) = camera.segment.take() {
                let path = segment.path().to_path_buf();
                if let Err(e) = segment.finish(&mut camera.live) {
                    tracing::warn!("video sink: {e}");
                    first.get_or_insert(DataflowError::Config(format!(
                        "video sink: finishing {}: {e}",
                        path.display()
                    )));
                }
            }
            camera.end_live();
        }
        if self.rejected > 0 {
            tracing::warn!(
                "video sink: {} row(s) not encoded, see {}",
                self.rejected,
                self.dead_letters.path().display()
            );
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for VideoSink {
    /// A run that failed or stopped without `finish` still closes its files whole.
    fn drop(&mut self) {
        for camera in self.cameras.values_mut() {
            if let Some(segment) = camera.segment.take() {
                if let Err(e) = segment.finish(&mut camera.live) {
                    tracing::warn!("video sink: {e}");
                }
            }
            camera.end_live();
        }
    }
}

impl Camera {
    /// Closes the live playlist (a player then knows the stream ended).
    fn end_live(&mut self) {
        if let Some(live) = self.live.take() {
            if let Err(e) = live.finish() {
                tracing::warn!("video sink: {e}");
            }
        }
    }
}

impl VideoSink {
    /// Encodes a drawn frame into `camera`'s file, starting a new one when the frame's size
    /// or time calls for it.
    fn encode(
        &mut self,
        camera: &str,
        width: u32,
        height: u32,
        pixels: &[u8],
        t_ms: i64,
    ) -> DataflowResult<Outcome> {
        let segment_ms = self.segment_ms;
        let dir = &self.config.dir;
        let state = self
            .cameras
            .entry(camera.to_string())
            .or_insert_with(|| Camera {
                folder: dir.join(sanitize(camera)),
                segment: None,
                live: None,
                last_name: String::new(),
            });
        let fits = state
            .segment
            .as_ref()
            .is_some_and(|s| s.takes(width, height, t_ms, segment_ms));
        if !fits {
            if let Some(done) = state.segment.take() {
                tracing::debug!(
                    "video sink: {} done, {} frame(s)",
                    done.path().display(),
                    done.frames()
                );
                done.finish(&mut state.live).map_err(sink_error)?;
            }
            std::fs::create_dir_all(&state.folder).map_err(|e| {
                DataflowError::io(format!("creating {}", state.folder.display()), e)
            })?;
            let name = file_name(&state.folder, &state.last_name);
            let path = state.folder.join(&name);
            match Segment::create(&path, width, height, t_ms, &self.settings) {
                Ok(s) => {
                    state.last_name = name;
                    let continues = state.live.as_ref().is_some_and(|l| l.continues_with(&s));
                    if self.config.live && !continues {
                        state.end_live();
                        match Live::create(&state.folder.join("live"), &s) {
                            Ok(live) => state.live = Some(live),
                            Err(e) => tracing::warn!("video sink: no live stream: {e}"),
                        }
                    }
                    state.segment = Some(s);
                }
                Err(e @ EncodeError::NoX264) => return Err(sink_error(e)),
                Err(e) => {
                    // What FFmpeg left of a file it could not start holds no frame.
                    let _ = std::fs::remove_file(&path);
                    return Ok(Outcome::Rejected(e.to_string()));
                }
            }
        }
        let Some(segment) = state.segment.as_mut() else {
            return Ok(Outcome::Rejected("no file open".into()));
        };
        segment
            .push(pixels, t_ms, &mut state.live)
            .map_err(sink_error)?;
        Ok(Outcome::Written)
    }

    fn reject(&mut self, batch: &RecordBatch, row: usize, reason: String) -> DataflowResult<()> {
        self.rejected += 1;
        // One line a row for the first few, then one every thousand: never a flood.
        if self.rejected <= 10 || self.rejected.is_multiple_of(1000) {
            tracing::warn!(
                "video sink: a row not encoded ({reason}); {} so far, in {}",
                self.rejected,
                self.dead_letters.path().display()
            );
        }
        // The pipeline's own dead letters' fields: stage, reason, record.
        self.dead_letters.write(&serde_json::json!({
            "stage": STAGE,
            "reason": reason,
            "record": describe_row(batch, row),
        }))
    }
}

fn sink_error(e: EncodeError) -> DataflowError {
    DataflowError::Config(format!("video sink: {e}"))
}

/// A new file's name in `folder`: its UTC start (`2026-12-03T10-55-27.123Z.mp4`, which sorts
/// in time order), with `-1`, `-2`, … when that is `last` or taken.
fn file_name(folder: &std::path::Path, last: &str) -> String {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let stem = utc_stamp(now_ms);
    let mut name = format!("{stem}.mp4");
    let mut n = 0;
    while name == last || folder.join(&name).exists() {
        n += 1;
        name = format!("{stem}-{n}.mp4");
    }
    name
}

/// `ms` since the Unix epoch as `YYYY-MM-DDTHH-MM-SS.mmmZ` (no colons: they are not allowed in
/// Windows file names and confuse `scp`).
fn utc_stamp(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}-{:02}-{:02}.{milli:03}Z",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow_array::{BinaryArray, Int64Array, StringArray, UInt32Array};
    use arrow_schema::{DataType, Field, Schema};

    #[test]
    fn names_sort_in_time_order() {
        assert_eq!(utc_stamp(0), "1970-01-01T00-00-00.000Z");
        // `date -u -d @1764759327.123 +%Y-%m-%dT%H-%M-%S.%3NZ`
        assert_eq!(utc_stamp(1_764_759_327_123), "2025-12-03T10-55-27.123Z");
        assert_eq!(utc_stamp(951_782_400_000), "2000-02-29T00-00-00.000Z");
        let dir = tempfile::tempdir().unwrap();
        let a = file_name(dir.path(), "");
        std::fs::write(dir.path().join(&a), b"").unwrap();
        let b = file_name(dir.path(), &a);
        assert_ne!(a, b, "a name taken is not used again");
    }

    /// camera, frame, width, height, pixels.
    type Row<'a> = (Option<&'a str>, i64, u32, u32, Option<Vec<u8>>);

    fn batch(rows: Vec<Row<'_>>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("camera_id", DataType::Utf8, true),
            Field::new("frame", DataType::Int64, false),
            Field::new("pts_ms", DataType::Int64, false),
            Field::new("width", DataType::UInt32, false),
            Field::new("height", DataType::UInt32, false),
            Field::new("pixels", DataType::Binary, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.1 * 40).collect::<Vec<_>>(),
                )),
                Arc::new(UInt32Array::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
                Arc::new(UInt32Array::from(
                    rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                )),
                Arc::new(BinaryArray::from(
                    rows.iter().map(|r| r.4.as_deref()).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap()
    }

    #[test]
    fn malformed_rows_are_dead_letters_and_sizes_roll_files() {
        let dir = tempfile::tempdir().unwrap();
        let config: VideoSinkConfig = serde_json::from_value(serde_json::json!({
            "dir": dir.path().join("v"), "preset": "ultrafast"
        }))
        .unwrap();
        let mut sink = VideoSinkFactory::new(config).open().unwrap();
        let px = |w: u32, h: u32| Some(vec![90u8; (w * h * 3) as usize]);
        sink.write_batch(&batch(vec![
            (Some("a"), 0, 16, 16, px(16, 16)),
            (Some("a"), 1, 16, 16, None),
            (Some("a"), 2, 16, 16, Some(vec![1, 2, 3])),
            (None, 3, 16, 16, px(16, 16)),
            (Some("a"), 4, 0, 16, Some(vec![])),
            (Some("a"), 5, 16, 16, px(16, 16)),
            // Another size: another file.
            (Some("a"), 6, 20, 12, px(20, 12)),
        ]))
        .unwrap();
        sink.finish().unwrap();
        let letters: Vec<serde_json::Value> =
            std::fs::read_to_string(dir.path().join("v/dead-letters.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        let reasons: Vec<&str> = letters
            .iter()
            .map(|l| l["reason"].as_str().unwrap())
            .collect();
        assert_eq!(
            reasons,
            [
                "no picture (`pixels` is null)",
                "3 bytes of pixels for 16×16 RGB",
                "no `camera_id`",
                "an empty picture (0×16)",
            ]
        );
        assert!(letters[0]["record"]
            .as_str()
            .unwrap()
            .contains("\"frame\":1"));
        assert_eq!(letters[0]["stage"], "sink.video");
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path().join("v/a"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "mp4"))
            .collect();
        files.sort();
        assert_eq!(files.len(), 2, "{files:?}");
        // Another size starts the live stream over: its playlist has the last size's frame.
        let playlist = std::fs::read_to_string(dir.path().join("v/a/live/index.m3u8")).unwrap();
        assert!(playlist.contains("#EXT-X-ENDLIST"), "{playlist}");
        assert!(playlist.contains("init.mp4"), "{playlist}");
    }
}
