//! Dynamic batching: merging small batches into model-sized ones.

use std::collections::VecDeque;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::batch::now_ns;
use crate::credit::Credit;
use crate::dead_letter::DeadLetter;
use crate::observe::registry::StageMetrics;
use crate::operators::apply_stage::run_stage_untraced;
use crate::operators::BatchStream;
use crate::{Batch, BatchKind, Epoch, Stage};
use arrow_select::concat::concat_batches;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::scheduling::SyncActivator;

/// When to run a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    pub max_size: usize,
    pub max_delay: Duration,
    /// Records older than this when their batch is about to run are late (counted).
    pub late_after: Option<Duration>,
    /// Late records are dropped rather than run.
    pub drop_late: bool,
}

/// Runs a row-preserving [`Stage`] (a model) on batches of up to `max_size` rows gathered
/// across incoming batches, epochs and keys (e.g. frames of different cameras).
pub trait DynamicBatch<'scope> {
    /// A batch is run as soon as `max_size` rows wait, or when the oldest waiting row has
    /// waited `max_delay` (the operator schedules its own wake-up with timely's activator: no
    /// polling), or when the input ends. Results are split back along the incoming batches, so
    /// every row keeps its epoch and provenance.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use arrow_schema::SchemaRef;
    /// use riffle_dataflow::{Batch, DataflowResult, Stage, StageOutput};
    /// use riffle_dataflow::observe::registry::Metrics;
    /// use riffle_dataflow::operators::{BatchPolicy, DynamicBatch};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// struct Double;
    /// impl Stage for Double {
    ///     fn name(&self) -> &str { "double" }
    ///     fn preserves_rows(&self) -> bool { true }
    ///     fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> { Ok(input.clone()) }
    ///     fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
    ///         Ok(StageOutput::all(batch.clone()))
    ///     }
    /// }
    ///
    /// let metrics = Metrics::new().unwrap();
    /// let stage_metrics = metrics.stage("double").unwrap();
    /// let rows = Arc::new(Mutex::new(0));
    /// let seen = rows.clone();
    /// timely::example(move |scope| {
    ///     let one = |v| Batch::records(RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![v])) as _)]).unwrap(), 0);
    ///     (0..5).map(one)
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .dynamic_batch(Box::new(Double), BatchPolicy { max_size: 4, max_delay: Duration::from_millis(5), late_after: None, drop_late: false }, stage_metrics)
    ///         .inspect(move |b: &Batch| *seen.lock().unwrap() += b.num_rows());
    /// });
    /// assert_eq!(*rows.lock().unwrap(), 5);
    /// // Five one-row batches ran as a batch of 4 and a batch of 1.
    /// assert_eq!(metrics.summary(Duration::from_secs(1)).stages[0].batches, 2);
    /// ```
    fn dynamic_batch(
        self,
        stage: Box<dyn Stage>,
        policy: BatchPolicy,
        metrics: Arc<StageMetrics>,
    ) -> Self;

    /// [`DynamicBatch::dynamic_batch`] fed by this worker's own source through `credit`: a
    /// partial batch runs as soon as the source has no more rows ready (the worker will not
    /// read again before the model runs), so `max_delay` only delays rows while more are known
    /// to be coming; each row run (or dropped) returns its credit to the source.
    fn dynamic_batch_fed(
        self,
        stage: Box<dyn Stage>,
        policy: BatchPolicy,
        metrics: Arc<StageMetrics>,
        credit: Credit,
    ) -> Self;
}

struct Waiting {
    cap: Capability<Epoch>,
    batch: Batch,
    since: Instant,
}

impl<'scope> DynamicBatch<'scope> for BatchStream<'scope> {
    fn dynamic_batch(
        self,
        stage: Box<dyn Stage>,
        policy: BatchPolicy,
        metrics: Arc<StageMetrics>,
    ) -> Self {
        batched(self, stage, policy, metrics, None)
    }

    fn dynamic_batch_fed(
        self,
        stage: Box<dyn Stage>,
        policy: BatchPolicy,
        metrics: Arc<StageMetrics>,
        credit: Credit,
    ) -> Self {
        batched(self, stage, policy, metrics, Some(credit))
    }
}

fn batched<'scope>(
    stream: BatchStream<'scope>,
    stage: Box<dyn Stage>,
    policy: BatchPolicy,
    metrics: Arc<StageMetrics>,
    credit: Option<Credit>,
) -> BatchStream<'scope> {
    let scope = stream.scope();
    let name = format!("Batched({})", stage.name());
    stream.unary_frontier(Pipeline, &name, move |_, info| {
        let activator = scope.activator_for(info.address.clone());
        let mut batcher = Batcher {
            preserves_rows: stage.preserves_rows(),
            policy,
            max_size: policy.max_size.max(1),
            metrics: metrics.clone(),
            credit: credit.clone(),
            waiting: VecDeque::new(),
            waiting_rows: 0,
        };
        // Fed by its worker's source, the stage runs on a thread of its own: its worker stays
        // free meanwhile to move epochs on, write results and pass on progress, so no other
        // worker's results wait for this model's run.
        let (mut here, mut thread) = match &credit {
            Some(c) => {
                c.attach(scope.activator_for(info.address.clone()));
                let wake = scope.worker().sync_activator_for(info.address.to_vec());
                let max_size = batcher.max_size;
                (
                    None,
                    Some(ModelThread::start(stage, metrics.clone(), max_size, wake)),
                )
            }
            None => (Some(stage), None),
        };
        let mut running: Option<Running> = None;
        let max_size = batcher.max_size;
        move |(input, frontier), output| {
            input.for_each(|cap, data| {
                for batch in data.drain(..) {
                    if batch.kind != BatchKind::Records || batch.num_rows() == 0 {
                        output.session(&cap).give(batch);
                    } else if let Some(cap) = cap.retain_least(output.output_index()) {
                        batcher.take(cap, batch);
                    }
                }
            });
            let input_done = frontier.is_empty();
            let complete = |e: &Epoch| !frontier.less_equal(e);
            match (thread.as_mut(), here.as_mut()) {
                (Some(thread), _) => {
                    if let Some(done) = running.as_ref().and_then(|r| thread.finished(r)) {
                        let ran = running.take();
                        // The group's rows give their credit back to the source.
                        if let (Some(c), Some(r)) = (&credit, &ran) {
                            c.done(r.rows);
                            c.set_busy(false);
                        }
                        for (cap, batch) in ran.map(|r| r.results(done)).unwrap_or_default() {
                            output.session(&cap).give(batch);
                        }
                    }
                    if running.is_none() && batcher.should_run(complete, input_done) {
                        let (caps, batches, rows) = batcher.next_group();
                        if let Some(c) = &credit {
                            c.set_busy(true);
                        }
                        let run = thread.submit(caps, batches, rows);
                        if run.lost {
                            activator.activate();
                        }
                        running = Some(run);
                    }
                }
                (None, Some(stage)) => {
                    while batcher.should_run(complete, input_done) {
                        let (caps, batches, _) = batcher.next_group();
                        let started = Instant::now();
                        let out = run_batches(stage.as_mut(), &metrics, &batches, max_size);
                        for (cap, batch) in with_caps(&caps, traced(out, started.elapsed())) {
                            output.session(&cap).give(batch);
                        }
                    }
                }
                (None, None) => {}
            }
            // While the model thread runs, its reply wakes the operator: a deadline passed
            // meanwhile would only spin it.
            if let Some(wait) = batcher.next_deadline().filter(|_| running.is_none()) {
                activator.activate_after(wait);
            }
        }
    })
}

/// `out` with `took` added to its results' stage time.
fn traced(mut out: Vec<(Option<usize>, Batch)>, took: Duration) -> Vec<(Option<usize>, Batch)> {
    let took = took.as_nanos() as u64;
    for (_, b) in &mut out {
        if b.kind == BatchKind::Records {
            b.trace.stages_ns = b.trace.stages_ns.saturating_add(took);
        }
    }
    out
}

/// A batched stage on a thread of its own, one group at a time.
struct ModelThread {
    groups: Option<mpsc::Sender<Vec<Batch>>>,
    results: mpsc::Receiver<Vec<(Option<usize>, Batch)>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ModelThread {
    fn start(
        mut stage: Box<dyn Stage>,
        metrics: Arc<StageMetrics>,
        max_size: usize,
        wake: SyncActivator,
    ) -> Self {
        let (groups, inbox) = mpsc::channel::<Vec<Batch>>();
        let (outbox, results) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name(format!("riffle-{}", stage.name()))
            .spawn(move || {
                // Should the stage panic, the operator is woken to find the thread gone.
                let wake = WakeOnExit(wake);
                while let Ok(batches) = inbox.recv() {
                    let started = Instant::now();
                    let out = run_batches(stage.as_mut(), &metrics, &batches, max_size);
                    if outbox.send(traced(out, started.elapsed())).is_err() {
                        break;
                    }
                    // The worker may be gone at the end of the run: nothing is waiting then.
                    let _ = wake.0.activate();
                }
            })
            .ok();
        ModelThread {
            groups: Some(groups),
            results,
            handle,
        }
    }

    /// Hands a group to the thread; its capabilities stay here until its results are back.
    fn submit(
        &mut self,
        caps: Vec<Capability<Epoch>>,
        batches: Vec<Batch>,
        rows: usize,
    ) -> Running {
        let sent = self
            .groups
            .as_ref()
            .is_some_and(|g| g.send(batches.clone()).is_ok());
        Running {
            caps,
            batches,
            rows,
            lost: !sent,
        }
    }

    /// The results of the running group, once the thread is done with it (or has died).
    fn finished(&self, running: &Running) -> Option<Finished> {
        if running.lost {
            return Some(Finished::Lost);
        }
        match self.results.try_recv() {
            Ok(out) => Some(Finished::Ran(out)),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Finished::Lost),
        }
    }
}

/// Activates the operator when the model thread ends, however it ends.
struct WakeOnExit(SyncActivator);

impl Drop for WakeOnExit {
    fn drop(&mut self) {
        let _ = self.0.activate();
    }
}

impl Drop for ModelThread {
    fn drop(&mut self) {
        // Closing the channel ends the thread; nothing is running once the operator is gone.
        self.groups.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A group on the model thread.
struct Running {
    caps: Vec<Capability<Epoch>>,
    /// The group's batches, kept (their columns are shared) to become dead letters should the
    /// thread die.
    batches: Vec<Batch>,
    rows: usize,
    /// The thread was gone before the group could be sent.
    lost: bool,
}

enum Finished {
    Ran(Vec<(Option<usize>, Batch)>),
    Lost,
}

impl Running {
    /// The group's results with their capabilities.
    fn results(self, done: Finished) -> Vec<(Capability<Epoch>, Batch)> {
        let out = match done {
            Finished::Ran(out) => out,
            Finished::Lost => self
                .batches
                .iter()
                .enumerate()
                .filter_map(|(i, b)| lost(b).map(|d| (Some(i), d)))
                .collect(),
        };
        with_caps(&self.caps, out)
    }
}

/// A group whose model thread died (a panic in the stage): its rows as dead letters.
fn lost(batch: &Batch) -> Option<Batch> {
    let reason = "the model's thread stopped (a panic in the stage)";
    let letters: Vec<DeadLetter> = (0..batch.num_rows())
        .map(|row| DeadLetter::for_row("model", &batch.data, row, reason))
        .collect();
    match crate::dead_letter::to_batch(&letters) {
        Ok(data) => Some(Batch::dead_letters(data, batch.ingest_ns)),
        Err(e) => {
            tracing::error!("cannot build dead letters: {e}");
            None
        }
    }
}

/// A batched stage's queue and the decisions on it.
struct Batcher {
    preserves_rows: bool,
    policy: BatchPolicy,
    max_size: usize,
    metrics: Arc<StageMetrics>,
    credit: Option<Credit>,
    waiting: VecDeque<Waiting>,
    waiting_rows: usize,
}

impl Batcher {
    fn take(&mut self, cap: Capability<Epoch>, batch: Batch) {
        self.waiting_rows += batch.num_rows();
        self.waiting.push_back(Waiting {
            cap,
            batch,
            since: Instant::now(),
        });
    }

    /// A batch runs when it is full, when the input has ended, when its oldest row has waited
    /// `max_delay`, when its epoch is complete (no more rows of it can come), or when the
    /// worker's source has no more rows ready: waiting then only delays results.
    fn should_run(&self, complete: impl Fn(&Epoch) -> bool, input_done: bool) -> bool {
        let Some(oldest) = self.waiting.front() else {
            return false;
        };
        self.waiting_rows >= self.max_size
            || input_done
            || oldest.since.elapsed() >= self.policy.max_delay
            || complete(oldest.cap.time())
            || self.credit.as_ref().is_some_and(|c| !c.more_coming())
    }

    /// How long until the oldest waiting row is due, if any wait.
    fn next_deadline(&self) -> Option<std::time::Duration> {
        let oldest = self.waiting.front()?;
        Some(self.policy.max_delay.saturating_sub(oldest.since.elapsed()))
    }

    /// Takes the next group of waiting batches off the queue (late rows counted, and dropped
    /// if so configured), each stamped with its wait: their capabilities and batches, and the
    /// rows taken.
    fn next_group(&mut self) -> (Vec<Capability<Epoch>>, Vec<Batch>, usize) {
        let mut group = take_rows(&mut self.waiting, self.max_size, !self.preserves_rows);
        let rows: usize = group.iter().map(|w| w.batch.num_rows()).sum();
        self.waiting_rows -= rows;
        self.drop_late(&mut group);
        let now = Instant::now();
        let (caps, batches) = group
            .into_iter()
            .map(|mut w| {
                let waited = now.saturating_duration_since(w.since).as_nanos() as u64;
                w.batch.trace.batching_ns = w.batch.trace.batching_ns.saturating_add(waited);
                (w.cap, w.batch)
            })
            .unzip();
        (caps, batches, rows)
    }

    /// Counts the group's late rows (older than `late_after`) and drops them if so configured.
    fn drop_late(&self, group: &mut Vec<Waiting>) {
        let Some(budget) = self.policy.late_after else {
            return;
        };
        let now = now_ns();
        let late = |w: &Waiting| now.saturating_sub(w.batch.ingest_ns) > budget.as_nanos() as u64;
        let rows = group.iter().filter(|w| late(w)).map(|w| w.batch.num_rows());
        self.metrics.record_late(rows.sum());
        if self.policy.drop_late {
            group.retain(|w| !late(w));
        }
    }
}

/// Removes whole batches from the front of the queue, up to `max_rows` rows (or one batch when
/// it alone is larger). Batches are never split: their rows may belong together downstream
/// (e.g. the candidates of one request), and each comes out again as one batch. A stage that
/// may change rows gets one epoch's batches only: its results cannot be split back, and rows
/// given to another epoch would be written twice, or never, after a restart.
fn take_rows(waiting: &mut VecDeque<Waiting>, max_rows: usize, one_epoch: bool) -> Vec<Waiting> {
    let mut group: Vec<Waiting> = Vec::new();
    let mut rows = 0;
    while let Some(front) = waiting.front() {
        let n = front.batch.num_rows();
        if rows > 0 && rows + n > max_rows {
            break;
        }
        if one_epoch
            && group
                .first()
                .is_some_and(|g| g.cap.time() != front.cap.time())
        {
            break;
        }
        rows += n;
        group.extend(waiting.pop_front());
        if rows >= max_rows {
            break;
        }
    }
    group
}

/// Runs `batch` through `stage` in slices of at most `max_rows`, and joins the results, so a
/// model never sees more than its batch size.
fn run_sliced(
    stage: &mut dyn Stage,
    metrics: &StageMetrics,
    batch: &Batch,
    max_rows: usize,
) -> Vec<Batch> {
    let rows = batch.num_rows();
    if rows <= max_rows || !stage.preserves_rows() {
        return run_stage_untraced(stage, metrics, batch);
    }
    let mut records = Vec::new();
    let mut others = Vec::new();
    for start in (0..rows).step_by(max_rows) {
        let slice = batch.with_data(batch.data.slice(start, max_rows.min(rows - start)));
        for out in run_stage_untraced(stage, metrics, &slice) {
            if out.kind == BatchKind::Records {
                records.push(out);
            } else {
                others.push(out);
            }
        }
    }
    let joined = records.first().and_then(|first| {
        concat_batches(&first.data.schema(), records.iter().map(|b| &b.data))
            .ok()
            .map(|data| batch.with_data(data))
    });
    match joined {
        Some(b) => std::iter::once(b).chain(others).collect(),
        None => records.into_iter().chain(others).collect(),
    }
}

/// Runs one merged batch and hands each input batch its own rows of the result: each output
/// with the index of its input batch, or none for a result that cannot be split back (it goes
/// with the group's earliest epoch).
fn run_batches(
    stage: &mut dyn Stage,
    metrics: &StageMetrics,
    group: &[Batch],
    max_rows: usize,
) -> Vec<(Option<usize>, Batch)> {
    let Some(first) = group.first() else {
        return Vec::new();
    };
    let merged = if group.len() == 1 {
        first.clone()
    } else {
        let schema = first.data.schema();
        match concat_batches(&schema, group.iter().map(|b| &b.data)) {
            Ok(data) => {
                let ingest = group.iter().map(|b| b.ingest_ns).min();
                let mut merged = Batch::records(data, ingest.unwrap_or(first.ingest_ns));
                merged.trace = first.trace;
                merged
            }
            // Batches of one stream share a schema; if they do not, run them one by one.
            Err(_) => {
                return group
                    .iter()
                    .enumerate()
                    .flat_map(|(i, b)| {
                        run_sliced(stage, metrics, b, max_rows)
                            .into_iter()
                            .map(move |out| (Some(i), out))
                    })
                    .collect();
            }
        }
    };
    let rows_in = merged.num_rows();
    let mut out = Vec::new();
    for result in run_sliced(stage, metrics, &merged, max_rows) {
        if result.kind == BatchKind::Records
            && result.num_rows() == rows_in
            && stage.preserves_rows()
        {
            let mut offset = 0;
            for (i, b) in group.iter().enumerate() {
                let n = b.num_rows();
                out.push((Some(i), b.with_data(result.data.slice(offset, n))));
                offset += n;
            }
        } else {
            out.push((None, result));
        }
    }
    out
}

/// Gives each output of [`run_batches`] its capability: its own batch's, or the group's
/// earliest.
fn with_caps(
    caps: &[Capability<Epoch>],
    out: Vec<(Option<usize>, Batch)>,
) -> Vec<(Capability<Epoch>, Batch)> {
    let earliest = caps.iter().min_by_key(|c| *c.time());
    out.into_iter()
        .filter_map(|(i, b)| {
            let cap = i.and_then(|i| caps.get(i)).or(earliest)?;
            Some((cap.clone(), b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::registry::Metrics;
    use crate::stage::StageOutput;
    use crate::DataflowResult;
    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::SchemaRef;
    use std::sync::Mutex;
    use timely::dataflow::operators::{Input, Inspect, Probe};

    /// Passes rows through, noting the thread it ran on.
    struct Same(Arc<Mutex<Option<String>>>);
    impl Stage for Same {
        fn name(&self) -> &str {
            "same"
        }
        fn preserves_rows(&self) -> bool {
            true
        }
        fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
            Ok(input.clone())
        }
        fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
            *self.0.lock().unwrap() = std::thread::current().name().map(str::to_string);
            Ok(StageOutput::all(batch.clone()))
        }
    }

    fn rows(n: i64) -> Batch {
        let column = Arc::new(Int64Array::from_iter_values(0..n)) as _;
        Batch::records(RecordBatch::try_from_iter([("x", column)]).unwrap(), 0)
    }

    /// Steps until `done` holds (at most 5 s) and says whether it did.
    fn step_until(worker: &mut timely::worker::Worker, done: impl Fn() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while !done() && Instant::now() < until {
            worker.step_or_park(Some(Duration::from_millis(1)));
        }
        done()
    }

    #[test]
    fn a_fed_model_waits_only_while_more_rows_are_coming_and_runs_off_the_worker() {
        let out = Arc::new(Mutex::new(Vec::<(usize, u64)>::new()));
        let seen = out.clone();
        let ran_on = Arc::new(Mutex::new(None));
        let stage_thread = ran_on.clone();
        timely::execute_directly(move |worker| {
            let credit = Credit::new(4);
            let metrics = Metrics::new().unwrap().stage("same").unwrap();
            // An hour's delay: only the credit's word can make a partial batch run.
            let policy = BatchPolicy {
                max_size: 4,
                max_delay: Duration::from_secs(3600),
                late_after: None,
                drop_late: false,
            };
            let fed = credit.clone();
            let inspected = seen.clone();
            let (mut input, probe) = worker.dataflow::<Epoch, _, _>(move |scope| {
                let (input, stream) = scope.new_input::<Vec<Batch>>();
                let probe = stream
                    .dynamic_batch_fed(Box::new(Same(stage_thread)), policy, metrics, fed)
                    .inspect(move |b: &Batch| {
                        let rows = (b.num_rows(), b.trace.stages_ns);
                        inspected.lock().unwrap().push(rows);
                    })
                    .probe()
                    .0;
                (input, probe)
            });
            let count = |out: &Arc<Mutex<Vec<(usize, u64)>>>| out.lock().unwrap().len();
            credit.set_more_coming(true);
            credit.sent(2);
            input.send(rows(2));
            input.flush();
            assert!(
                !step_until(worker, || count(&seen) > 0),
                "ran a partial batch early"
            );
            assert_eq!(credit.in_flight(), 2);
            // The source has nothing more: the two rows run now, and give their credit back.
            credit.set_more_coming(false);
            assert!(step_until(worker, || count(&seen) > 0), "never ran");
            assert_eq!(credit.in_flight(), 0);
            input.advance_to(1);
            drop(input);
            assert!(step_until(worker, || probe.done()));
        });
        assert_eq!(ran_on.lock().unwrap().as_deref(), Some("riffle-same"));
        let out = out.lock().unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 2);
        assert!(out[0].1 > 0, "the model's time is in the trace");
    }

    /// Panics on every batch: a model whose thread dies.
    struct Panics;
    impl Stage for Panics {
        fn name(&self) -> &str {
            "panics"
        }
        fn preserves_rows(&self) -> bool {
            true
        }
        fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
            Ok(input.clone())
        }
        fn process_batch(&mut self, _: &RecordBatch) -> DataflowResult<StageOutput> {
            panic!("a bug in the stage");
        }
    }

    #[test]
    fn a_fed_model_whose_thread_panics_sends_its_rows_to_the_dead_letters_and_frees_the_credit() {
        let out = Arc::new(Mutex::new(Vec::<(BatchKind, usize)>::new()));
        let seen = out.clone();
        timely::execute_directly(move |worker| {
            let credit = Credit::new(4);
            let metrics = Metrics::new().unwrap().stage("panics").unwrap();
            let policy = BatchPolicy {
                max_size: 4,
                max_delay: Duration::from_millis(1),
                late_after: None,
                drop_late: false,
            };
            let fed = credit.clone();
            let inspected = seen.clone();
            let (mut input, probe) = worker.dataflow::<Epoch, _, _>(move |scope| {
                let (input, stream) = scope.new_input::<Vec<Batch>>();
                let probe = stream
                    .dynamic_batch_fed(Box::new(Panics), policy, metrics, fed)
                    .inspect(move |b: &Batch| {
                        inspected.lock().unwrap().push((b.kind, b.num_rows()))
                    })
                    .probe()
                    .0;
                (input, probe)
            });
            credit.sent(3);
            input.send(rows(3));
            input.advance_to(1);
            drop(input);
            assert!(
                step_until(worker, || probe.done()),
                "the run hung on a dead model thread"
            );
            assert_eq!(credit.in_flight(), 0, "the rows' credit came back");
        });
        let out = out.lock().unwrap();
        assert_eq!(
            out.as_slice(),
            &[(BatchKind::DeadLetters, 3)],
            "every row, once, as a dead letter"
        );
    }
}
