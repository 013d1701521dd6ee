//! The view's state on process 0: reports of every process, frames joined with their results,
//! the latest rows and dead letters, and per-stage time series; turned into one JSON snapshot
//! per tick for the page.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::tap::Drained;
use serde::Serialize;
use serde_json::Value;

use crate::report::{Report, ReportFrame};

/// Points per stage chart kept here (at one a tick: two minutes at 500 ms).
const SERIES_POINTS: usize = 240;
/// Points per stage chart in a snapshot (the page accumulates them; `/api/state` alike).
const SNAPSHOT_POINTS: usize = 4;
/// Sampled frames per camera waiting for their result, and results waiting for their frame.
const WAITING_PER_CAMERA: usize = 16;
/// Versions of a camera's picture kept, so the page fetches the one its boxes belong to.
const VERSIONS_KEPT: usize = 8;
/// Latest result rows and dead letters shown.
pub const ROWS_SHOWN: usize = 20;

/// What the page is told about the pipeline.
#[derive(Clone, Debug, Default, Serialize)]
pub struct About {
    pub pipeline: String,
    pub plan: String,
    pub processes: usize,
}

#[derive(Default)]
struct Camera {
    version: u64,
    frame: i64,
    row: Value,
    pictures: VecDeque<(u64, Arc<Vec<u8>>)>,
    waiting_frames: VecDeque<(i64, Arc<Vec<u8>>)>,
    waiting_rows: VecDeque<(i64, Value)>,
    shown: u64,
}

#[derive(Serialize, Clone, Default)]
struct Point {
    t: f64,
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Default)]
struct Series {
    points: VecDeque<Point>,
    /// (time, records out) of the last ticks: rates are taken over [`RATE_TICKS`] of them.
    totals: VecDeque<(f64, u64)>,
}

/// Ticks a rate is averaged over (2 s at 500 ms): batches come in bursts.
const RATE_TICKS: usize = 4;

/// See the [module documentation](self).
pub struct Hub {
    about: About,
    started: Instant,
    reports: BTreeMap<usize, Report>,
    cameras: BTreeMap<String, Camera>,
    rows: VecDeque<Value>,
    dead_letters: VecDeque<Value>,
    results_seen: u64,
    dead_seen: u64,
    series: BTreeMap<String, Series>,
}

impl Hub {
    pub fn new(about: About) -> Self {
        Hub {
            about,
            started: Instant::now(),
            reports: BTreeMap::new(),
            cameras: BTreeMap::new(),
            rows: VecDeque::new(),
            dead_letters: VecDeque::new(),
            results_seen: 0,
            dead_seen: 0,
            series: BTreeMap::new(),
        }
    }

    /// A process's report (this process's own, or one a peer sent).
    pub fn report(&mut self, mut report: Report) {
        for frame in std::mem::take(&mut report.frames) {
            self.frame(frame);
        }
        // A peer's last report says it finished; a late tick must not take that back.
        let finished = self
            .reports
            .get(&report.process)
            .is_some_and(|r| r.finished);
        report.finished |= finished;
        self.reports.insert(report.process, report);
    }

    /// What this process's tap gathered (results and dead letters reach process 0 only).
    pub fn drained(&mut self, drained: Drained) {
        self.results_seen += drained.results_count;
        self.dead_seen += drained.dead_letters_count;
        for row in drained.camera_rows {
            if let Ok(value) = serde_json::from_str::<Value>(&row) {
                self.result(value);
            }
        }
        for row in drained.rows {
            if let Ok(value) = serde_json::from_str::<Value>(&row) {
                push_front_bounded(&mut self.rows, value, ROWS_SHOWN);
            }
        }
        for letter in drained.dead_letters {
            if let Ok(value) = serde_json::from_str::<Value>(&letter) {
                push_front_bounded(&mut self.dead_letters, value, ROWS_SHOWN);
            }
        }
    }

    fn frame(&mut self, frame: ReportFrame) {
        let camera = self.cameras.entry(frame.camera_id).or_default();
        let picture = Arc::new(frame.jpeg);
        if let Some(i) = camera
            .waiting_rows
            .iter()
            .position(|(f, _)| *f == frame.frame)
        {
            if let Some((_, row)) = camera.waiting_rows.remove(i) {
                show(camera, frame.frame, picture, row);
            }
            return;
        }
        if camera.waiting_frames.len() >= WAITING_PER_CAMERA {
            camera.waiting_frames.pop_front();
        }
        camera.waiting_frames.push_back((frame.frame, picture));
    }

    fn result(&mut self, row: Value) {
        let (Some(id), Some(frame)) = (
            row.get("camera_id")
                .and_then(Value::as_str)
                .map(str::to_string),
            row.get("frame").and_then(Value::as_i64),
        ) else {
            return;
        };
        let camera = self.cameras.entry(id).or_default();
        if let Some(i) = camera.waiting_frames.iter().position(|(f, _)| *f == frame) {
            if let Some((_, picture)) = camera.waiting_frames.remove(i) {
                show(camera, frame, picture, row);
            }
            return;
        }
        if camera.waiting_rows.len() >= WAITING_PER_CAMERA * 4 {
            camera.waiting_rows.pop_front();
        }
        camera.waiting_rows.push_back((frame, row));
    }

    /// The picture of `camera` at `version`, while it is among the latest kept.
    pub fn picture(&self, camera: &str, version: u64) -> Option<Arc<Vec<u8>>> {
        self.cameras
            .get(camera)?
            .pictures
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, p)| p.clone())
    }

    /// Closes a tick: adds a point to every stage's chart.
    pub fn tick(&mut self) {
        let t = self.started.elapsed().as_secs_f64();
        for (name, (total, p50, p99)) in self.stage_totals() {
            let series = self.series.entry(name).or_default();
            let rate = match series.totals.front() {
                Some((t0, first)) if t > *t0 => total.saturating_sub(*first) as f64 / (t - t0),
                _ => 0.0,
            };
            if series.totals.len() >= RATE_TICKS {
                series.totals.pop_front();
            }
            series.totals.push_back((t, total));
            if series.points.len() >= SERIES_POINTS {
                series.points.pop_front();
            }
            series.points.push_back(Point {
                t,
                rate,
                p50_ms: p50 as f64 / 1000.0,
                p99_ms: p99 as f64 / 1000.0,
            });
        }
    }

    /// Per stage (in pipeline order): records out over every process, and the slowest
    /// process's per-batch p50 and p99 (µs) of its last report.
    fn stage_totals(&self) -> Vec<(String, (u64, u64, u64))> {
        self.stage_names()
            .into_iter()
            .map(|name| {
                let mut total = (0, 0, 0);
                for s in self.stage_reports(name) {
                    total.0 += s.records_out;
                    total.1 = total.1.max(s.p50_us);
                    total.2 = total.2.max(s.p99_us);
                }
                (name.to_string(), total)
            })
            .collect()
    }

    /// Stage names over every report, in pipeline order (the order the first report has them).
    fn stage_names(&self) -> Vec<&str> {
        let mut order: Vec<&str> = Vec::new();
        for s in self.reports.values().flat_map(|r| &r.stages) {
            if !order.contains(&s.name.as_str()) {
                order.push(&s.name);
            }
        }
        order
    }

    /// Stage `name` of every process that reported it.
    fn stage_reports<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = &'a crate::report::StageReport> + 'a {
        self.reports
            .values()
            .flat_map(move |r| r.stages.iter().filter(move |s| s.name == name))
    }

    /// The whole view as the page reads it.
    pub fn snapshot(&self) -> Value {
        let mut stages: Vec<Value> = Vec::new();
        for name in self.stage_names() {
            let sum = |f: fn(&crate::report::StageReport) -> u64| -> u64 {
                self.stage_reports(name).map(f).sum()
            };
            let batches = sum(|s| s.batches);
            let records_in = sum(|s| s.records_in);
            stages.push(serde_json::json!({
                "name": name,
                "records_in": records_in,
                "records_out": sum(|s| s.records_out),
                "dead_letters": sum(|s| s.dead_letters),
                "late": sum(|s| s.late),
                "batches": batches,
                "mean_batch": if batches > 0 { records_in as f64 / batches as f64 } else { 0.0 },
                // The latest points only: the page keeps the history (a snapshot every tick
                // with two minutes of points costs the browser more than the run can spare).
                "series": self.series.get(name).map(|s| s.points.iter().rev().take(SNAPSHOT_POINTS).rev().cloned().collect::<Vec<_>>()).unwrap_or_default(),
            }));
        }
        let cameras: Vec<Value> = self
            .cameras
            .iter()
            .filter(|(_, c)| c.version > 0)
            .map(|(id, c)| {
                serde_json::json!({
                    "camera_id": id,
                    "frame": c.frame,
                    "version": c.version,
                    "shown": c.shown,
                    "row": c.row,
                })
            })
            .collect();
        let mut connectors: BTreeMap<String, f64> = BTreeMap::new();
        for report in self.reports.values() {
            for (name, value) in &report.connectors {
                *connectors.entry(name.clone()).or_default() += value;
            }
        }
        let processes: Vec<Value> = self
            .reports
            .values()
            .map(|r| {
                serde_json::json!({
                    "process": r.process,
                    "ready": r.ready,
                    "finished": r.finished,
                    "rss_bytes": r.rss_bytes,
                })
            })
            .collect();
        let all = |f: fn(&Report) -> bool| {
            self.reports.len() >= self.about.processes.max(1) && self.reports.values().all(f)
        };
        serde_json::json!({
            "about": self.about,
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "ready": all(|r| r.ready),
            "finished": all(|r| r.finished),
            "processes": processes,
            "stages": stages,
            "cameras": cameras,
            "results_seen": self.results_seen,
            "dead_letters_seen": self.dead_seen,
            "rows": self.rows,
            "dead_letters": self.dead_letters,
            "connectors": connectors,
        })
    }
}

fn show(camera: &mut Camera, frame: i64, picture: Arc<Vec<u8>>, row: Value) {
    camera.version += 1;
    camera.shown += 1;
    camera.frame = frame;
    camera.row = row;
    if camera.pictures.len() >= VERSIONS_KEPT {
        camera.pictures.pop_front();
    }
    camera.pictures.push_back((camera.version, picture));
}

fn push_front_bounded(queue: &mut VecDeque<Value>, value: Value, max: usize) {
    queue.push_front(value);
    queue.truncate(max);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::StageReport;

    fn frame(camera: &str, frame: i64) -> ReportFrame {
        ReportFrame {
            camera_id: camera.into(),
            frame,
            jpeg: vec![frame as u8],
        }
    }

    #[test]
    fn joins_frames_with_their_results_in_either_order() {
        let mut hub = Hub::new(About::default());
        hub.report(Report {
            frames: vec![frame("a", 1), frame("b", 7)],
            ..Default::default()
        });
        let rows: Vec<String> = vec![
            r#"{"camera_id":"a","frame":1,"n":1}"#.into(),
            r#"{"camera_id":"b","frame":8,"n":2}"#.into(),
        ];
        hub.drained(Drained {
            camera_rows: rows.clone(),
            rows,
            results_count: 2,
            ..Default::default()
        });
        // b's result for frame 8 came before the frame.
        hub.report(Report {
            frames: vec![frame("b", 8)],
            ..Default::default()
        });
        let snap = hub.snapshot();
        let cams = snap["cameras"].as_array().unwrap();
        assert_eq!(cams.len(), 2);
        assert_eq!(cams[0]["frame"], 1);
        assert_eq!(cams[0]["row"]["n"], 1);
        assert_eq!(cams[1]["frame"], 8);
        assert_eq!(cams[1]["row"]["n"], 2);
        assert_eq!(*hub.picture("b", 1).unwrap(), vec![8u8]);
        assert!(hub.picture("b", 2).is_none());
        assert_eq!(snap["results_seen"], 2);
        assert_eq!(snap["rows"][0]["n"], 2, "newest row first");
    }

    #[test]
    fn charts_sum_processes_and_take_the_slowest_quantiles() {
        let mut hub = Hub::new(About {
            processes: 2,
            ..Default::default()
        });
        let stage = |out, p99_us| StageReport {
            name: "model".into(),
            records_out: out,
            p50_us: 1000,
            p99_us,
            ..Default::default()
        };
        for (p, out, p99) in [(0, 10, 2000), (1, 30, 5000)] {
            hub.report(Report {
                process: p,
                stages: vec![stage(out, p99)],
                ..Default::default()
            });
        }
        hub.tick();
        std::thread::sleep(std::time::Duration::from_millis(50));
        hub.report(Report {
            process: 1,
            stages: vec![stage(70, 3000)],
            ..Default::default()
        });
        hub.tick();
        let snap = hub.snapshot();
        let model = &snap["stages"][0];
        assert_eq!(model["records_out"], 80);
        let points = model["series"].as_array().unwrap();
        assert_eq!(points.len(), 2);
        let rate = points[1]["rate"].as_f64().unwrap();
        assert!(rate > 0.0 && rate <= 40.0 / 0.05, "{rate}");
        assert_eq!(points[1]["p99_ms"], 3.0);
        assert_eq!(snap["ready"], false);
    }
}
