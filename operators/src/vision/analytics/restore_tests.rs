//! `line_count` through the runtime in-process: a run interrupted and resumed from its
//! checkpoint on another worker count counts exactly as one uninterrupted run does.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::{RecordBatch, StringArray};
use arrow_schema::SchemaRef;
use riffle_dataflow::checkpoint::CheckpointStore;
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::operators::KeyedRecord;
use riffle_dataflow::runtime::checkpointing::{Offsets, OPERATOR_PREFIX};
use riffle_dataflow::runtime::{
    run, CheckpointPolicy, EpochPolicy, Job, JobStep, RunReport, StepKind,
};
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{DataflowResult, Sink, Source, SourceBatch, SourceFactory, SourcePosition};

use super::line_count::LineCountConfig;
use super::test_input::{at, ints, joined, numbered, Det};
use crate::{StageContext, StageKind};

/// A run that has not ended by then is hung (a guard only; runs take milliseconds).
const HUNG: Duration = Duration::from_secs(120);
const CAMERAS: i32 = 3;

/// Camera `p` is partition `p`; its offsets are its frame numbers `0..end`, read three at a
/// time. Resumable at checkpointed offsets.
#[derive(Clone)]
struct Cameras {
    end: i64,
    start: Offsets,
}

/// The tracks of frame `frame` of camera `camera`: three tracks going down the image at
/// different speeds, each jumping back up (crossing `out`) when it reaches the bottom, and
/// replaced by a new id every 25 frames.
fn tracks(camera: i32, frame: i64) -> Vec<Det> {
    (0..3)
        .map(|t| {
            let y = 40 + (frame * (3 + t) + i64::from(camera) * 11) % 120;
            let id = i64::from(camera) * 1000 + t * 100 + frame / 25;
            at(id, 50.0 + 60.0 * t as f32, y as f32)
        })
        .collect()
}

fn camera_batch(camera: i32, from: i64, to: i64) -> RecordBatch {
    let dets = (from..to).map(|f| tracks(camera, f)).collect();
    numbered(&format!("cam-{camera}"), from, dets)
}

impl SourceFactory for Cameras {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(camera_batch(0, 0, 1).schema())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        let parts = (0..CAMERAS)
            .filter(|p| *p as usize % peers == index)
            .map(|p| (p, self.start.get(&p).copied().unwrap_or(0)))
            .collect();
        Ok(Box::new(CameraParts {
            parts,
            end: self.end,
        }))
    }

    fn checkpoint_id(&self) -> Option<String> {
        Some("cameras".into())
    }

    fn resume(&self, offsets: &Offsets) -> DataflowResult<Option<Arc<dyn SourceFactory>>> {
        Ok(Some(Arc::new(Cameras {
            start: offsets.clone(),
            ..self.clone()
        })))
    }
}

struct CameraParts {
    parts: VecDeque<(i32, i64)>,
    end: i64,
}

impl Source for CameraParts {
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        let Some((p, from)) = self.parts.pop_front().filter(|(_, next)| *next < self.end) else {
            return Ok(None);
        };
        let to = (from + 3).min(self.end);
        if to < self.end {
            self.parts.push_back((p, to));
        }
        Ok(Some(SourceBatch {
            records: camera_batch(p, from, to),
            rejected: Vec::new(),
            positions: vec![SourcePosition {
                partition: p,
                first_offset: from,
                last_offset: to - 1,
            }],
            ready_ns: None,
        }))
    }
}

/// Collects every batch written.
#[derive(Clone, Default)]
struct Collect(Arc<std::sync::Mutex<Vec<RecordBatch>>>);

impl Collect {
    fn batches(&self) -> Vec<RecordBatch> {
        self.0.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

impl SinkFactory for Collect {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(self.clone()))
    }
}

impl Sink for Collect {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        if let Ok(mut all) = self.0.lock() {
            all.push(batch.clone());
        }
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}

fn config() -> LineCountConfig {
    serde_json::from_value(serde_json::json!({
        "lines": [
            { "name": "a", "from": [0, 100], "to": [120, 100] },
            { "name": "b", "from": [200, 90], "to": [100, 90] },
        ],
    }))
    .expect("config")
}

fn job(end: i64, checkpoints: &Path) -> (Arc<Job>, Collect, Collect) {
    let (results, dead) = (Collect::default(), Collect::default());
    let config = config();
    let build = move |worker: usize, peers: usize| {
        let ctx = StageContext {
            worker,
            peers,
            intra_op_threads: 1,
            gpus: &[],
        };
        config.build(&ctx)
    };
    let job = Job {
        name: "line-count".into(),
        source: Arc::new(Cameras {
            end,
            start: Offsets::new(),
        }),
        steps: vec![JobStep {
            name: "line_count".into(),
            at: "stages[0]".into(),
            kind: StepKind::Stage(Arc::new(build)),
        }],
        sink: Arc::new(results.clone()),
        dead_letter: Arc::new(dead.clone()),
        live_sink: None,
        events: None,
        // Small epochs: many epochs and checkpoints.
        epochs: EpochPolicy {
            records: 4,
            max_duration: None,
            max_in_flight: 2,
        },
        checkpoint: Some(CheckpointPolicy::dir(checkpoints)),
        latency_column: None,
        peer_timeout: Duration::from_secs(60),
        slow_worker: None,
    };
    (Arc::new(job), results, dead)
}

fn run_on(job: Arc<Job>, workers: usize) -> RunReport {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let outcome =
            Metrics::new().and_then(|m| run(job, &ClusterConfig::single_process(workers), m));
        let _ = done.send(outcome);
    });
    result
        .recv_timeout(HUNG)
        .expect("the run neither finished nor failed")
        .expect("the run succeeds")
}

/// Per camera, per frame: its events and its totals, as text.
type PerCamera = BTreeMap<String, BTreeMap<i64, (Vec<String>, Vec<String>)>>;

fn per_camera(batches: &[RecordBatch]) -> PerCamera {
    let mut out = PerCamera::new();
    for batch in batches {
        let cameras: &StringArray = batch
            .column_by_name("camera_id")
            .expect("camera_id")
            .as_string::<i32>();
        let frames = ints(batch, "frame");
        let events = joined(batch, "line_events", &["line", "track_id", "direction"]);
        let totals = joined(batch, "line_totals", &["line", "class_id", "in", "out"]);
        for row in 0..batch.num_rows() {
            let seen = out
                .entry(cameras.value(row).to_string())
                .or_default()
                .insert(frames[row], (events[row].clone(), totals[row].clone()));
            assert!(seen.is_none(), "frame {} twice", frames[row]);
        }
    }
    out
}

#[test]
fn line_totals_resume_from_a_checkpoint_on_another_worker_count() {
    let (n, m) = (40, 100);
    let interrupted = tempfile::tempdir().expect("tempdir");
    let (job1, out1, dead1) = job(n, interrupted.path());
    run_on(job1, 2);
    let (job2, out2, dead2) = job(m, interrupted.path());
    run_on(job2, 3);

    let whole = tempfile::tempdir().expect("tempdir");
    let (job3, out3, dead3) = job(m, whole.path());
    run_on(job3, 1);

    let mut both = out1.batches();
    both.extend(out2.batches());
    let (split, once) = (per_camera(&both), per_camera(&out3.batches()));
    // Every frame once in each, with the same crossings and the same running totals: the
    // second run went on from the first's track positions and totals.
    assert_eq!(split.len(), CAMERAS as usize);
    assert_eq!(split, once);
    let second = per_camera(&out2.batches());
    for (camera, frames) in &once {
        assert_eq!(frames.len() as i64, m, "{camera}");
        assert_eq!(second[camera].keys().next(), Some(&n), "{camera}");
        // The scenario does cross both lines both ways.
        let last = frames
            .get(&(m - 1))
            .map(|f| f.1.clone())
            .unwrap_or_default();
        assert!(
            last.iter().any(|t| t.starts_with("a/")) && last.iter().any(|t| t.starts_with("b/")),
            "{camera}: {last:?}"
        );
        let counts = |i: usize| -> i64 {
            last.iter()
                .filter_map(|t| t.split('/').nth(i)?.parse::<i64>().ok())
                .sum()
        };
        assert!(counts(2) > 0 && counts(3) > 0, "{camera}: {last:?}");
    }
    for dead in [dead1, dead2, dead3] {
        assert_eq!(
            dead.batches()
                .iter()
                .map(RecordBatch::num_rows)
                .sum::<usize>(),
            0
        );
    }

    // Both checkpoints hold one state record per camera, the same ones.
    let state = |dir: &Path| {
        let checkpoint = CheckpointStore::open(dir, 3)
            .and_then(|s| s.latest())
            .expect("readable store")
            .expect("a checkpoint");
        let text = checkpoint
            .state
            .get(&format!("{OPERATOR_PREFIX}line_count"))
            .cloned()
            .unwrap_or_default();
        let saved = SavedState::parse(&text).expect("records");
        let mut records: Vec<(String, isize)> = saved
            .records::<KeyedRecord<serde_json::Value>>("line_count")
            .into_iter()
            .map(|(r, n)| (serde_json::to_string(&r).expect("json"), n))
            .collect();
        records.sort();
        records
    };
    let records = state(interrupted.path());
    assert_eq!(records.len(), CAMERAS as usize, "{records:?}");
    assert_eq!(records, state(whole.path()));
}
