//! In-memory test doubles for the runtime: a numbered, resumable source; a collecting sink; a
//! stage that tags rows with the worker running it; a stateful per-key counter.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Capability, Operator};

use crate::observe::registry::StageMetrics;
use crate::operators::{worker_for, BatchStream, ExchangeByKey, StateUpdates};
use crate::runtime::checkpointing::Offsets;
use crate::runtime::StatefulStep;
use crate::sink::SinkFactory;
use crate::state::{encode, SavedState, StateRecord};
use crate::{
    Batch, BatchKind, DataflowResult, Epoch, Sink, Source, SourceBatch, SourceFactory,
    SourcePosition, Stage, StageOutput,
};

/// Distinct keys of the numbered rows (`k0`..`k4`).
pub const KEYS: i64 = 5;

/// `partitions` partitions, each with offsets `0..end`; row `(p, o)` has id `o * partitions + p`
/// and key `k{id % KEYS}`. Resumable: `resume` records the offsets it was given and starts
/// every partition there.
#[derive(Clone)]
pub struct Numbers {
    pub partitions: i32,
    pub end: i64,
    pub batch_rows: i64,
    /// Next offset per partition (absent: 0).
    pub start: Offsets,
    /// Every `resume` call's offsets, shared by the resumed copies.
    pub resumed: Arc<Mutex<Vec<Offsets>>>,
    /// A live source: each batch comes this long after the last, on the wall clock.
    pub pace: Option<std::time::Duration>,
}

impl Numbers {
    pub fn new(partitions: i32, end: i64) -> Self {
        Numbers {
            partitions,
            end,
            batch_rows: 3,
            start: Offsets::new(),
            resumed: Arc::default(),
            pace: None,
        }
    }

    /// Ids of every row of partitions `0..partitions`, offsets `from..to`.
    pub fn ids(partitions: i32, from: i64, to: i64) -> Vec<i64> {
        let mut ids: Vec<i64> = (from..to)
            .flat_map(|o| (0..partitions).map(move |p| o * partitions as i64 + p as i64))
            .collect();
        ids.sort_unstable();
        ids
    }
}

pub fn key_of(id: i64) -> String {
    format!("k{}", id % KEYS)
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("id", DataType::Int64, false),
        Field::new("key", DataType::Utf8, false),
    ]))
}

impl SourceFactory for Numbers {
    fn schema(&self) -> DataflowResult<SchemaRef> {
        Ok(schema())
    }

    fn partition(&self, index: usize, peers: usize) -> DataflowResult<Box<dyn Source>> {
        let parts = (0..self.partitions)
            .filter(|p| *p as usize % peers == index)
            .map(|p| (p, self.start.get(&p).copied().unwrap_or(0)))
            .collect();
        Ok(Box::new(NumbersPart {
            parts,
            partitions: self.partitions,
            end: self.end,
            batch_rows: self.batch_rows,
            pace: self.pace,
        }))
    }

    fn checkpoint_id(&self) -> Option<String> {
        Some("numbers".into())
    }

    fn resume(&self, offsets: &Offsets) -> DataflowResult<Option<Arc<dyn SourceFactory>>> {
        self.resumed.lock().unwrap().push(offsets.clone());
        Ok(Some(Arc::new(Numbers {
            start: offsets.clone(),
            ..self.clone()
        })))
    }
}

/// One worker's partitions, read a batch at a time, round-robin.
struct NumbersPart {
    /// Partition and next offset.
    parts: VecDeque<(i32, i64)>,
    partitions: i32,
    end: i64,
    batch_rows: i64,
    pace: Option<std::time::Duration>,
}

impl Source for NumbersPart {
    fn clocked(&self) -> bool {
        self.pace.is_some()
    }

    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        if let Some(pace) = self.pace {
            std::thread::sleep(pace);
        }
        let Some((p, from)) = self.parts.pop_front().filter(|(_, next)| *next < self.end) else {
            return Ok(None);
        };
        let to = (from + self.batch_rows).min(self.end);
        if to < self.end {
            self.parts.push_back((p, to));
        }
        let offsets: Vec<i64> = (from..to).collect();
        let ids: Vec<i64> = offsets
            .iter()
            .map(|o| o * self.partitions as i64 + p as i64)
            .collect();
        let records = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int32Array::from(vec![p; offsets.len()])),
                Arc::new(Int64Array::from(offsets)),
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| key_of(*i)),
                )),
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

/// Collects every batch written, across opens (one per run).
#[derive(Clone, Default)]
pub struct Collect(pub Arc<Mutex<Vec<RecordBatch>>>);

impl Collect {
    pub fn batches(&self) -> Vec<RecordBatch> {
        self.0.lock().unwrap().clone()
    }

    pub fn rows(&self) -> usize {
        self.batches().iter().map(RecordBatch::num_rows).sum()
    }

    /// The values of integer column `name`, in arrival order.
    pub fn ints(&self, name: &str) -> Vec<i64> {
        self.batches()
            .iter()
            .flat_map(|b| {
                let column = b.column_by_name(name).expect("column in sink");
                column.as_primitive::<Int64Type>().values().to_vec()
            })
            .collect()
    }

    /// The values of string column `name`, in arrival order.
    pub fn strings(&self, name: &str) -> Vec<String> {
        self.batches()
            .iter()
            .flat_map(|b| {
                let column = b.column_by_name(name).expect("column in sink");
                let strings = column.as_string::<i32>();
                strings
                    .iter()
                    .map(|s| s.unwrap_or_default().to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

impl SinkFactory for Collect {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(self.clone()))
    }
}

impl Sink for Collect {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        self.0.lock().unwrap().push(batch.clone());
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}

/// A sink that notes the epochs it is told to begin (with checkpoints on, each one written).
#[derive(Clone, Default)]
pub struct EpochLog(pub Arc<Mutex<Vec<Epoch>>>);

impl SinkFactory for EpochLog {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(self.clone()))
    }
}

impl Sink for EpochLog {
    fn write_batch(&mut self, _: &RecordBatch) -> DataflowResult<()> {
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }

    fn begin_epoch(&mut self, _generation: u64, epoch: Epoch) {
        self.0.lock().unwrap().push(epoch);
    }
}

/// A sink whose every write fails.
pub struct Failing;

impl SinkFactory for Failing {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(Failing))
    }
}

impl Sink for Failing {
    fn write_batch(&mut self, _: &RecordBatch) -> DataflowResult<()> {
        Err(crate::DataflowError::Config("disk full".into()))
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}

/// A sink that takes every write, then fails when the input ends (`finish`), `after` the call
/// began: as a topic sink whose deliveries all failed. By then the workers that do not hold
/// the sink have finished their part of the run.
pub struct FailsAtTheEnd {
    pub after: std::time::Duration,
}

impl SinkFactory for FailsAtTheEnd {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(FailsAtTheEnd { after: self.after }))
    }
}

impl Sink for FailsAtTheEnd {
    fn write_batch(&mut self, _: &RecordBatch) -> DataflowResult<()> {
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }

    fn finish(&mut self) -> DataflowResult<()> {
        std::thread::sleep(self.after);
        Err(crate::DataflowError::stage(
            "sink",
            "300 message(s) not delivered",
        ))
    }
}

/// Passes batches on; worker `worker`'s first call sleeps `pause` first (a long model run,
/// a slow flush).
pub struct PauseOnce {
    pub worker: usize,
    pub me: usize,
    pub pause: std::time::Duration,
    pub paused: bool,
}

impl Stage for PauseOnce {
    fn name(&self) -> &str {
        "pause"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Ok(input.clone())
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        if self.me == self.worker && !self.paused {
            self.paused = true;
            std::thread::sleep(self.pause);
        }
        Ok(StageOutput::all(batch.clone()))
    }
}

/// `batch` with one more column.
fn with_column(batch: &RecordBatch, name: &str, values: ArrayRef) -> DataflowResult<RecordBatch> {
    let mut fields: Vec<_> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        name,
        values.data_type().clone(),
        false,
    )));
    let mut columns = batch.columns().to_vec();
    columns.push(values);
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Adds column `column` holding the index of the worker that ran it.
pub struct Tag {
    pub column: &'static str,
    pub worker: usize,
}

impl Stage for Tag {
    fn name(&self) -> &str {
        "tag"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let mut fields: Vec<_> = input.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(self.column, DataType::Int64, false)));
        Ok(Arc::new(Schema::new(fields)))
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let tags = Int64Array::from(vec![self.worker as i64; batch.num_rows()]);
        Ok(StageOutput::all(with_column(
            batch,
            self.column,
            Arc::new(tags),
        )?))
    }
}

/// Counts rows per `key` (after an exchange by key) and adds each row's running count as
/// column `count`. Its state is one record `key,count` per key: a row moves its key from
/// `key,n` (-1) to `key,n+1` (+1). Epochs are processed in order once complete, so the state
/// changes of epoch `e` are exactly those of its rows. On resume a worker keeps the records of
/// the keys it owns and re-announces them (+1 before `first_epoch`), so the run's own
/// checkpoints hold the whole state.
pub struct CountPerKey;

/// What the counting operator emits, split into rows and state afterwards.
#[derive(Clone)]
enum Out {
    Rows(Batch),
    State(String, isize),
}

/// One key's count, as [`CountPerKey`] checkpoints it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyCount {
    pub key: String,
    pub count: i64,
}

impl StateRecord for KeyCount {
    const KIND: &'static str = "count_per_key";

    /// Format 1: `key,count`.
    fn from_v1(text: &str) -> Option<Self> {
        let (key, count) = text.split_once(',')?;
        Some(KeyCount {
            key: key.to_string(),
            count: count.parse().ok()?,
        })
    }
}

/// A key's count as its state record's text.
fn record(key: &str, count: i64) -> String {
    let key = key.to_string();
    encode(&KeyCount { key, count }).expect("a record")
}

impl StatefulStep for CountPerKey {
    fn state_kind(&self) -> &'static str {
        KeyCount::KIND
    }

    fn attach<'scope>(
        self: Box<Self>,
        stream: BatchStream<'scope>,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>) {
        let (index, peers) = (stream.scope().index(), stream.scope().peers());
        let owned: Vec<(String, i64)> = state
            .records::<KeyCount>("count")
            .into_iter()
            .filter_map(|(record, multiplicity)| {
                assert_eq!(multiplicity, 1, "one record per key: {record:?}");
                let keys = StringArray::from(vec![record.key.as_str()]);
                let mine = worker_for(&keys, 0, peers).expect("a key") == index;
                mine.then_some((record.key, record.count))
            })
            .collect();
        let out = stream
            .exchange_by_key("key")
            .unary_frontier::<CapacityContainerBuilder<Vec<Out>>, _, _, _>(
                Pipeline,
                "CountPerKey",
                move |initial, _| {
                    let mut restore = Some((initial, owned));
                    let mut counts: HashMap<String, i64> = HashMap::new();
                    let mut waiting: BTreeMap<Epoch, Vec<(Capability<Epoch>, Batch)>> =
                        BTreeMap::new();
                    move |(input, frontier), output| {
                        if let Some((initial, owned)) = restore.take() {
                            let at = initial.delayed(&first_epoch.saturating_sub(1));
                            let mut session = output.session(&at);
                            for (key, count) in owned {
                                session.give(Out::State(record(&key, count), 1));
                                counts.insert(key, count);
                            }
                        }
                        input.for_each(|cap, data| {
                            for batch in data.drain(..) {
                                if batch.kind == BatchKind::DeadLetters {
                                    output.session(&cap).give(Out::Rows(batch));
                                } else if let Some(held) = cap.retain_least(0) {
                                    waiting.entry(*held.time()).or_default().push((held, batch));
                                }
                            }
                        });
                        while let Some(entry) = waiting.first_entry() {
                            if frontier.less_equal(entry.key()) {
                                break;
                            }
                            for (cap, batch) in entry.remove() {
                                let started = std::time::Instant::now();
                                let mut session = output.session(&cap);
                                let keys = batch.data.column_by_name("key").expect("key column");
                                let mut running = Vec::with_capacity(batch.num_rows());
                                for key in keys.as_string::<i32>().iter().flatten() {
                                    let count = counts.entry(key.to_string()).or_default();
                                    if *count > 0 {
                                        session.give(Out::State(record(key, *count), -1));
                                    }
                                    *count += 1;
                                    session.give(Out::State(record(key, *count), 1));
                                    running.push(*count);
                                }
                                let counted = with_column(
                                    &batch.data,
                                    "count",
                                    Arc::new(Int64Array::from(running)),
                                )
                                .expect("a count column");
                                let rows = batch.num_rows();
                                metrics.record_batch(rows, rows, 0, started.elapsed());
                                session.give(Out::Rows(batch.with_data(counted)));
                            }
                        }
                    }
                },
            );
        let rows = out.clone().flat_map(|o| match o {
            Out::Rows(batch) => Some(batch),
            Out::State(..) => None,
        });
        let state = out.flat_map(|o| match o {
            Out::State(record, diff) => Some((record, diff)),
            Out::Rows(_) => None,
        });
        (rows, state)
    }
}

/// A transactional destination, as a broker's: rows go into an open transaction; a commit makes
/// them final and records its checkpoint's epoch; `recover` (a restart) aborts whatever was
/// open and answers with the last commit. Each commit checks the two-phase invariant: the
/// rows committed so far are exactly those the checkpoint of its epoch covers.
#[derive(Clone)]
pub struct Transactional {
    pub log: Arc<Mutex<TxnLog>>,
    /// The checkpoint directory, to check each commit against its checkpoint.
    pub dir: std::path::PathBuf,
    pub partitions: i32,
    /// The commit (counted from 1 across runs) that fails, as a crash would.
    pub fail_commit: Option<usize>,
}

#[derive(Default)]
pub struct TxnLog {
    open: Vec<RecordBatch>,
    held: Vec<RecordBatch>,
    committed: Vec<RecordBatch>,
    commits: Vec<(u64, Epoch)>,
    tried: usize,
    sealed: Option<Epoch>,
    epoch: Option<Epoch>,
    pub violations: Vec<String>,
}

impl TxnLog {
    fn ids(batches: &[RecordBatch]) -> Vec<i64> {
        let mut ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let column = b.column_by_name("id").expect("id column");
                column.as_primitive::<Int64Type>().values().to_vec()
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    pub fn committed_ids(&self) -> Vec<i64> {
        Self::ids(&self.committed)
    }

    pub fn commits(&self) -> usize {
        self.commits.len()
    }

    /// A seal ends: what it held goes into the next transaction (the sink may have finished).
    fn end_seal(&mut self) {
        self.sealed = None;
        let held = std::mem::take(&mut self.held);
        self.open.extend(held);
    }
}

impl Transactional {
    fn lock(&self) -> std::sync::MutexGuard<'_, TxnLog> {
        self.log.lock().unwrap()
    }
}

impl SinkFactory for Transactional {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(self.clone()))
    }

    fn committer(&self) -> DataflowResult<Option<Box<dyn crate::Committer>>> {
        Ok(Some(Box::new(self.clone())))
    }

    fn recover(&self, _leader: bool) -> DataflowResult<crate::Recovery> {
        let mut log = self.lock();
        log.open.clear();
        log.held.clear();
        log.sealed = None;
        Ok(crate::Recovery::Committed(log.commits.last().copied()))
    }
}

impl Sink for Transactional {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let mut log = self.lock();
        match (log.sealed, log.epoch) {
            (Some(cut), Some(epoch)) if epoch > cut => log.held.push(batch.clone()),
            _ => log.open.push(batch.clone()),
        }
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }

    fn position(&self) -> Option<u64> {
        let log = self.lock();
        Some((log.open.len() + log.held.len() + log.committed.len()) as u64)
    }

    fn begin_epoch(&mut self, _generation: u64, epoch: Epoch) {
        self.lock().epoch = Some(epoch);
    }
}

impl crate::Committer for Transactional {
    fn commit(&mut self, generation: u64, through: Epoch) -> DataflowResult<()> {
        let mut log = self.lock();
        log.tried += 1;
        if Some(log.tried) == self.fail_commit {
            return Err(crate::DataflowError::stage(
                "sink",
                "commit failed (a crash)",
            ));
        }
        // The end of the input seals everything (`Epoch::MAX`).
        if log.sealed != Some(through) && log.sealed != Some(Epoch::MAX) {
            let sealed = log.sealed;
            log.violations
                .push(format!("commit of {through} while sealed at {sealed:?}"));
        }
        let open = std::mem::take(&mut log.open);
        log.committed.extend(open);
        let checkpoint = crate::checkpoint::CheckpointStore::open(&self.dir, 3)
            .and_then(|s| s.at(through))?
            .ok_or_else(|| crate::DataflowError::Config(format!("no checkpoint {through}")))?;
        let covered: Vec<i64> = {
            let offsets = checkpoint
                .sources
                .get("numbers")
                .cloned()
                .unwrap_or_default();
            let partitions = self.partitions as i64;
            let mut ids: Vec<i64> = offsets
                .iter()
                .flat_map(|(p, next)| (0..*next).map(move |o| o * partitions + *p as i64))
                .collect();
            ids.sort_unstable();
            ids
        };
        let committed = log.committed_ids();
        if committed != covered {
            log.violations.push(format!(
                "commit of {through}: {} rows committed, the checkpoint covers {}",
                committed.len(),
                covered.len()
            ));
        }
        log.commits.push((generation, through));
        log.end_seal();
        Ok(())
    }

    fn fence(&mut self, _generation: u64) -> DataflowResult<()> {
        Ok(())
    }

    fn transactional(&self) -> bool {
        true
    }

    fn seal(&mut self, through: Epoch) -> bool {
        self.lock().sealed = Some(through);
        true
    }

    fn sealed(&self) -> Option<Epoch> {
        self.lock().sealed
    }

    fn release(&mut self) -> DataflowResult<()> {
        self.lock().end_seal();
        Ok(())
    }
}

/// A sink whose recovery finishes only once a stage has been built in the same run (or
/// fails after `patience`): recovery and model loading must overlap.
#[derive(Clone)]
pub struct RecoversWhileStagesLoad {
    pub results: Collect,
    pub built: Arc<(Mutex<bool>, std::sync::Condvar)>,
    pub patience: std::time::Duration,
}

impl SinkFactory for RecoversWhileStagesLoad {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        self.results.open()
    }

    fn recover(&self, _leader: bool) -> DataflowResult<crate::sink::Recovery> {
        let (lock, signal) = &*self.built;
        let built = lock.lock().unwrap();
        let (built, _) = signal
            .wait_timeout_while(built, self.patience, |built| !*built)
            .unwrap();
        if *built {
            Ok(crate::sink::Recovery::Latest)
        } else {
            Err(crate::DataflowError::stage(
                "sink",
                "recovery waited for the stages, which were not being built",
            ))
        }
    }
}

impl RecoversWhileStagesLoad {
    /// Marks a stage built (its build would load a model).
    pub fn stage_built(&self) {
        let (lock, signal) = &*self.built;
        *lock.lock().unwrap() = true;
        signal.notify_all();
    }
}
