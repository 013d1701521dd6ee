//! What one process tells the view each tick: its stages' counters and latency quantiles since
//! the last tick, its connectors' counters and the frames it sampled. Process 0 builds its own;
//! the others send theirs to process 0 (`POST /api/report`).

use std::collections::HashMap;

use crate::tap::{Frame, FrameImage};
use hdrhistogram::Histogram;
use riffle_dataflow::observe::RunContext;
use serde::{Deserialize, Serialize};

/// One process's report.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub process: usize,
    /// Every worker of the process has built its dataflow and has its share of the source.
    pub ready: bool,
    /// The process's run is over (its last report).
    pub finished: bool,
    pub stages: Vec<StageReport>,
    /// The counters and gauges sources and sinks registered (Kafka, video), by name and labels.
    pub connectors: Vec<(String, f64)>,
    pub frames: Vec<ReportFrame>,
    /// Resident memory of the process, bytes (0 where unknown).
    pub rss_bytes: u64,
}

/// One stage of one process: totals since the start, and quantiles of the last tick.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StageReport {
    pub name: String,
    pub records_in: u64,
    pub records_out: u64,
    pub dead_letters: u64,
    pub late: u64,
    pub batches: u64,
    /// Per-batch time quantiles over the last tick, µs (0 when no batch ran).
    pub p50_us: u64,
    pub p99_us: u64,
}

/// A sampled frame as JPEG (base64 in JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReportFrame {
    pub camera_id: String,
    pub frame: i64,
    #[serde(with = "b64")]
    pub jpeg: Vec<u8>,
}

mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// Builds a process's reports tick after tick: quantiles come from the difference between
/// this tick's latency histograms and the last one's.
#[derive(Default)]
pub struct Reporter {
    last: HashMap<String, Histogram<u64>>,
}

impl Reporter {
    pub fn report(
        &mut self,
        process: usize,
        context: &RunContext,
        expected_workers: usize,
        frames: Vec<Frame>,
    ) -> Report {
        let stages = context
            .metrics
            .stages()
            .iter()
            .map(|stage| {
                let now = stage.latency_histogram();
                let mut window = now.clone();
                if let Some(before) = self.last.get(&stage.name) {
                    // Both copies come from the same histogram, `now` the later one.
                    if window.subtract(before).is_err() {
                        window = now.clone();
                    }
                }
                let (p50_us, p99_us) = if window.is_empty() {
                    (0, 0)
                } else {
                    (
                        window.value_at_quantile(0.5),
                        window.value_at_quantile(0.99),
                    )
                };
                self.last.insert(stage.name.clone(), now);
                StageReport {
                    name: stage.name.clone(),
                    records_in: stage.records_in(),
                    records_out: stage.records_out(),
                    dead_letters: stage.dead_letters(),
                    late: stage.late(),
                    batches: stage.batches(),
                    p50_us,
                    p99_us,
                }
            })
            .collect();
        Report {
            process,
            ready: context.readiness.ready_workers() >= expected_workers,
            finished: false,
            stages,
            connectors: context.metrics.registered_values(),
            frames: frames.into_iter().filter_map(jpeg_frame).collect(),
            rss_bytes: rss_bytes(),
        }
    }
}

/// The frame as JPEG: encoded pictures as they are (JPEG; PNG and others are passed on, a
/// browser shows them too), raw RGB encoded here, on the viewer's thread.
fn jpeg_frame(frame: Frame) -> Option<ReportFrame> {
    let jpeg = match frame.image {
        FrameImage::Encoded(bytes) => bytes,
        FrameImage::Rgb {
            width,
            height,
            pixels,
        } => crate::thumb::rgb_to_jpeg(width, height, &pixels)?,
    };
    Some(ReportFrame {
        camera_id: frame.camera_id,
        frame: frame.frame,
        jpeg,
    })
}

/// Resident set size from /proc (Linux); 0 elsewhere.
fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
