//! The `track` stage in the runtime: a run stopped after N frames and resumed from its
//! checkpoint with another worker count gives every detection the track id an uninterrupted
//! run gives it (each camera's tracks, lost tracks and id counter are in the checkpoint).

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::builder::{Float32Builder, Int64Builder, ListBuilder, StructBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::runtime::checkpointing::Offsets;
use riffle_dataflow::runtime::{
    run, CheckpointPolicy, EpochPolicy, Job, JobStep, RunReport, StepKind,
};
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowResult, Sink, Source, SourceBatch, SourceFactory, SourcePosition};
use riffle_operators::vision::track::{TrackConfig, TRACK_ID};
use riffle_operators::{StageContext, StageKind};

/// A run that has not ended by then is hung (a guard only; runs take milliseconds).
const HUNG: Duration = Duration::from_secs(120);

/// A box `(score, [x1, y1, x2, y2])`.
type Det = (f32, [f32; 4]);

/// Camera `c`'s detections in frame `f`: two people crossing, one standing still who is
/// hidden for a while and then seen with low scores, and low-score clutter.
fn scene(c: i64, f: i64) -> Vec<Det> {
    let (cf, ff) = (c as f32, f as f32);
    let person = |x: f32, y: f32| [x, y, x + 20.0, y + 45.0];
    let mut dets = vec![
        (0.9, person(10.0 + 3.0 * ff, 40.0 + 5.0 * cf)),
        (0.8, person(150.0 - 2.5 * ff, 48.0 + 5.0 * cf)),
    ];
    // Listed in another order on odd frames: ids follow tracks, not positions in the list (and a
    // run that lost its state would number them differently from an odd restart frame on).
    if f % 2 == 1 {
        dets.swap(0, 1);
    }
    match f {
        12..=19 => {}
        20..=25 => dets.push((0.3, person(200.0 + cf, 150.0))),
        _ => dets.push((0.85, person(200.0 + cf, 150.0))),
    }
    if f % 7 == 3 {
        dets.push((0.35, person(400.0 + ff, 200.0)));
    }
    dets
}

fn entry_fields() -> Fields {
    let coord = |name: &str| Field::new(name, DataType::Float32, false);
    Fields::from(vec![
        Field::new("class_id", DataType::Int64, false),
        coord("score"),
        coord("x1"),
        coord("y1"),
        coord("x2"),
        coord("y2"),
    ])
}

fn list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(
        DataType::Struct(entry_fields()),
        false,
    )))
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("camera_id", DataType::Utf8, false),
        Field::new("frame", DataType::Int64, false),
        Field::new("detections", list_type(), true),
    ]))
}

fn detections(frames: &[Vec<Det>]) -> ArrayRef {
    let fields = entry_fields();
    let mut list = ListBuilder::new(StructBuilder::from_fields(fields.clone(), 0)).with_field(
        Arc::new(Field::new_list_field(DataType::Struct(fields), false)),
    );
    for dets in frames {
        let entries = list.values();
        for (score, rect) in dets {
            entries
                .field_builder::<Int64Builder>(0)
                .expect("class_id")
                .append_value(1);
            for (i, v) in std::iter::once(score).chain(rect).enumerate() {
                entries
                    .field_builder::<Float32Builder>(i + 1)
                    .expect("f32")
                    .append_value(*v);
            }
            entries.append(true);
        }
        list.append(true);
    }
    Arc::new(list.finish())
}

/// One partition per camera (`cam0`, `cam1`, …), its offsets the frame numbers `0..end`.
#[derive(Clone)]
struct Cameras {
    cameras: i32,
    end: i64,
    start: Offsets,
}

impl SourceFactory for Cameras {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(schema())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        let parts = (0..self.cameras)
            .filter(|p| *p as usize % peers == index)
            .map(|p| (p, self.start.get(&p).copied().unwrap_or(0)))
            .collect();
        Ok(Box::new(CameraPart {
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

/// One worker's cameras, three frames a batch, round-robin.
struct CameraPart {
    parts: VecDeque<(i32, i64)>,
    end: i64,
}

impl Source for CameraPart {
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        let Some((p, from)) = self.parts.pop_front().filter(|(_, next)| *next < self.end) else {
            return Ok(None);
        };
        let to = (from + 3).min(self.end);
        if to < self.end {
            self.parts.push_back((p, to));
        }
        let frames: Vec<i64> = (from..to).collect();
        let dets: Vec<Vec<Det>> = frames.iter().map(|&f| scene(i64::from(p), f)).collect();
        let records = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(vec![format!("cam{p}"); frames.len()])),
                Arc::new(Int64Array::from(frames)),
                detections(&dets),
            ],
        )?;
        Ok(Some(SourceBatch {
            records,
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
struct Collect(Arc<Mutex<Vec<RecordBatch>>>);

impl SinkFactory for Collect {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(self.clone()))
    }
}

impl Sink for Collect {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        self.0.lock().expect("sink lock").push(batch.clone());
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}

/// (camera, frame) → the track id of each detection.
type Ids = BTreeMap<(String, i64), Vec<Option<i64>>>;

impl Collect {
    fn ids(&self) -> Ids {
        let mut out = Ids::new();
        for batch in self.0.lock().expect("sink lock").iter() {
            let cameras = batch.column_by_name("camera_id").expect("camera_id");
            let frames = batch.column_by_name("frame").expect("frame");
            let lists = batch.column_by_name("detections").expect("detections");
            let (cameras, frames) = (
                cameras.as_string::<i32>(),
                frames.as_primitive::<Int64Type>(),
            );
            for row in 0..batch.num_rows() {
                let entries = lists.as_list::<i32>().value(row);
                let ids = entries
                    .as_struct()
                    .column_by_name(TRACK_ID)
                    .expect("track_id");
                let ids: Vec<Option<i64>> = ids.as_primitive::<Int64Type>().iter().collect();
                let key = (cameras.value(row).to_string(), frames.value(row));
                assert!(out.insert(key.clone(), ids).is_none(), "{key:?} twice");
            }
        }
        out
    }

    fn rows(&self) -> usize {
        let batches = self.0.lock().expect("sink lock");
        batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Tracks `cameras` cameras' frames `from..end` on `workers` threads; returns the ids seen
/// and the dead letters' row count.
fn track(cameras: i32, end: i64, workers: usize, checkpoints: &Path) -> (Ids, usize) {
    let config: TrackConfig = serde_json::from_str("{}").expect("defaults");
    let build = move |worker: usize, peers: usize| {
        let ctx = StageContext {
            worker,
            peers,
            intra_op_threads: 1,
            gpus: &[],
        };
        config.build(&ctx)
    };
    let (results, dead) = (Collect::default(), Collect::default());
    let job = Job {
        name: "track".into(),
        source: Arc::new(Cameras {
            cameras,
            end,
            start: Offsets::new(),
        }),
        steps: vec![JobStep {
            name: "track".into(),
            at: "stages[0].track".into(),
            kind: StepKind::Stage(Arc::new(build)),
        }],
        sink: Arc::new(results.clone()),
        dead_letter: Arc::new(dead.clone()),
        live_sink: None,
        events: None,
        // Small epochs: many checkpoints, frames of one camera spread over many epochs.
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
    let report = run_on(Arc::new(job), workers).expect("run");
    assert_eq!(report.workers, workers);
    (results.ids(), dead.rows())
}

fn run_on(job: Arc<Job>, workers: usize) -> DataflowResult<RunReport> {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let outcome = Metrics::new()
            .and_then(|metrics| run(job, &ClusterConfig::single_process(workers), metrics));
        let _ = done.send(outcome);
    });
    result
        .recv_timeout(HUNG)
        .expect("the run neither finished nor failed")
}

#[test]
fn track_ids_continue_after_a_restart_with_another_worker_count() {
    // The restart frame n is odd (detections listed in another order) and within the standing
    // person's hiding (12..=19): their id comes back only through the checkpointed lost track.
    let (cameras, n, m) = (3, 17, 40);
    let interrupted = tempfile::tempdir().expect("tempdir");
    let (first, dead1) = track(cameras, n, 2, interrupted.path());
    let (second, dead2) = track(cameras, m, 3, interrupted.path());
    let whole = tempfile::tempdir().expect("tempdir");
    let (uninterrupted, dead3) = track(cameras, m, 1, whole.path());
    assert_eq!(dead1 + dead2 + dead3, 0);

    // The second run resumed at frame n of every camera.
    assert_eq!(first.len(), (cameras as usize) * n as usize);
    assert!(
        second.keys().all(|(_, f)| (n..m).contains(f)),
        "{:?}",
        second.keys()
    );
    assert_eq!(second.len(), (cameras as usize) * (m - n) as usize);

    let mut resumed = first;
    resumed.extend(second);
    assert_eq!(resumed, uninterrupted);

    // The scene exercised the tracker: per camera, three ids, some detections untracked,
    // and the hidden person's id came back after the restart point.
    for c in 0..cameras {
        let cam = format!("cam{c}");
        let ids: Vec<Option<i64>> = uninterrupted
            .iter()
            .filter(|((k, _), _)| *k == cam)
            .flat_map(|(_, ids)| ids.clone())
            .collect();
        let max = ids.iter().flatten().max().copied();
        assert_eq!(max, Some(3), "{cam}");
        assert!(ids.contains(&None), "{cam}: clutter stays untracked");
        let standing = |f: i64| uninterrupted[&(cam.clone(), f)][2];
        assert_eq!(standing(30), standing(5), "{cam}: the hidden person's id");
        assert!(standing(30).is_some());
    }
}
