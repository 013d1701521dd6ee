//! Prometheus metrics of the video source, per camera, created once per process and exposed as
//! `riffle_video_*` (the process registry adds the `riffle_` prefix).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::{DataflowError, DataflowResult};

pub(crate) struct VideoMetrics {
    frames: IntCounterVec,
    dropped: IntCounterVec,
    skipped_on_connect: IntCounterVec,
    reconnects: IntCounterVec,
    failures: IntCounterVec,
    queue_high_water: IntGaugeVec,
    health: Arc<HealthCollector>,
}

/// One camera's handles.
#[derive(Clone)]
pub(crate) struct CameraMetrics {
    /// Frames kept (after thinning) and handed to the queue.
    pub frames: IntCounter,
    /// Frames discarded because the queue was full (`drop_oldest` / `drop_newest`), the
    /// connection's opening burst aside.
    pub dropped: IntCounter,
    /// Frames discarded by a full queue during a live connection's opening burst.
    pub skipped_on_connect: IntCounter,
    /// Times a broken live stream came back.
    pub reconnects: IntCounter,
    /// 1 once the camera was given up (never came up, or did not come back).
    pub failures: IntCounter,
    /// The most frames its queue held.
    pub queue_high_water: IntGauge,
    /// Up or down, and when its last frame came.
    pub health: Arc<Health>,
}

/// Whether a camera is up, read when scraped (`riffle_video_camera_up`,
/// `riffle_video_seconds_since_last_frame`, `riffle_video_camera_awaited`,
/// `riffle_video_camera_ended`).
#[derive(Debug)]
pub(crate) struct Health {
    up: AtomicBool,
    /// A file played to its end: not up, and not down either.
    ended: AtomicBool,
    /// Its last frame, or when it started while it has delivered none.
    last: Mutex<(Instant, bool)>,
}

impl Health {
    fn new() -> Self {
        Health {
            up: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            last: Mutex::new((Instant::now(), false)),
        }
    }

    /// A frame was decoded: the camera is up.
    pub fn frame(&self) {
        self.up.store(true, Ordering::Relaxed);
        *lock(&self.last) = (Instant::now(), true);
    }

    /// Its stream ended, broke, could not be opened, or it was given up.
    pub fn down(&self) {
        self.up.store(false, Ordering::Relaxed);
    }

    /// Its file played to the end (and is not played again).
    pub fn ended(&self) {
        self.up.store(false, Ordering::Relaxed);
        self.ended.store(true, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cameras' health, turned into gauges when scraped (so the seconds since the last frame
/// grow while a camera is down, with no thread to update them).
struct HealthCollector {
    cameras: Mutex<BTreeMap<String, Arc<Health>>>,
    up: IntGaugeVec,
    since_frame: GaugeVec,
    awaited: IntGaugeVec,
    ended: IntGaugeVec,
}

impl HealthCollector {
    fn create() -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["camera"]);
        Ok(HealthCollector {
            cameras: Mutex::new(BTreeMap::new()),
            up: gauge(
                "video_camera_up",
                "1 while a camera's stream delivers frames, 0 while it is down or ended",
            )?,
            since_frame: GaugeVec::new(
                Opts::new(
                    "video_seconds_since_last_frame",
                    "Seconds since a camera's last decoded frame (since its start if none yet)",
                ),
                &["camera"],
            )?,
            awaited: gauge(
                "video_camera_awaited",
                "1 until a camera delivers its first frame (/readyz waits for it)",
            )?,
            ended: gauge(
                "video_camera_ended",
                "1 once a file camera has played to its end (so its camera_up 0 is no outage)",
            )?,
        })
    }

    /// `camera` was removed: its gauges go (its counters keep their totals).
    fn forget(&self, camera: &str) {
        lock(&self.cameras).remove(camera);
        let l = [camera];
        let _ = self.up.remove_label_values(&l);
        let _ = self.since_frame.remove_label_values(&l);
        let _ = self.awaited.remove_label_values(&l);
        let _ = self.ended.remove_label_values(&l);
    }

    /// A fresh health for `camera` (started again: awaited until its first frame).
    fn register(&self, camera: &str) -> Arc<Health> {
        let health = Arc::new(Health::new());
        lock(&self.cameras).insert(camera.to_string(), health.clone());
        health
    }
}

impl Collector for HealthCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.up.desc();
        descs.extend(self.since_frame.desc());
        descs.extend(self.awaited.desc());
        descs.extend(self.ended.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        for (camera, health) in lock(&self.cameras).iter() {
            let l = [camera.as_str()];
            let (last, seen) = *lock(&health.last);
            self.up
                .with_label_values(&l)
                .set(i64::from(health.up.load(Ordering::Relaxed)));
            self.since_frame
                .with_label_values(&l)
                .set(last.elapsed().as_secs_f64());
            self.awaited.with_label_values(&l).set(i64::from(!seen));
            self.ended
                .with_label_values(&l)
                .set(i64::from(health.ended.load(Ordering::Relaxed)));
        }
        let mut families = self.up.collect();
        families.extend(self.since_frame.collect());
        families.extend(self.awaited.collect());
        families.extend(self.ended.collect());
        families
    }
}

impl VideoMetrics {
    fn create() -> prometheus::Result<Self> {
        let counter =
            |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["camera"]);
        Ok(VideoMetrics {
            frames: counter(
                "video_frames_total",
                "Frames a camera decoded and kept (after sample_fps / every_nth)",
            )?,
            dropped: counter(
                "video_frames_dropped_total",
                "Frames discarded because the camera's queue was full (on_overload), \
                 outside a connection's opening burst",
            )?,
            skipped_on_connect: counter(
                "video_frames_skipped_on_connect_total",
                "Frames a live connection buffered while opening, discarded by a full queue \
                 (on_overload) as it handed them over at once",
            )?,
            reconnects: counter(
                "video_reconnects_total",
                "Times a camera's broken live stream was reconnected",
            )?,
            failures: counter(
                "video_camera_failures_total",
                "Cameras given up: never came up, did not come back, or failed to decode",
            )?,
            queue_high_water: IntGaugeVec::new(
                Opts::new(
                    "video_queue_high_water_frames",
                    "The most decoded frames a camera's queue held",
                ),
                &["camera"],
            )?,
            health: Arc::new(HealthCollector::create()?),
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.frames.clone()),
            Box::new(self.dropped.clone()),
            Box::new(self.skipped_on_connect.clone()),
            Box::new(self.reconnects.clone()),
            Box::new(self.failures.clone()),
            Box::new(self.queue_high_water.clone()),
            Box::new(SharedHealth(self.health.clone())),
        ]
    }

    /// `camera` was removed from the running set: it is no longer up, down or awaited.
    pub fn forget(&self, camera: &str) {
        self.health.forget(camera);
        let _ = self.queue_high_water.remove_label_values(&[camera]);
    }

    pub fn camera(&self, camera: &str) -> CameraMetrics {
        let l = [camera];
        CameraMetrics {
            frames: self.frames.with_label_values(&l),
            dropped: self.dropped.with_label_values(&l),
            skipped_on_connect: self.skipped_on_connect.with_label_values(&l),
            reconnects: self.reconnects.with_label_values(&l),
            failures: self.failures.with_label_values(&l),
            queue_high_water: self.queue_high_water.with_label_values(&l),
            health: self.health.register(camera),
        }
    }
}

/// The process-wide health collector, registered with each process registry.
struct SharedHealth(Arc<HealthCollector>);

impl Collector for SharedHealth {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }
    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

/// The process-wide video metrics.
pub(crate) fn video_metrics() -> DataflowResult<&'static VideoMetrics> {
    static METRICS: OnceLock<Result<VideoMetrics, String>> = OnceLock::new();
    METRICS
        .get_or_init(|| VideoMetrics::create().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| DataflowError::Config(format!("video metrics: {e}")))
}

/// Registers the video metrics with the process's registry (from the factories'
/// `attach_metrics`): served on `/metrics` and listed in the end-of-run summary. Registering
/// again (two sources) is not an error.
pub(crate) fn attach(metrics: &Metrics) -> DataflowResult<()> {
    for collector in video_metrics()?.collectors() {
        metrics.register(collector)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_is_idempotent_and_the_summary_lists_them() {
        let metrics = Metrics::new().unwrap();
        attach(&metrics).unwrap();
        attach(&metrics).unwrap();
        video_metrics()
            .unwrap()
            .camera("metrics-test")
            .dropped
            .inc_by(2);
        let listed = metrics.registered_values();
        assert!(
            listed.contains(&(
                "riffle_video_frames_dropped_total{camera=metrics-test}".to_string(),
                2.0
            )),
            "{listed:?}"
        );
    }
}
