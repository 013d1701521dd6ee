//! The runtime on in-memory jobs: delivery through stages and exchanges, resuming from
//! checkpoints through `SourceFactory::resume`, stateful steps across worker counts, and
//! errors that must end a run rather than hang it.

mod doubles;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::StringArray;

use super::checkpointing::{Offsets, OPERATOR_PREFIX};
use super::*;
use crate::checkpoint::CheckpointStore;
use crate::operators::worker_for;
use crate::state::SavedState;
use crate::{Compression, DataflowResult, Source, SourceBatch, SourceFactory};
use doubles::{
    key_of, Collect, CountPerKey, EpochLog, Failing, FailsAtTheEnd, KeyCount, Numbers, PauseOnce,
    RecoversWhileStagesLoad, Tag, Transactional, KEYS,
};

/// A run that has not ended by then is hung: the test fails instead of blocking the suite.
/// (A guard only; runs here take milliseconds.)
const HUNG: Duration = Duration::from_secs(120);

fn stage(
    name: &str,
    build: impl Fn(usize, usize) -> DataflowResult<Step> + Send + Sync + 'static,
) -> JobStep {
    JobStep {
        name: name.into(),
        at: format!("stages.{name}"),
        kind: StepKind::Stage(Arc::new(build)),
    }
}

fn exchange(name: &str, at: &str, route: Route) -> JobStep {
    JobStep {
        name: name.into(),
        at: at.into(),
        kind: StepKind::Exchange(route, Compression::None),
    }
}

fn tag(column: &'static str) -> JobStep {
    stage(column, move |worker, _| {
        Ok(Step::Apply(Box::new(Tag { column, worker })))
    })
}

fn count() -> JobStep {
    stage("count", |_, _| Ok(Step::Stateful(Box::new(CountPerKey))))
}

struct Outputs {
    results: Collect,
    dead: Collect,
}

fn job(source: Numbers, steps: Vec<JobStep>, checkpoints: Option<&Path>) -> (Arc<Job>, Outputs) {
    let out = Outputs {
        results: Collect::default(),
        dead: Collect::default(),
    };
    let job = Job {
        name: "test".into(),
        source: Arc::new(source),
        steps,
        sink: Arc::new(out.results.clone()),
        dead_letter: Arc::new(out.dead.clone()),
        live_sink: None,
        events: None,
        // Small epochs, little room ahead: many epochs, checkpoints and flow-control waits.
        epochs: EpochPolicy {
            records: 4,
            max_duration: None,
            max_in_flight: 2,
        },
        checkpoint: checkpoints.map(CheckpointPolicy::dir),
        latency_column: None,
        peer_timeout: Duration::from_secs(60),
        slow_worker: None,
    };
    (Arc::new(job), out)
}

/// Runs `job` on `workers` threads of this process.
fn run_on(job: Arc<Job>, workers: usize) -> DataflowResult<RunReport> {
    run_within(job, workers, HUNG)
}

/// Runs `job` on `workers` threads of this process, failing the test if it has not ended
/// within `hung`.
fn run_within(job: Arc<Job>, workers: usize, hung: Duration) -> DataflowResult<RunReport> {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let context = RunContext::new().expect("metrics");
        let _ = done.send(run(job, &ClusterConfig::single_process(workers), context));
    });
    result
        .recv_timeout(hung)
        .expect("the run neither finished nor failed")
}

fn sorted(mut v: Vec<i64>) -> Vec<i64> {
    v.sort_unstable();
    v
}

fn owner(key: &str, peers: usize) -> i64 {
    worker_for(&StringArray::from(vec![key]), 0, peers).expect("a key") as i64
}

/// The newest checkpoint in `dir`: its source offsets and its `count` step's state.
fn latest(dir: &Path) -> (Offsets, Vec<(String, isize)>) {
    let checkpoint = CheckpointStore::open(dir, 3)
        .and_then(|s| s.latest())
        .expect("readable store")
        .expect("a checkpoint");
    let offsets = checkpoint
        .sources
        .get("numbers")
        .cloned()
        .unwrap_or_default();
    let state = checkpoint
        .state
        .get(&format!("{OPERATOR_PREFIX}count"))
        .map(|s| SavedState::parse(s).expect("state records"))
        .unwrap_or_default();
    // As `key,count` texts, sorted.
    let mut state: Vec<(String, isize)> = state
        .records::<KeyCount>("count")
        .into_iter()
        .map(|(r, n)| (format!("{},{}", r.key, r.count), n))
        .collect();
    state.sort();
    (offsets, state)
}

fn offsets(partitions: i32, next: i64) -> Offsets {
    (0..partitions).map(|p| (p, next)).collect()
}

#[test]
fn every_row_arrives_once_through_stages_around_a_keyed_exchange() {
    for workers in [1, 3] {
        let steps = vec![
            tag("read_by"),
            exchange("by-key", "stages[1].exchange", Route::Key("key".into())),
            tag("owner"),
        ];
        let (job, out) = job(Numbers::new(4, 10), steps, None);
        let report = run_on(job, workers).expect("run");
        assert_eq!(report.workers, workers);

        let ids = out.results.ints("id");
        assert_eq!(
            sorted(ids.clone()),
            Numbers::ids(4, 0, 10),
            "{workers} worker(s)"
        );
        let (read_by, owners, keys) = (
            out.results.ints("read_by"),
            out.results.ints("owner"),
            out.results.strings("key"),
        );
        for (i, id) in ids.iter().enumerate() {
            // Read where the source put its partition; counted where the key lives.
            assert_eq!(read_by[i], (id % 4) % workers as i64, "row {id}");
            assert_eq!(owners[i], owner(&keys[i], workers), "row {id}");
        }
        assert_eq!(out.dead.rows(), 0);
    }
}

#[test]
fn a_run_resumes_its_source_at_the_checkpointed_offsets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Numbers::new(3, 8);
    let (job1, out1) = job(first.clone(), vec![tag("read_by")], Some(dir.path()));
    run_on(job1, 2).expect("first run");
    assert!(
        first.resumed.lock().unwrap().is_empty(),
        "nothing to resume"
    );
    assert_eq!(sorted(out1.results.ints("id")), Numbers::ids(3, 0, 8));
    assert_eq!(latest(dir.path()).0, offsets(3, 8));

    // The source has grown; the second run (more workers) reads only what is new.
    let second = Numbers::new(3, 14);
    let (job2, out2) = job(second.clone(), vec![tag("read_by")], Some(dir.path()));
    run_on(job2, 3).expect("second run");
    assert_eq!(*second.resumed.lock().unwrap(), vec![offsets(3, 8)]);
    assert_eq!(sorted(out2.results.ints("id")), Numbers::ids(3, 8, 14));
    assert_eq!(latest(dir.path()).0, offsets(3, 14));
    assert_eq!(out1.dead.rows() + out2.dead.rows(), 0);
}

/// A job writing to a transactional destination, checkpointing every 2 ms.
fn transactional_job(source: Numbers, sink: &Transactional) -> Arc<Job> {
    let (job, _) = job(source, vec![tag("read_by")], Some(&sink.dir));
    let mut job = Arc::try_unwrap(job).unwrap_or_else(|_| unreachable!());
    job.sink = Arc::new(sink.clone());
    if let Some(c) = job.checkpoint.as_mut() {
        c.interval = Duration::from_millis(2);
    }
    Arc::new(job)
}

#[test]
fn a_live_sources_epochs_are_numbered_by_the_clock_a_replays_by_count() {
    // Each worker reads 30 rows, one every 5 ms (≥ 150 ms of reading), in epochs of 4 rows.
    // Live: each epoch is numbered by the ms it closed at since the start, so both workers'
    // epochs of one moment share a number (neither waits for the other to count as many).
    // Replayed: counted, ~8 a worker.
    for (pace, clocked) in [(Some(Duration::from_millis(5)), true), (None, false)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut source = Numbers::new(2, 30);
        source.batch_rows = 1;
        source.pace = pace;
        let epochs = EpochLog::default();
        let (job, _) = job(source, vec![tag("read_by")], Some(dir.path()));
        let mut job = Arc::try_unwrap(job).unwrap_or_else(|_| unreachable!());
        job.sink = Arc::new(epochs.clone());
        run_on(Arc::new(job), 2).expect("run");
        let written = epochs.0.lock().unwrap().clone();
        let last = written.iter().copied().max().unwrap_or(0);
        assert!(
            written.windows(2).all(|w| w[0] < w[1]),
            "in order: {written:?}"
        );
        if clocked {
            assert!(last >= 150, "clocked: ms since the start: {written:?}");
        } else {
            assert!(last < 60, "counted: {written:?}");
        }
    }
}

#[test]
fn the_sinks_recovery_runs_while_the_workers_build_their_stages() {
    // The sink's recovery (a transactional sink's init_transactions and commit log) waits until
    // a stage has been built; building a stage waits for nothing. Had the run recovered before
    // building its stages, recovery would give up and the run fail.
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = RecoversWhileStagesLoad {
        results: Collect::default(),
        built: Arc::default(),
        patience: Duration::from_secs(20),
    };
    let signal = sink.clone();
    let loads = stage("model", move |worker, _| {
        signal.stage_built();
        Ok(Step::Apply(Box::new(Tag {
            column: "read_by",
            worker,
        })))
    });
    let (job, _) = job(Numbers::new(2, 50), vec![loads], Some(dir.path()));
    let mut job = Arc::try_unwrap(job).unwrap_or_else(|_| unreachable!());
    job.sink = Arc::new(sink.clone());
    run_on(Arc::new(job), 2).expect("run");
    assert_eq!(sink.results.rows(), 100);
}

#[test]
fn a_failed_start_is_the_runs_one_error() {
    // Checkpoints into a path that is a file: every worker waits on the failed start, one
    // of them returns its error and the run reports that error.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    let (job, out) = job(Numbers::new(2, 10), vec![tag("read_by")], Some(&file));
    let err = run_on(job, 2).expect_err("checkpoints into a file");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
    assert_eq!(out.results.rows(), 0);
}

#[test]
fn transactions_commit_exactly_what_their_checkpoint_covers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut source = Numbers::new(3, 400);
    source.batch_rows = 1;
    let sink = Transactional {
        log: Arc::default(),
        dir: dir.path().to_path_buf(),
        partitions: 3,
        fail_commit: None,
    };
    run_on(transactional_job(source, &sink), 2).expect("run");
    let log = sink.log.lock().unwrap();
    assert_eq!(log.violations, Vec::<String>::new());
    assert!(log.commits() > 3, "several transactions: {}", log.commits());
    assert_eq!(log.committed_ids(), Numbers::ids(3, 0, 400));
}

#[test]
fn a_failed_commit_resumes_from_the_last_committed_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut source = Numbers::new(3, 300);
    source.batch_rows = 1;
    let mut sink = Transactional {
        log: Arc::default(),
        dir: dir.path().to_path_buf(),
        partitions: 3,
        fail_commit: Some(3),
    };
    // The third commit fails after its checkpoint was written: that checkpoint must not be
    // resumed from, and what its transaction held is written again.
    assert!(run_on(transactional_job(source.clone(), &sink), 2).is_err());
    assert_eq!(sink.log.lock().unwrap().commits(), 2);
    sink.fail_commit = None;
    run_on(transactional_job(source.clone(), &sink), 3).expect("second run");
    let resumed = source.resumed.lock().unwrap().clone();
    assert_eq!(resumed.len(), 1, "the second run resumed once");
    let log = sink.log.lock().unwrap();
    assert_eq!(log.violations, Vec::<String>::new());
    assert_eq!(log.committed_ids(), Numbers::ids(3, 0, 300));
}

/// Per key, the running counts seen at the sink.
fn counts_by_key(out: &Collect) -> BTreeMap<String, Vec<i64>> {
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, count) in out.strings("key").into_iter().zip(out.ints("count")) {
        by_key.entry(key).or_default().push(count);
    }
    by_key
}

#[test]
fn stateful_state_is_restored_on_another_worker_count() {
    let (n, m) = (7, 16);
    let interrupted = tempfile::tempdir().expect("tempdir");
    let (job1, out1) = job(Numbers::new(3, n), vec![count()], Some(interrupted.path()));
    run_on(job1, 2).expect("first run");
    let (job2, out2) = job(Numbers::new(3, m), vec![count()], Some(interrupted.path()));
    run_on(job2, 3).expect("second run");
    assert_eq!(sorted(out2.results.ints("id")), Numbers::ids(3, n, m));

    let whole = tempfile::tempdir().expect("tempdir");
    let (job3, out3) = job(Numbers::new(3, m), vec![count()], Some(whole.path()));
    run_on(job3, 1).expect("uninterrupted run");

    // Every key's counts run 1, 2, …, its rows: the second run went on from the first's
    // counts (a lost or duplicated state record would repeat or skip counts).
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for id in Numbers::ids(3, 0, m) {
        *expected.entry(key_of(id)).or_default() += 1;
    }
    assert_eq!(expected.len(), KEYS as usize);
    let mut both = counts_by_key(&out1.results);
    for (key, counts) in counts_by_key(&out2.results) {
        both.entry(key).or_default().extend(counts);
    }
    let uninterrupted = counts_by_key(&out3.results);
    for (key, rows) in &expected {
        assert_eq!(
            sorted(both[key].clone()),
            (1..=*rows).collect::<Vec<_>>(),
            "{key}"
        );
        assert_eq!(uninterrupted[key].iter().max(), Some(rows), "{key}");
    }

    // The resumed run's checkpoint holds the whole state, as the uninterrupted run's does.
    let state: Vec<(String, isize)> = expected
        .iter()
        .map(|(key, rows)| (format!("{key},{rows}"), 1))
        .collect();
    assert_eq!(latest(interrupted.path()), (offsets(3, m), state.clone()));
    assert_eq!(latest(whole.path()), (offsets(3, m), state));
}

#[test]
fn a_failing_stage_build_fails_the_run() {
    // On every worker, and on one worker (the sink's, or another) while the other runs.
    for failing in [None, Some(0), Some(1)] {
        let build = move |worker: usize, _| {
            if failing.is_none_or(|w| w == worker) {
                return Err(DataflowError::Config(format!(
                    "no model for worker {worker}"
                )));
            }
            Ok(Step::Apply(Box::new(Tag {
                column: "read_by",
                worker,
            })))
        };
        let (job, _) = job(Numbers::new(4, 50), vec![stage("model", build)], None);
        let err = run_on(job, 2).expect_err("a stage that cannot be built");
        match (failing, &err) {
            (Some(w), DataflowError::Config(m)) => {
                assert_eq!(m, &format!("no model for worker {w}"))
            }
            (_, DataflowError::Config(m)) => assert!(m.starts_with("no model for worker"), "{m}"),
            _ => panic!("unexpected error: {err}"),
        }
    }
}

#[test]
fn placing_stages_on_a_missing_worker_is_an_error_at_the_exchange() {
    let steps = vec![
        tag("read_by"),
        exchange("gpu", "stages[1].exchange", Route::Workers(vec![5])),
        tag("owner"),
    ];
    let (job, out) = job(Numbers::new(2, 4), steps, None);
    let err = run_on(job, 2).expect_err("worker 5 of 2");
    let message = err.to_string();
    assert!(
        message.starts_with("stages[1].exchange.workers: worker 5 does not exist"),
        "{message}"
    );
    assert_eq!(out.results.rows(), 0);
}

#[test]
fn a_sink_that_cannot_write_fails_the_run() {
    for workers in [1, 3] {
        let (mut job, _) = job(Numbers::new(4, 50), vec![tag("read_by")], None);
        Arc::get_mut(&mut job).expect("unshared").sink = Arc::new(Failing);
        let err = run_on(job, workers).expect_err("the sink fails");
        assert_eq!(err.to_string(), "disk full", "{workers} worker(s)");
    }
}

/// The sink fails after the other workers are done with their part (as a topic sink whose
/// deliveries all failed): the run ends with the sink's error instead of waiting for those
/// workers, whose dataflows can no longer complete.
#[test]
fn a_sink_that_fails_after_the_other_workers_finished_ends_the_run_with_its_error() {
    for workers in [2, 3] {
        let (mut job, _) = job(Numbers::new(4, 50), vec![tag("read_by")], None);
        Arc::get_mut(&mut job).expect("unshared").sink = Arc::new(FailsAtTheEnd {
            after: Duration::from_millis(300),
        });
        let err = run_within(job, workers, Duration::from_secs(60)).expect_err("the sink fails");
        assert_eq!(
            err.to_string(),
            "sink: 300 message(s) not delivered",
            "{workers} workers"
        );
    }
}

/// A worker of this process busy in one call for longer than `peer_timeout` is not taken for a
/// lost process, by its peers or, once back, by itself.
#[test]
fn a_worker_busy_in_a_call_is_not_taken_for_a_lost_process() {
    for busy in [0, 1] {
        let pause = stage("pause", move |me, _| {
            Ok(Step::Apply(Box::new(PauseOnce {
                worker: busy,
                me,
                pause: Duration::from_millis(1500),
                paused: false,
            })))
        });
        let (mut job, out) = job(Numbers::new(2, 40), vec![pause], None);
        Arc::get_mut(&mut job).expect("unshared").peer_timeout = Duration::from_millis(300);
        let report = run_on(job, 2);
        assert!(report.is_ok(), "worker {busy} busy: {:?}", report.err());
        assert_eq!(out.results.rows(), 80, "worker {busy} busy");
    }
}

#[test]
fn the_watch_ends_a_failed_run_after_a_grace_and_a_stopped_one_when_a_worker_is_stuck() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let grace = FAILED_GRACE.as_millis() as u64;
    let stall = STOP_STALL.as_millis() as u64;

    // A failure: the others get a grace to wind down, however busy they are.
    let mut watch = Watch::default();
    assert_eq!(
        watch.check(at(1000), true, false, true, [(1, at(1000))]),
        None
    );
    assert_eq!(
        watch.check(at(1000 + grace), true, false, true, [(1, at(1000 + grace))]),
        Some(Verdict::Failed)
    );

    // Neither failed nor asked to stop: a quiet worker is waited for.
    let mut watch = Watch::default();
    assert_eq!(
        watch.check(at(100_000), false, false, true, [(0, t0)]),
        None
    );

    // Asked to stop at 1 s: worker 3, in one call since 0.5 s, is left after STOP_STALL from
    // the request; worker 2, back in its loop all along, is waited for.
    let mut watch = Watch::default();
    assert_eq!(
        watch.check(at(1000), false, true, true, [(2, at(1000)), (3, at(500))]),
        None
    );
    let late = at(1000 + stall);
    assert_eq!(
        watch.check(
            late - Duration::from_millis(1),
            false,
            true,
            true,
            [(3, at(500))]
        ),
        None
    );
    assert_eq!(
        watch.check(late, false, true, true, [(2, late), (3, at(500))]),
        Some(Verdict::Stuck {
            worker: 3,
            away: Duration::from_millis(500 + stall)
        })
    );
    let message = abandoned(&Verdict::Stuck {
        worker: 3,
        away: Duration::from_millis(500 + stall),
    })
    .to_string();
    assert!(
        message.starts_with("runtime: stopped on request, but worker 3 has been in one call"),
        "{message}"
    );

    // The same, but no worker had gone on to read (worker 3 still loading a model): the run
    // ends without it and without an error, after the same wait.
    let mut watch = Watch::default();
    assert_eq!(
        watch.check(at(1000), false, true, false, [(3, at(500))]),
        None
    );
    assert_eq!(
        watch.check(late, false, true, false, [(2, late), (3, at(500))]),
        Some(Verdict::NotStarted {
            worker: 3,
            away: Duration::from_millis(500 + stall)
        })
    );
}

/// A source that reads `rows` rows, then finds nothing for `quiet`, then ends; it can wake its
/// worker (it never needs to: nothing arrives). Counts the reads.
#[derive(Clone)]
struct Quiet {
    rows: i64,
    quiet: Duration,
    reads: Arc<std::sync::atomic::AtomicUsize>,
}

struct QuietPart {
    quiet: Quiet,
    sent: bool,
    until: Option<std::time::Instant>,
}

impl SourceFactory for Quiet {
    fn schema(&self) -> DataflowResult<arrow_schema::SchemaRef> {
        Ok(Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("id", arrow_schema::DataType::Int64, false),
        ])))
    }

    fn partition(&self, index: usize, _peers: usize) -> DataflowResult<Box<dyn Source>> {
        Ok(Box::new(QuietPart {
            quiet: self.clone(),
            // Only worker 0 reads anything; the other ends at once.
            sent: index != 0,
            until: None,
        }))
    }
}

impl Source for QuietPart {
    fn wake_with(&mut self, _wake: crate::source::Wake) -> bool {
        true
    }

    fn clocked(&self) -> bool {
        true
    }

    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        use std::sync::atomic::Ordering;
        let schema = SourceFactory::schema(&self.quiet)?;
        if !self.sent {
            self.sent = true;
            self.quiet.reads.fetch_add(1, Ordering::Relaxed);
            let ids = arrow_array::Int64Array::from_iter_values(0..self.quiet.rows);
            let records = arrow_array::RecordBatch::try_new(schema, vec![Arc::new(ids)])?;
            self.until = Some(std::time::Instant::now() + self.quiet.quiet);
            return Ok(Some(SourceBatch::new(records, Vec::new())));
        }
        match self.until {
            Some(until) if std::time::Instant::now() < until => {
                self.quiet.reads.fetch_add(1, Ordering::Relaxed);
                let empty = arrow_array::RecordBatch::new_empty(schema);
                Ok(Some(SourceBatch::new(empty, Vec::new())))
            }
            _ => Ok(None),
        }
    }
}

#[test]
fn a_quiet_source_that_wakes_its_worker_is_not_polled_and_its_empty_reads_are_no_batches() {
    // Before, a worker looked at a quiet camera every 5 ms (~200 reads a second, each counted
    // as a source batch); now it parks until woken, looking again only every idle epoch.
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let source = Quiet {
        rows: 3,
        quiet: Duration::from_millis(600),
        reads: reads.clone(),
    };
    let (job, out) = job(Numbers::new(1, 1), vec![tag("read_by")], None);
    let mut job = Arc::try_unwrap(job).unwrap_or_else(|_| unreachable!());
    job.source = Arc::new(source);
    let report = run_on(Arc::new(job), 2).expect("run");
    assert_eq!(out.results.rows(), 3);
    let reads = reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (2..=30).contains(&reads),
        "{reads} reads in 600 ms of quiet"
    );
    let source = report.summary.stages.iter().find(|s| s.name == "source");
    assert_eq!(
        source.map(|s| s.batches),
        Some(1),
        "empty reads are not batches"
    );
}

/// Keeps the rows with an even `id` (a filter after a balanced exchange).
struct EvenIds;

impl crate::Stage for EvenIds {
    fn name(&self) -> &str {
        "even"
    }

    fn output_schema(
        &self,
        input: &arrow_schema::SchemaRef,
    ) -> DataflowResult<arrow_schema::SchemaRef> {
        Ok(input.clone())
    }

    fn process_batch(
        &mut self,
        batch: &arrow_array::RecordBatch,
    ) -> DataflowResult<crate::StageOutput> {
        let ids = batch
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<arrow_array::Int64Array>())
            .expect("an id column");
        let even: arrow_array::BooleanArray = ids.iter().map(|v| v.map(|v| v % 2 == 0)).collect();
        Ok(crate::StageOutput::all(
            arrow_select::filter::filter_record_batch(batch, &even)?,
        ))
    }
}

#[test]
fn a_source_held_by_a_balanced_model_ends_with_every_row_once_though_a_filter_drops_some() {
    // The source reads only while a model has room somewhere (its credit follows the
    // balancer's load reports); rows the filter drops are done there, not waiting forever.
    let steps = vec![
        exchange(
            "balance",
            "stages[0].exchange",
            Route::Balance(Vec::new(), None),
        ),
        stage("even", |_, _| Ok(Step::Apply(Box::new(EvenIds)))),
        stage("model", |worker, _| {
            let policy = crate::operators::BatchPolicy {
                max_size: 1,
                max_delay: Duration::from_millis(5),
                late_after: None,
                drop_late: false,
            };
            Ok(Step::Batched(
                Box::new(Tag {
                    column: "ran_on",
                    worker,
                }),
                policy,
            ))
        }),
    ];
    let (job, out) = job(Numbers::new(4, 30), steps, None);
    let built = super::chain::worker_steps(&job.steps, 0, 2, None).expect("steps");
    assert_eq!(super::chain::balanced_model(&built).map(|m| m.1), Some(1));
    run_within(job, 2, HUNG).expect("run");
    let even: Vec<i64> = Numbers::ids(4, 0, 30)
        .into_iter()
        .filter(|i| i % 2 == 0)
        .collect();
    assert_eq!(sorted(out.results.ints("id")), even);
}

#[test]
fn rows_a_timed_stage_drops_are_done_on_its_worker() {
    let cell = crate::operators::ServiceCell::default();
    let mut even = super::step::Instrumented::timed(Box::new(EvenIds), &cell);
    let ids = arrow_array::Int64Array::from(vec![1, 2, 3, 4, 5]);
    let batch =
        arrow_array::RecordBatch::try_from_iter([("id", Arc::new(ids) as arrow_array::ArrayRef)])
            .expect("batch");
    let out = even.process_batch(&batch).expect("filtered");
    assert_eq!(out.records.num_rows(), 2);
    let s = crate::operators::service(&cell);
    // The 3 odd rows will never reach the end of the balanced stages: done here.
    assert_eq!((s.done_rows, s.busy_rows), (3, 5));
}
