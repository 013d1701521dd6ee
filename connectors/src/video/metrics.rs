//! Prometheus metrics of the video source, per camera, created once per process and exposed as
//! `riffle_video_*` (the process registry adds the `riffle_` prefix).

use std::sync::OnceLock;

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::{DataflowError, DataflowResult};

pub(crate) struct VideoMetrics {
    frames: IntCounterVec,
    dropped: IntCounterVec,
    reconnects: IntCounterVec,
    failures: IntCounterVec,
    queue_high_water: IntGaugeVec,
}

/// One camera's handles.
#[derive(Clone)]
pub(crate) struct CameraMetrics {
    /// Frames kept (after thinning) and handed to the queue.
    pub frames: IntCounter,
    /// Frames discarded because the queue was full (`drop_oldest` / `drop_newest`).
    pub dropped: IntCounter,
    /// Times a broken live stream came back.
    pub reconnects: IntCounter,
    /// 1 once the camera was given up (never came up, or did not come back).
    pub failures: IntCounter,
    /// The most frames its queue held.
    pub queue_high_water: IntGauge,
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
                "Frames discarded because the camera's queue was full (on_overload)",
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
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.frames.clone()),
            Box::new(self.dropped.clone()),
            Box::new(self.reconnects.clone()),
            Box::new(self.failures.clone()),
            Box::new(self.queue_high_water.clone()),
        ]
    }

    pub fn camera(&self, camera: &str) -> CameraMetrics {
        let l = [camera];
        CameraMetrics {
            frames: self.frames.with_label_values(&l),
            dropped: self.dropped.with_label_values(&l),
            reconnects: self.reconnects.with_label_values(&l),
            failures: self.failures.with_label_values(&l),
            queue_high_water: self.queue_high_water.with_label_values(&l),
        }
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
