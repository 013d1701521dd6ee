//! The video source's factory (cameras dealt to workers, checkpoints) and one worker's
//! partition (its cameras' threads and queues, read a batch at a time).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::SchemaRef;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::source::{SourceBatch, SourcePosition};
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};

use super::camera::{CameraTask, Retry};
use super::config::{Camera, RtspTransport, VideoConfig};
use super::decoder::OpenOptions;
use super::metrics::{self, video_metrics, CameraMetrics};
use super::queue::{Bell, Frame, FrameQueue};

/// How long an idle worker waits for a frame before returning an empty batch (which closes
/// its epoch, so results of a quiet stream still get flushed). Short: the worker steps its
/// dataflow once per read, so while it waits here the frames already read make no progress
/// (at 50 ms, a live camera's results took ~150 ms through a 25 ms model; see
/// docs/benchmarks/cameras.md).
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// A configured video source: its cameras, resolved and checked.
#[derive(Clone, Debug)]
pub struct VideoSource {
    cameras: Arc<[Camera]>,
    batch_size: usize,
    queue_size: usize,
    open: OpenOptions,
    retry: Retry,
    /// Camera index → first frame to deliver (resuming from a checkpoint).
    resume: BTreeMap<i32, i64>,
}

impl VideoSource {
    /// Resolves the cameras and checks the files exist; no stream is opened yet.
    pub fn new(config: &VideoConfig) -> DataflowResult<Self> {
        let cameras = config.resolve()?;
        Ok(VideoSource {
            cameras: cameras.into(),
            batch_size: config.batch_size,
            queue_size: config.queue_size,
            open: OpenOptions {
                live: false,
                rtsp_tcp: config.rtsp_transport == RtspTransport::Tcp,
                timeout_ms: config.timeout_ms,
            },
            retry: Retry {
                attempts: config.connect_attempts,
                backoff: Duration::from_millis(config.backoff_ms),
                max_backoff: Duration::from_millis(config.max_backoff_ms.max(config.backoff_ms)),
            },
            resume: BTreeMap::new(),
        })
    }

    pub fn cameras(&self) -> &[Camera] {
        &self.cameras
    }
}

impl SourceFactory for VideoSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(super::schema())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        crate::check_partition(index, peers)?;
        let mine: Vec<Camera> = self
            .cameras
            .iter()
            .filter(|c| c.index % peers == index)
            .cloned()
            .collect();
        // Registered here, before the worker says it is ready: /readyz waits for them.
        let video_metrics = video_metrics()?;
        let metrics = mine.iter().map(|c| video_metrics.camera(&c.id)).collect();
        Ok(Box::new(VideoPartition {
            source: self.clone(),
            cameras: mine,
            metrics,
            running: None,
        }))
    }

    /// Only files resume: a live stream cannot be rewound to a frame.
    fn checkpoint_id(&self) -> Option<String> {
        if self.cameras.iter().any(|c| c.live) {
            return None;
        }
        let ids: Vec<&str> = self.cameras.iter().map(|c| c.id.as_str()).collect();
        Some(format!("video:{}", ids.join(",")))
    }

    fn resume(
        &self,
        offsets: &BTreeMap<i32, i64>,
    ) -> DataflowResult<Option<Arc<dyn SourceFactory>>> {
        if self.checkpoint_id().is_none() {
            return Ok(None);
        }
        let mut resumed = self.clone();
        resumed.resume = offsets.clone();
        Ok(Some(Arc::new(resumed)))
    }

    fn attach_metrics(&self, metrics: &Metrics) -> DataflowResult<()> {
        metrics::attach(metrics)
    }
}

/// The cameras of one worker: started on the first read, stopped when dropped.
struct VideoPartition {
    source: VideoSource,
    cameras: Vec<Camera>,
    /// `cameras`' metrics, one each.
    metrics: Vec<CameraMetrics>,
    running: Option<Running>,
}

struct Running {
    queues: Vec<Arc<FrameQueue>>,
    bell: Arc<Bell>,
    stop: Arc<AtomicBool>,
    /// The camera the next batch starts from (round robin, so no camera starves).
    next: usize,
}

impl VideoPartition {
    fn start(&self) -> DataflowResult<Running> {
        let bell = Arc::new(Bell::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut queues = Vec::with_capacity(self.cameras.len());
        for (camera, metrics) in self.cameras.iter().zip(&self.metrics) {
            let queue = Arc::new(FrameQueue::new(
                self.source.queue_size,
                camera.on_overload,
                bell.clone(),
            ));
            let index = i32::try_from(camera.index).unwrap_or(i32::MAX);
            let task = CameraTask {
                camera: camera.clone(),
                open: OpenOptions {
                    live: camera.live,
                    ..self.source.open.clone()
                },
                retry: self.source.retry.clone(),
                resume_from: self.source.resume.get(&index).copied().unwrap_or(0),
                queue: queue.clone(),
                metrics: metrics.clone(),
                stop: stop.clone(),
            };
            task.spawn().map_err(|e| {
                DataflowError::io(format!("starting camera `{}`'s thread", camera.id), e)
            })?;
            queues.push(queue);
        }
        Ok(Running {
            queues,
            bell,
            stop,
            next: 0,
        })
    }
}

impl Drop for VideoPartition {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.stop.store(true, Ordering::Relaxed);
            for q in &running.queues {
                q.close();
            }
        }
    }
}

impl Running {
    /// Up to `max` frames, one per camera in turn, with the cameras' dead letters.
    #[allow(
        clippy::indexing_slicing,
        reason = "`camera` runs over the indices of `self.queues`"
    )]
    fn take(
        &mut self,
        max: usize,
    ) -> (
        Vec<(usize, Frame)>,
        Vec<riffle_dataflow::dead_letter::DeadLetter>,
    ) {
        let mut rejected = Vec::new();
        for q in &self.queues {
            rejected.extend(q.take_rejected());
        }
        let mut frames = Vec::new();
        let n = self.queues.len();
        let mut progressed = true;
        while progressed && frames.len() < max {
            progressed = false;
            for k in 0..n {
                let camera = (self.next + k) % n;
                if frames.len() >= max {
                    break;
                }
                if let Some(f) = self.queues[camera].pop() {
                    frames.push((camera, f));
                    progressed = true;
                }
            }
        }
        if n > 0 {
            self.next = (self.next + 1) % n;
        }
        (frames, rejected)
    }

    fn done(&self) -> bool {
        self.queues.iter().all(|q| q.is_done())
    }
}

impl Source for VideoPartition {
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        if self.cameras.is_empty() {
            return Ok(None);
        }
        if self.running.is_none() {
            self.running = Some(self.start()?);
        }
        let batch_size = self.source.batch_size;
        let Some(running) = self.running.as_mut() else {
            return Ok(None);
        };
        let seen = running.bell.count();
        let (mut frames, mut rejected) = running.take(batch_size);
        if frames.is_empty() && rejected.is_empty() {
            if running.done() {
                return Ok(None);
            }
            running.bell.wait(seen, IDLE_WAIT);
            (frames, rejected) = running.take(batch_size);
        }
        let positions = positions(&self.cameras, &frames);
        let records = to_batch(&self.cameras, frames)?;
        Ok(Some(SourceBatch {
            records,
            rejected,
            positions,
        }))
    }
}

/// Each camera's first and last frame in the batch: (partition = camera index, offset = frame).
#[allow(
    clippy::indexing_slicing,
    reason = "frames carry indices into `cameras`, the list they were read for"
)]
fn positions(cameras: &[Camera], frames: &[(usize, Frame)]) -> Vec<SourcePosition> {
    let mut ranges: BTreeMap<usize, (i64, i64)> = BTreeMap::new();
    for (camera, f) in frames {
        let r = ranges.entry(*camera).or_insert((f.frame, f.frame));
        r.0 = r.0.min(f.frame);
        r.1 = r.1.max(f.frame);
    }
    ranges
        .into_iter()
        .map(|(camera, (first, last))| SourcePosition {
            partition: i32::try_from(cameras[camera].index).unwrap_or(i32::MAX),
            first_offset: first,
            last_offset: last,
        })
        .collect()
}

#[allow(
    clippy::indexing_slicing,
    reason = "frames carry indices into `cameras`, the list they were read for"
)]
fn to_batch(cameras: &[Camera], frames: Vec<(usize, Frame)>) -> DataflowResult<RecordBatch> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            frames.iter().map(|(c, _)| cameras[*c].id.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(
            frames.iter().map(|(_, f)| f.frame),
        )),
        Arc::new(Int64Array::from_iter_values(
            frames.iter().map(|(_, f)| f.pts_ms),
        )),
        Arc::new(Int64Array::from_iter_values(
            frames.iter().map(|(_, f)| f.ingest_ms),
        )),
        Arc::new(UInt32Array::from_iter_values(
            frames.iter().map(|(_, f)| f.width),
        )),
        Arc::new(UInt32Array::from_iter_values(
            frames.iter().map(|(_, f)| f.height),
        )),
        Arc::new(BinaryArray::from_iter_values(
            frames.iter().map(|(_, f)| f.pixels.as_slice()),
        )),
    ];
    Ok(RecordBatch::try_new(super::schema(), columns)?)
}
