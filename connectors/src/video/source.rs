//! The video source's factory (cameras dealt to workers, checkpoints) and one worker's
//! partition (its cameras' threads and queues, read a batch at a time).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::SchemaRef;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::source::{SourceBatch, SourcePosition, Wake};
use riffle_dataflow::{DataflowError, DataflowResult, Source, SourceFactory};

use super::camera::{CameraTask, Retry};
use riffle_dataflow::control::InputControl;

use super::config::{Camera, RtspTransport, VideoConfig};
use super::decoder::OpenOptions;
use super::directory::Directory;
use super::metrics::{self, video_metrics, CameraMetrics};
use super::queue::{Bell, Frame, FrameQueue};

/// How long an idle worker waits for a frame before returning an empty batch (which closes
/// its epoch, so results of a quiet stream still get flushed). Short: the worker steps its
/// dataflow once per read, so while it waits here the frames already read make no progress
/// (at 50 ms, a live camera's results took ~150 ms through a 25 ms model; see
/// docs/benchmarks/cameras.md).
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// A configured video source: its cameras, resolved and checked, in a set that may change
/// while it runs (cameras added through `/api/cameras` or a watched `cameras_file`).
#[derive(Clone)]
pub struct VideoSource {
    directory: Arc<Directory>,
    /// Names the source in checkpoints; `None` when it cannot resume (live cameras of a
    /// source that ends with them).
    checkpoint_name: Option<String>,
    batch_size: usize,
    open: OpenOptions,
    queue_size: usize,
    retry: Retry,
    /// Camera index → first frame to deliver (resuming from a checkpoint).
    resume: BTreeMap<i32, i64>,
}

impl std::fmt::Debug for VideoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VideoSource")
            .field("cameras", &self.directory.cameras())
            .field("checkpoint_name", &self.checkpoint_name)
            .finish_non_exhaustive()
    }
}

impl VideoSource {
    /// Resolves the cameras and checks the files exist; no stream is opened yet.
    pub fn new(config: &VideoConfig) -> DataflowResult<Self> {
        let directory = Directory::new(config)?;
        let cameras = directory.cameras();
        // Decided by the configuration alone, so every run of the pipeline agrees.
        let checkpoint_name = if config.stays_open() {
            Some("video:open".to_string())
        } else if cameras.iter().any(|c| c.live) {
            None
        } else {
            let ids: Vec<&str> = cameras.iter().map(|c| c.id.as_str()).collect();
            Some(format!("video:{}", ids.join(",")))
        };
        Ok(VideoSource {
            directory,
            checkpoint_name,
            batch_size: config.batch_size,
            queue_size: config.queue_size,
            open: OpenOptions {
                live: false,
                rtsp_tcp: config.rtsp_transport == RtspTransport::Tcp,
                timeout_ms: config.timeout_ms,
                probe_ms: config.probe_ms,
                scale_to: config.scale_to,
            },
            retry: Retry {
                attempts: config.connect_attempts,
                backoff: Duration::from_millis(config.backoff_ms),
                max_backoff: Duration::from_millis(config.max_backoff_ms.max(config.backoff_ms)),
            },
            resume: BTreeMap::new(),
        })
    }

    /// The cameras now, in index order.
    pub fn cameras(&self) -> Vec<Camera> {
        self.directory.cameras()
    }
}

impl SourceFactory for VideoSource {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(super::schema(self.open.scale_to))
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        crate::check_partition(index, peers)?;
        let (_, mine) = self.directory.cameras_of(index, peers);
        // Registered here, before the worker says it is ready: /readyz waits for them.
        let video_metrics = video_metrics()?;
        let registered = mine
            .iter()
            .map(|c| (c.id.clone(), video_metrics.camera(&c.id)))
            .collect();
        Ok(Box::new(VideoPartition {
            source: self.clone(),
            worker: index,
            peers,
            seen: None,
            registered,
            retiring: self.directory.removed_from(index, peers),
            running: Running {
                cameras: Vec::new(),
                bell: Arc::new(Bell::default()),
                next: 0,
            },
        }))
    }

    fn checkpoint_id(&self) -> Option<String> {
        self.checkpoint_name.clone()
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

    fn control(&self) -> Option<Arc<dyn InputControl>> {
        Some(self.directory.clone())
    }

    fn checkpoint_state(&self) -> Option<String> {
        self.checkpoint_name
            .is_some()
            .then(|| self.directory.checkpoint_state())
    }

    fn restore_state(&self, state: &str) -> DataflowResult<()> {
        self.directory.restore(state)
    }
}

/// The cameras of one worker: each started when first read, stopped when removed from the
/// set or when the partition is dropped.
struct VideoPartition {
    source: VideoSource,
    worker: usize,
    peers: usize,
    /// The directory's version the cameras were last matched with.
    seen: Option<u64>,
    /// Metrics registered for cameras not started yet (at the start: /readyz waits for them).
    registered: BTreeMap<String, CameraMetrics>,
    running: Running,
    /// Cameras stopped here whose retirement is not sent on yet: an id among them is not
    /// started again before it is.
    retiring: Vec<String>,
}

/// One running camera.
struct Live {
    camera: Camera,
    queue: Arc<FrameQueue>,
    stop: Arc<AtomicBool>,
}

impl Live {
    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.queue.close();
    }
}

struct Running {
    /// In index order.
    cameras: Vec<Live>,
    bell: Arc<Bell>,
    /// The camera the next batch starts from (round robin, so no camera starves).
    next: usize,
}

impl VideoPartition {
    /// Starts the cameras placed here since the last look, stops those taken away.
    fn sync(&mut self) -> DataflowResult<()> {
        let directory = &self.source.directory;
        if self.seen == Some(directory.version()) {
            return Ok(());
        }
        let (version, wanted) = directory.cameras_of(self.worker, self.peers);
        let video_metrics = video_metrics()?;
        let retiring = &mut self.retiring;
        self.running.cameras.retain(|live| {
            let keep = wanted.contains(&live.camera);
            if !keep {
                live.stop();
                video_metrics.forget(&live.camera.id);
                retiring.push(live.camera.id.clone());
                tracing::info!("camera `{}` stopped (removed)", live.camera.id);
            }
            keep
        });
        let mut deferred = false;
        for camera in wanted {
            if self.running.cameras.iter().any(|l| l.camera == camera) {
                continue;
            }
            // Its old self's state downstream goes first (next batch).
            if self.retiring.contains(&camera.id) {
                deferred = true;
                continue;
            }
            let metrics = self
                .registered
                .remove(&camera.id)
                .unwrap_or_else(|| video_metrics.camera(&camera.id));
            let live = self.start(camera, metrics)?;
            self.running.cameras.push(live);
        }
        self.running.cameras.sort_by_key(|l| l.camera.index);
        self.seen = (!deferred).then_some(version);
        Ok(())
    }

    fn start(&self, camera: Camera, metrics: CameraMetrics) -> DataflowResult<Live> {
        let source = &self.source;
        let queue = Arc::new(FrameQueue::new(
            source.queue_size,
            camera.on_overload,
            self.running.bell.clone(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let index = i32::try_from(camera.index).unwrap_or(i32::MAX);
        let task = CameraTask {
            camera: camera.clone(),
            open: OpenOptions {
                live: camera.live,
                ..source.open.clone()
            },
            retry: source.retry.clone(),
            resume_from: source.resume.get(&index).copied().unwrap_or(0),
            queue: queue.clone(),
            metrics,
            stop: stop.clone(),
        };
        task.spawn().map_err(|e| {
            DataflowError::io(format!("starting camera `{}`'s thread", camera.id), e)
        })?;
        Ok(Live {
            camera,
            queue,
            stop,
        })
    }
}

impl Drop for VideoPartition {
    fn drop(&mut self) {
        for live in &self.running.cameras {
            live.stop();
        }
    }
}

impl Running {
    /// Up to `max` frames, one per camera in turn, with the cameras' dead letters.
    #[allow(
        clippy::indexing_slicing,
        reason = "`camera` runs over the indices of `self.cameras`"
    )]
    fn take(
        &mut self,
        max: usize,
    ) -> (
        Vec<(usize, Frame)>,
        Vec<riffle_dataflow::dead_letter::DeadLetter>,
    ) {
        let mut rejected = Vec::new();
        for live in &self.cameras {
            rejected.extend(live.queue.take_rejected());
        }
        let mut frames = Vec::new();
        let n = self.cameras.len();
        let mut progressed = true;
        while progressed && frames.len() < max {
            progressed = false;
            for k in 0..n {
                let camera = (self.next + k) % n;
                if frames.len() >= max {
                    break;
                }
                if let Some(f) = self.cameras[camera].queue.pop() {
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
        self.cameras.iter().all(|l| l.queue.is_done())
    }
}

impl Source for VideoPartition {
    /// Live and real-time cameras deliver on the wall clock; so may any camera of an open
    /// source (added while running).
    fn clocked(&self) -> bool {
        let directory = &self.source.directory;
        directory.is_open() || directory.cameras().iter().any(|c| c.live || c.realtime)
    }

    fn wake_with(&mut self, wake: Wake) -> bool {
        self.running.bell.wake_with(wake);
        true
    }

    fn retired(&mut self) -> Option<RecordBatch> {
        if self.retiring.is_empty() {
            return None;
        }
        let ids = StringArray::from_iter_values(self.retiring.drain(..));
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            super::CAMERA_ID,
            arrow_schema::DataType::Utf8,
            false,
        )]));
        RecordBatch::try_new(schema, vec![Arc::new(ids) as ArrayRef]).ok()
    }

    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        self.sync()?;
        let open = self.source.directory.is_open();
        if self.running.cameras.is_empty() && !open {
            return Ok(None);
        }
        let batch_size = self.source.batch_size;
        let running = &mut self.running;
        let seen = running.bell.count();
        let (mut frames, mut rejected) = running.take(batch_size);
        if frames.is_empty() && rejected.is_empty() {
            if running.done() && !open {
                return Ok(None);
            }
            // A worker that parks between reads is woken by the bell: it runs its stages
            // meanwhile rather than waiting here.
            if running.bell.wakes_worker() {
                return Ok(Some(SourceBatch::new(
                    RecordBatch::new_empty(super::schema(self.source.open.scale_to)),
                    Vec::new(),
                )));
            }
            running.bell.wait(seen, IDLE_WAIT);
            (frames, rejected) = running.take(batch_size);
        }
        let ready_ns = frames
            .iter()
            .map(|(_, f)| f.ingest_ms)
            .min()
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| ms.saturating_mul(1_000_000));
        let cameras: Vec<&Camera> = running.cameras.iter().map(|l| &l.camera).collect();
        let positions = positions(&cameras, &frames);
        let records = to_batch(super::schema(self.source.open.scale_to), &cameras, frames)?;
        Ok(Some(SourceBatch {
            records,
            rejected,
            positions,
            ready_ns,
        }))
    }
}

/// Each camera's first and last frame in the batch: (partition = camera index, offset = frame).
#[allow(
    clippy::indexing_slicing,
    reason = "frames carry indices into `cameras`, the list they were read for"
)]
fn positions(cameras: &[&Camera], frames: &[(usize, Frame)]) -> Vec<SourcePosition> {
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
fn to_batch(
    schema: SchemaRef,
    cameras: &[&Camera],
    frames: Vec<(usize, Frame)>,
) -> DataflowResult<RecordBatch> {
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
    Ok(RecordBatch::try_new(schema, columns)?)
}
