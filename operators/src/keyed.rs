//! State per key (a tracker per camera, line counters per camera) for stateful stages, with
//! checkpoints: the one operator every such stage runs on.
//!
//! Rows go to the worker owning their key (the same routing as `exchange: { key }`), wait
//! until their epoch is complete, and are handed to the stage's [`KeyedLogic`] one key at a
//! time, in the order they arrived (a key's rows arrive in order when its source keeps them
//! in order, as `partition_by: camera` does). After each epoch, every key whose state changed
//! reports it as one record, `(old, -1)` and `(new, +1)`, which the runtime folds into its
//! checkpoints. On resume each worker takes back the records of the keys it owns, whatever the
//! worker count was before, and announces them again so that later checkpoints keep them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use riffle_dataflow::dead_letter::{self, DeadLetter};
use riffle_dataflow::metrics::StageMetrics;
use riffle_dataflow::operators::{take_rows, worker_for, BatchStream, ExchangeByKey, StateUpdates};
use riffle_dataflow::runtime::StatefulStep;
use riffle_dataflow::{Batch, BatchKind, DataflowError, DataflowResult, Epoch, StageOutput};
use serde::de::DeserializeOwned;
use serde::Serialize;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Capability, Operator};

/// What a stateful stage does with one key's rows.
pub trait KeyedLogic: Send + 'static {
    /// One key's state, checkpointed as JSON.
    type State: Serialize + DeserializeOwned + Default + Clone + Send;

    /// The stage's name, for metrics and dead letters.
    fn name(&self) -> &str;

    /// Processes rows of one key (`key` as text: integers in decimal), in order, updating its
    /// state. An `Err` sends the rows to the dead-letter sink and leaves the state as it was.
    fn process(
        &mut self,
        key: &str,
        state: &mut Self::State,
        rows: &RecordBatch,
    ) -> DataflowResult<StageOutput>;
}

/// A [`KeyedLogic`] keyed by a column (a string or Int64 column), as the runtime runs it.
pub struct Keyed<L> {
    pub logic: L,
    pub key: String,
}

/// Rows and state changes leave the operator on one stream and are split after it.
#[derive(Clone)]
enum Out {
    Rows(Batch),
    State(String, isize),
}

impl<L: KeyedLogic> StatefulStep for Keyed<L> {
    fn attach<'scope>(
        self: Box<Self>,
        stream: BatchStream<'scope>,
        metrics: Arc<StageMetrics>,
        state: &[(String, isize)],
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>) {
        let (index, peers) = (stream.scope().index(), stream.scope().peers());
        let Keyed { mut logic, key } = *self;
        let restored = restore::<L::State>(logic.name(), state, index, peers);
        let name = logic.name().to_string();
        let out = stream
            .exchange_by_key(&key)
            .unary_frontier::<CapacityContainerBuilder<Vec<Out>>, _, _, _>(
                Pipeline,
                &name,
                move |initial, _| {
                    let mut restore = Some((initial, restored));
                    let mut states: HashMap<String, Keep<L::State>> = HashMap::new();
                    let mut waiting: BTreeMap<Epoch, Vec<(Capability<Epoch>, Batch)>> =
                        BTreeMap::new();
                    move |(input, frontier), output| {
                        if let Some((initial, restored)) = restore.take() {
                            // At the checkpoint's own epoch, so the next checkpoint keeps them.
                            let at = initial.delayed(&first_epoch.saturating_sub(1));
                            let mut session = output.session(&at);
                            for (k, (record, state)) in restored {
                                session.give(Out::State(record.clone(), 1));
                                states.insert(
                                    k,
                                    Keep {
                                        state,
                                        announced: Some(record),
                                    },
                                );
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
                            let batches = entry.remove();
                            let Some(cap) = batches.first().map(|(c, _)| c.clone()) else {
                                continue;
                            };
                            let mut session = output.session(&cap);
                            let mut touched = Vec::new();
                            for (_, batch) in &batches {
                                for out in run_keyed(&mut logic, &key, &mut states, &metrics, batch)
                                {
                                    match out {
                                        Ok((k, rows)) => {
                                            touched.push(k);
                                            session.give_iterator(rows.into_iter().map(Out::Rows));
                                        }
                                        Err(letters) => session.give(Out::Rows(letters)),
                                    }
                                }
                            }
                            touched.sort();
                            touched.dedup();
                            for k in touched {
                                if let Some(keep) = states.get_mut(&k) {
                                    for change in keep.changes(&k) {
                                        session.give(change);
                                    }
                                }
                            }
                        }
                    }
                },
            );
        let rows = out.clone().flat_map(|o| match o {
            Out::Rows(batch) => Some(batch),
            Out::State(..) => None,
        });
        let updates = out.flat_map(|o| match o {
            Out::State(record, diff) => Some((record, diff)),
            Out::Rows(_) => None,
        });
        (rows, updates)
    }
}

/// A key's state and the record last reported for it.
struct Keep<S> {
    state: S,
    announced: Option<String>,
}

impl<S: Serialize> Keep<S> {
    /// The state changes to report after an epoch: none if the state is as last reported.
    fn changes(&mut self, key: &str) -> Vec<Out> {
        let record = match serde_json::to_string(&self.state) {
            Ok(json) => format!("{key}\t{json}"),
            Err(e) => {
                tracing::error!("state of `{key}` cannot be checkpointed: {e}");
                return Vec::new();
            }
        };
        if self.announced.as_ref() == Some(&record) {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(2);
        if let Some(old) = self.announced.take() {
            out.push(Out::State(old, -1));
        }
        out.push(Out::State(record.clone(), 1));
        self.announced = Some(record);
        out
    }
}

/// One batch through the logic, key by key: per key its output batches, or a batch of dead
/// letters for a key whose rows failed.
fn run_keyed<L: KeyedLogic>(
    logic: &mut L,
    key_column: &str,
    states: &mut HashMap<String, Keep<L::State>>,
    metrics: &StageMetrics,
    batch: &Batch,
) -> Vec<Result<(String, Vec<Batch>), Batch>> {
    let groups = match group_by_key(&batch.data, key_column) {
        Ok(groups) => groups,
        Err(e) => return vec![Err(letters_for(logic.name(), batch, &batch.data, &e))],
    };
    let mut out = Vec::with_capacity(groups.len());
    for (key, rows) in groups {
        let started = Instant::now();
        let part = match take_rows(&batch.data, rows) {
            Ok(part) => part,
            Err(e) => {
                out.push(Err(letters_for(logic.name(), batch, &batch.data, &e)));
                continue;
            }
        };
        let keep = states.entry(key.clone()).or_insert_with(|| Keep {
            state: L::State::default(),
            announced: None,
        });
        let mut next = keep.state.clone();
        let shown = key.split_once(':').map_or(key.as_str(), |(_, k)| k);
        match logic.process(shown, &mut next, &part) {
            Ok(result) => {
                keep.state = next;
                metrics.record_batch(
                    part.num_rows(),
                    result.records.num_rows(),
                    result.rejected.len(),
                    started.elapsed(),
                );
                let mut batches = Vec::with_capacity(2);
                if result.records.num_rows() > 0 {
                    batches.push(batch.with_data(result.records));
                }
                if !result.rejected.is_empty() {
                    match dead_letter::to_batch(&result.rejected) {
                        Ok(letters) => batches.push(Batch::dead_letters(letters, batch.ingest_ns)),
                        Err(e) => {
                            tracing::error!("{}: cannot build dead letters: {e}", logic.name())
                        }
                    }
                }
                out.push(Ok((key, batches)));
            }
            Err(e) => {
                metrics.record_batch(part.num_rows(), 0, part.num_rows(), started.elapsed());
                out.push(Err(letters_for(logic.name(), batch, &part, &e)));
            }
        }
    }
    out
}

/// Every row of `rows` as a dead letter with `e` as the reason.
fn letters_for(stage: &str, batch: &Batch, rows: &RecordBatch, e: &DataflowError) -> Batch {
    let reason = e.to_string();
    let letters: Vec<DeadLetter> = (0..rows.num_rows())
        .map(|row| DeadLetter::for_row(stage, rows, row, &reason))
        .collect();
    match dead_letter::to_batch(&letters) {
        Ok(data) => Batch::dead_letters(data, batch.ingest_ns),
        Err(e) => {
            tracing::error!("{stage}: cannot build dead letters: {e}");
            Batch::dead_letters(
                RecordBatch::new_empty(dead_letter::schema()),
                batch.ingest_ns,
            )
        }
    }
}

/// Row indices per key, keys in order of first appearance.
fn group_by_key(batch: &RecordBatch, column: &str) -> DataflowResult<Vec<(String, Vec<u32>)>> {
    let keys = batch
        .column_by_name(column)
        .ok_or_else(|| DataflowError::schema(column, "a key column", "no such column"))?;
    let mut order: Vec<(String, Vec<u32>)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for row in 0..keys.len() {
        let key = key_text(keys.as_ref(), row)?;
        let slot = *at.entry(key.clone()).or_insert_with(|| {
            order.push((key, Vec::new()));
            order.len() - 1
        });
        if let Some((_, rows)) = order.get_mut(slot) {
            rows.push(row as u32);
        }
    }
    Ok(order)
}

/// A key as text, tagged with its type so that a restored key routes as the exchange routed
/// it: `s:camera-1`, `i:42`.
fn key_text(keys: &dyn Array, row: usize) -> DataflowResult<String> {
    if keys.is_null(row) {
        return Ok("s:".into());
    }
    match keys.data_type() {
        DataType::Utf8 => Ok(format!("s:{}", keys.as_string::<i32>().value(row))),
        DataType::Int64 => Ok(format!("i:{}", keys.as_primitive::<Int64Type>().value(row))),
        other => Err(DataflowError::schema(
            "key",
            "a Utf8 or Int64 column",
            other.to_string(),
        )),
    }
}

/// The checkpointed keys this worker owns: key → (record, state). A record is `key\tjson`.
fn restore<S: DeserializeOwned>(
    stage: &str,
    state: &[(String, isize)],
    index: usize,
    peers: usize,
) -> Vec<(String, (String, S))> {
    let mut out = Vec::new();
    for (record, count) in state {
        if *count <= 0 {
            continue;
        }
        let Some((key, json)) = record.split_once('\t') else {
            tracing::warn!("{stage}: ignoring checkpointed record without a key");
            continue;
        };
        if owner(key, peers) != index {
            continue;
        }
        match serde_json::from_str::<S>(json) {
            Ok(state) => out.push((key.to_string(), (record.clone(), state))),
            Err(e) => {
                tracing::warn!("{stage}: ignoring unreadable checkpointed state of `{key}`: {e}")
            }
        }
    }
    out
}

/// The worker owning a tagged key, as the exchange routes it.
fn owner(key: &str, peers: usize) -> usize {
    let keys: Arc<dyn Array> = match key.split_once(':') {
        Some(("i", n)) => match n.parse::<i64>() {
            Ok(n) => Arc::new(Int64Array::from(vec![n])),
            Err(_) => return 0,
        },
        Some((_, text)) => Arc::new(StringArray::from(vec![text])),
        None => Arc::new(StringArray::from(vec![key])),
    };
    worker_for(keys.as_ref(), 0, peers).unwrap_or(0)
}
