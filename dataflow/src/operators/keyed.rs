//! State per key (a tracker per camera, line counters per camera) for stateful stages, with
//! checkpoints: the one operator every such stage runs on.
//!
//! Rows go to the worker owning their key (the same routing as `exchange: { key }`), wait
//! until their epoch is complete, and are handed to the stage's [`KeyedLogic`] one key at a
//! time, in the order they arrived (a key's rows arrive in order when its source keeps them
//! in order, as `partition_by: camera` does). After each epoch, every key whose state changed
//! reports it as one [`KeyedRecord`], `(old, -1)` and `(new, +1)`, which the runtime folds into
//! its checkpoints. On resume each worker takes back the records of the keys it owns, whatever
//! the worker count was before, and announces them again so that later checkpoints keep them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Capability, Operator};

use super::{take_rows, worker_for, BatchStream, ExchangeByKey, StateUpdates};
use crate::dead_letter::{self, DeadLetter};
use crate::observe::registry::StageMetrics;
use crate::state::{SavedState, StateRecord};
use crate::{Batch, BatchKind, DataflowError, DataflowResult, Epoch, StageOutput};

/// What a stateful stage does with one key's rows.
pub trait KeyedLogic: Send + 'static {
    /// One key's state, checkpointed (as JSON) in a [`KeyedRecord`].
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

    /// `key` is finished with (its camera was removed): its state is dropped after this call,
    /// which may give the rows that close it (last events). Default: none.
    fn retire(&mut self, _key: &str, _state: Self::State) -> DataflowResult<Option<RecordBatch>> {
        Ok(None)
    }
}

/// A [`KeyedLogic`] keyed by a column (a string or Int64 column): the stateful step the runtime
/// runs ([`StatefulStep`](crate::runtime::StatefulStep)) with [`KeyedState::keyed`].
pub struct Keyed<L> {
    pub logic: L,
    pub key: String,
}

/// A key of keyed state, typed as its column is, so that a restored key routes as the
/// exchange routed it. A null key is the empty text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKey {
    /// A key of a Utf8 column: `{"text": "cam-1"}`.
    Text(String),
    /// A key of an Int64 column: `{"int": 42}`.
    Int(i64),
}

impl StateKey {
    /// The key as the logic sees it: integers in decimal.
    fn shown(&self) -> String {
        match self {
            StateKey::Text(t) => t.clone(),
            StateKey::Int(n) => n.to_string(),
        }
    }

    /// The worker owning the key, as the exchange routes it.
    fn owner(&self, peers: usize) -> usize {
        let keys: Arc<dyn Array> = match self {
            StateKey::Int(n) => Arc::new(Int64Array::from(vec![*n])),
            StateKey::Text(t) => Arc::new(StringArray::from(vec![t.as_str()])),
        };
        worker_for(keys.as_ref(), 0, peers).unwrap_or(0)
    }
}

/// One key's state in a checkpoint: `{"key":{"text":"cam-1"},"state":{…}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyedRecord<S> {
    pub key: StateKey,
    pub state: S,
}

/// [`KeyedRecord`] borrowed, serialised to the same text.
#[derive(Serialize)]
struct KeyedRecordRef<'a, S> {
    key: &'a StateKey,
    state: &'a S,
}

impl<S: Serialize + DeserializeOwned> StateRecord for KeyedRecord<S> {
    const KIND: &'static str = "keyed";

    /// Format 1: `s:cam-1\t{json}` or `i:42\t{json}`.
    fn from_v1(text: &str) -> Option<Self> {
        let (key, json) = text.split_once('\t')?;
        let key = match key.split_once(':') {
            Some(("i", n)) => StateKey::Int(n.parse().ok()?),
            Some((_, t)) => StateKey::Text(t.to_string()),
            None => StateKey::Text(key.to_string()),
        };
        Some(KeyedRecord {
            key,
            state: serde_json::from_str(json).ok()?,
        })
    }
}

/// Keyed state on batch streams.
pub trait KeyedState<'scope> {
    /// Runs `logic` per key of column `key`, each key on the worker owning it, epoch by epoch;
    /// restores the keys this worker owns from `restored` (before `first_epoch`). Returns the
    /// output rows and the state's changes, one [`KeyedRecord`] per changed key and epoch.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{RecordBatch, StringArray};
    /// use riffle_dataflow::observe::registry::Metrics;
    /// use riffle_dataflow::operators::{KeyedLogic, KeyedState};
    /// use riffle_dataflow::state::SavedState;
    /// use riffle_dataflow::{Batch, DataflowResult, StageOutput};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// /// Counts each camera's frames.
    /// struct Frames;
    /// impl KeyedLogic for Frames {
    ///     type State = u64;
    ///     fn name(&self) -> &str { "frames" }
    ///     fn process(&mut self, _camera: &str, seen: &mut u64, rows: &RecordBatch)
    ///         -> DataflowResult<StageOutput> {
    ///         *seen += rows.num_rows() as u64;
    ///         Ok(StageOutput::all(rows.clone()))
    ///     }
    /// }
    ///
    /// let metrics = Metrics::new().unwrap().stage("frames").unwrap();
    /// let changes = Arc::new(Mutex::new(Vec::new()));
    /// let sink = changes.clone();
    /// timely::example(move |scope| {
    ///     let frames = RecordBatch::try_from_iter(vec![
    ///         ("camera_id", Arc::new(StringArray::from(vec!["a", "b", "a"])) as _),
    ///     ]).unwrap();
    ///     let stream = vec![Batch::records(frames, 0)].to_stream(scope).container::<Vec<_>>();
    ///     let (_rows, state) = stream.keyed("camera_id", Frames, metrics, &SavedState::default(), 0);
    ///     state.inspect(move |change| sink.lock().unwrap().push(change.clone()));
    /// });
    /// let mut changes = changes.lock().unwrap().clone();
    /// changes.sort();
    /// // Once the epoch is complete, each camera's state is one record.
    /// assert_eq!(changes, vec![
    ///     (r#"{"key":{"text":"a"},"state":2}"#.to_string(), 1),
    ///     (r#"{"key":{"text":"b"},"state":1}"#.to_string(), 1),
    /// ]);
    /// ```
    fn keyed<L: KeyedLogic>(
        self,
        key: &str,
        logic: L,
        metrics: Arc<StageMetrics>,
        restored: &SavedState,
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>);
}

/// Rows and state changes leave the operator on one stream and are split after it.
#[derive(Clone)]
enum Out {
    Rows(Batch),
    State(String, isize),
}

impl<'scope> KeyedState<'scope> for BatchStream<'scope> {
    fn keyed<L: KeyedLogic>(
        self,
        key: &str,
        mut logic: L,
        metrics: Arc<StageMetrics>,
        restored: &SavedState,
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>) {
        let (index, peers) = (self.scope().index(), self.scope().peers());
        let restored = restore::<L::State>(logic.name(), restored, index, peers);
        let name = logic.name().to_string();
        let key = key.to_string();
        let out = self
            .exchange_by_key(&key)
            .unary_frontier::<CapacityContainerBuilder<Vec<Out>>, _, _, _>(
                Pipeline,
                &name,
                move |initial, _| {
                    let mut restore = Some((initial, restored));
                    let mut states: HashMap<StateKey, Keep<L::State>> = HashMap::new();
                    let mut waiting: BTreeMap<Epoch, Vec<(Capability<Epoch>, Batch)>> =
                        BTreeMap::new();
                    move |(input, frontier), output| {
                        if let Some((initial, restored)) = restore.take() {
                            // At the checkpoint's own epoch, so the next checkpoint keeps them.
                            let at = initial.delayed(&first_epoch.saturating_sub(1));
                            let mut session = output.session(&at);
                            for (k, state) in restored {
                                let mut keep = Keep {
                                    state,
                                    announced: None,
                                };
                                for change in keep.changes(&k) {
                                    session.give(change);
                                }
                                states.insert(k, keep);
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
                            let mut retired = Vec::new();
                            for (_, batch) in &batches {
                                if batch.kind == BatchKind::Retired {
                                    retired.push(batch);
                                    continue;
                                }
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
                            // After the epoch's rows: every row of a retired key is through.
                            for batch in retired {
                                for out in retire_keys(&mut logic, &key, &mut states, batch) {
                                    session.give(out);
                                }
                                session.give(Out::Rows(batch.clone()));
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
    fn changes(&mut self, key: &StateKey) -> Vec<Out> {
        let record = KeyedRecordRef {
            key,
            state: &self.state,
        };
        let record = match serde_json::to_string(&record) {
            Ok(json) => json,
            Err(e) => {
                tracing::error!("state of `{}` cannot be checkpointed: {e}", key.shown());
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
    states: &mut HashMap<StateKey, Keep<L::State>>,
    metrics: &StageMetrics,
    batch: &Batch,
) -> Vec<Result<(StateKey, Vec<Batch>), Batch>> {
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
        match logic.process(&key.shown(), &mut next, &part) {
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

/// Drops the state of the keys `batch` retires (when they are of this stage's key column):
/// what the logic gives for them, and the state records withdrawn from the checkpoint.
fn retire_keys<L: KeyedLogic>(
    logic: &mut L,
    key_column: &str,
    states: &mut HashMap<StateKey, Keep<L::State>>,
    batch: &Batch,
) -> Vec<Out> {
    let Ok(groups) = group_by_key(&batch.data, key_column) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, _) in groups {
        let Some(keep) = states.remove(&key) else {
            continue;
        };
        if let Some(record) = keep.announced {
            out.push(Out::State(record, -1));
        }
        match logic.retire(&key.shown(), keep.state) {
            Ok(Some(rows)) if rows.num_rows() > 0 => {
                let mut closing = batch.with_data(rows);
                closing.kind = BatchKind::Records;
                out.push(Out::Rows(closing));
            }
            Ok(_) => {}
            Err(e) => tracing::error!("{}: retiring `{}`: {e}", logic.name(), key.shown()),
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
fn group_by_key(batch: &RecordBatch, column: &str) -> DataflowResult<Vec<(StateKey, Vec<u32>)>> {
    let keys = batch
        .column_by_name(column)
        .ok_or_else(|| DataflowError::schema(column, "a key column", "no such column"))?;
    let mut order: Vec<(StateKey, Vec<u32>)> = Vec::new();
    let mut at: HashMap<StateKey, usize> = HashMap::new();
    for row in 0..keys.len() {
        let key = key_of(keys.as_ref(), row)?;
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

/// Row `row`'s key.
fn key_of(keys: &dyn Array, row: usize) -> DataflowResult<StateKey> {
    if keys.is_null(row) {
        return Ok(StateKey::Text(String::new()));
    }
    match keys.data_type() {
        DataType::Utf8 => Ok(StateKey::Text(
            keys.as_string::<i32>().value(row).to_string(),
        )),
        DataType::Int64 => Ok(StateKey::Int(keys.as_primitive::<Int64Type>().value(row))),
        other => Err(DataflowError::schema(
            "key",
            "a Utf8 or Int64 column",
            other.to_string(),
        )),
    }
}

/// The checkpointed keys this worker owns, with their state.
fn restore<S: Serialize + DeserializeOwned>(
    stage: &str,
    restored: &SavedState,
    index: usize,
    peers: usize,
) -> Vec<(StateKey, S)> {
    restored
        .records::<KeyedRecord<S>>(stage)
        .into_iter()
        .filter(|(r, _)| r.key.owner(peers) == index)
        .map(|(r, _)| (r.key, r.state))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::encode;

    #[test]
    fn a_borrowed_record_encodes_as_the_record() {
        let key = StateKey::Int(7);
        let state = vec![1.5_f32, 2.0];
        let borrowed = serde_json::to_string(&KeyedRecordRef {
            key: &key,
            state: &state,
        })
        .unwrap();
        let owned = encode(&KeyedRecord { key, state }).unwrap();
        assert_eq!(borrowed, owned);
        assert_eq!(owned, r#"{"key":{"int":7},"state":[1.5,2.0]}"#);
    }

    #[test]
    fn format_1_records_read_with_their_typed_keys() {
        let text = KeyedRecord::<Vec<u32>>::from_v1("i:42\t[1,2]").unwrap();
        assert_eq!(text.key, StateKey::Int(42));
        assert_eq!(text.state, vec![1, 2]);
        let text = KeyedRecord::<u32>::from_v1("s:cam:1\t3").unwrap();
        assert_eq!(text.key, StateKey::Text("cam:1".into()));
        assert!(KeyedRecord::<u32>::from_v1("s:cam").is_none());
    }
}
