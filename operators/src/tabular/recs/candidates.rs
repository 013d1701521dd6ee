//! Candidate generation: for every click, the most popular items the user has not seen.
//!
//! The configuration, the checkpointed records and the answer rows are here, with the
//! `features: previous_epoch` mode (differential-dataflow features, one epoch behind); the
//! default `features: per_click` mode is in [`super::per_click`].

use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, UInt32Array, UInt64Array};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use differential_dataflow::AsCollection;
use foldhash::{HashMap, HashSet, HashSetExt};
use riffle_dataflow::dead_letter::{self, DeadLetter};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{
    worker_for_int, AnswerFrom, BatchStream, ExchangeByKey, StateUpdates,
};
use riffle_dataflow::state::{encode, SavedState, StateRecord};
use riffle_dataflow::{Batch, BatchKind, DataflowError, DataflowResult, Epoch};
use serde::{Deserialize, Serialize};
use serde_inline_default::serde_inline_default;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::{Broadcast, Map};
use timely::dataflow::operators::{Concat, Exchange, Operator};
use timely::dataflow::StreamVec;

use super::{Click, FeatureChange, Restore, SlidingWindow};

pub(super) const NAME: &str = "candidates";

/// Which clicks the features that answer a click include.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeaturesAsOf {
    /// Every earlier click and the click itself, in event-time order (equal times in input
    /// order), as a loop over the clicks one at a time would have them: real-time features.
    #[default]
    PerClick,
    /// Only the clicks of earlier epochs: no worker waits for another's clicks of the same
    /// epoch, but a click does not see the clicks just before it (not even its own user's).
    PreviousEpoch,
}

/// YAML block of a `candidates` stage.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidatesConfig {
    /// Int64 column of user ids; clicks are sharded by it.
    #[serde_inline_default("user_id".to_string())]
    pub user: String,
    /// Int64 column of item ids.
    #[serde_inline_default("item_id".to_string())]
    pub item: String,
    /// Int64 column of event times (any unit; `window` and `seen_window` use the same).
    #[serde_inline_default("timestamp".to_string())]
    pub time: String,
    /// Popularity counts clicks this recent (in event time); unset: every click so far.
    #[serde(default)]
    pub window: Option<i64>,
    /// A user's seen items are those clicked this recently; unset: every click so far.
    #[serde(default)]
    pub seen_window: Option<i64>,
    /// Candidates per click (fewer while few items are known).
    #[serde_inline_default(100)]
    pub max_candidates: usize,
    /// What a click's features include: `per_click` (every earlier click and itself) or
    /// `previous_epoch` (clicks of earlier epochs only, the faster, stale mode).
    #[serde(default)]
    pub features: FeaturesAsOf,
    /// Int64 column written with each candidate item (null for a click with none).
    #[serde_inline_default("candidate".to_string())]
    pub output: String,
    /// Int64 column written with an id shared by the rows of one click (unique: the epoch in
    /// the high 32 bits; with `per_click`, the click's place in the epoch's order below).
    #[serde_inline_default("event".to_string())]
    pub event: String,
    /// UInt64 column written with the click's epoch (`per_click`: its features hold every
    /// click of earlier epochs and the earlier clicks of this one; `previous_epoch`: only the
    /// clicks of earlier epochs).
    #[serde_inline_default("epoch".to_string())]
    pub epoch: String,
}

impl CandidatesConfig {
    /// The output schema for `input`, or what is wrong with the configuration.
    pub fn output_schema(&self, input: &Schema) -> DataflowResult<SchemaRef> {
        // Every error is located at the key it is about.
        if self.max_candidates == 0 {
            return Err(DataflowError::Config(
                "candidates: max_candidates must be at least 1".into(),
            )
            .at("max_candidates"));
        }
        for (key, window) in [("window", self.window), ("seen_window", self.seen_window)] {
            if let Some(w) = window.filter(|&w| w <= 0) {
                return Err(DataflowError::Config(format!(
                    "candidates: windows must be positive, got {w}"
                ))
                .at(key));
            }
        }
        for (key, column) in [
            ("user", &self.user),
            ("item", &self.item),
            ("time", &self.time),
        ] {
            let field = input.field_with_name(column).map_err(|_| {
                DataflowError::schema(column, "an Int64 column", "no such column").at(key)
            })?;
            if field.data_type() != &DataType::Int64 {
                return Err(DataflowError::schema(
                    column,
                    "an Int64 column",
                    field.data_type().to_string(),
                )
                .at(key));
            }
        }
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        for (key, name, data_type, nullable) in [
            ("event", &self.event, DataType::Int64, false),
            ("output", &self.output, DataType::Int64, true),
            ("epoch", &self.epoch, DataType::UInt64, false),
        ] {
            if input.field_with_name(name).is_ok() {
                return Err(
                    DataflowError::schema(name, "a new column name", "an existing column").at(key),
                );
            }
            fields.push(Field::new(name, data_type, nullable));
        }
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }
}

/// Extension trait adding candidate generation to batch streams.
pub trait Candidates<'scope>: Sized {
    /// Shards clicks by user, keeps item popularity and each user's seen items, and replaces
    /// every click row by one row per candidate item (or one row with a null candidate when
    /// there is none yet). With `features: per_click` (the default) a click's features include
    /// every earlier click and itself; with `previous_epoch`, the clicks of earlier epochs.
    /// Rows with a null user, item or time become dead letters.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Array, Int64Array, RecordBatch};
    /// use riffle_dataflow::observe::registry::Metrics;
    /// use riffle_dataflow::Batch;
    /// use riffle_operators::tabular::recs::{Candidates, CandidatesConfig};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let clicks = |users: Vec<i64>, items: Vec<i64>| {
    ///     let times = Int64Array::from_iter_values(0..users.len() as i64);
    ///     RecordBatch::try_from_iter(vec![
    ///         ("user_id", Arc::new(Int64Array::from(users)) as _),
    ///         ("item_id", Arc::new(Int64Array::from(items)) as _),
    ///         ("timestamp", Arc::new(times) as _),
    ///     ]).unwrap()
    /// };
    /// let config: CandidatesConfig = serde_json::from_str(r#"{"max_candidates": 2}"#).unwrap();
    /// let metrics = Metrics::new().unwrap().stage("candidates").unwrap();
    /// let out = Arc::new(Mutex::new(Vec::new()));
    /// let sink = out.clone();
    /// timely::example(move |scope| {
    ///     use timely::dataflow::operators::vec::Input;
    ///     let (mut input, stream) = scope.new_input();
    ///     stream
    ///         .candidates(config, metrics)
    ///         .inspect(move |b: &Batch| sink.lock().unwrap().push(b.data.clone()));
    ///     input.send(Batch::records(clicks(vec![1, 2, 3], vec![10, 10, 11]), 0));
    ///     input.advance_to(1);
    ///     input.send(Batch::records(clicks(vec![4, 1], vec![12, 13]), 0));
    /// });
    /// let out = out.lock().unwrap();
    /// let candidates = |user: i64| -> Vec<Option<i64>> {
    ///     out.iter().flat_map(|b| {
    ///         let users = b.column_by_name("user_id").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
    ///         let c = b.column_by_name("candidate").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
    ///         (0..b.num_rows()).filter(move |&r| users.value(r) == user).map(move |r| c.is_valid(r).then(|| c.value(r)))
    ///     }).collect()
    /// };
    /// // Each click sees the clicks before it: user 3 sees 10 (twice, by users 1 and 2).
    /// assert_eq!(candidates(3), vec![Some(10)]);
    /// // 10 (twice), then 11 and 12 (once; ties go to the smaller id).
    /// assert_eq!(candidates(4), vec![Some(10), Some(11)]);
    /// // User 1 has no candidate for its first click, and already clicked 10 for its second.
    /// assert_eq!(candidates(1), vec![None, Some(11), Some(12)]);
    /// ```
    fn candidates(self, config: CandidatesConfig, metrics: Arc<StageMetrics>) -> Self {
        self.candidates_from(config, metrics, &SavedState::default(), 0)
            .0
    }

    /// As [`Candidates::candidates`], restoring the features from a checkpoint's `state` (as
    /// the returned updates wrote it) before `first_epoch`, and returning the updates of the
    /// state to checkpoint: the clicks in each window, as [`WindowClick`] records.
    fn candidates_from(
        self,
        config: CandidatesConfig,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (Self, StateUpdates<'scope>);
}

/// The window a checkpointed click is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Window {
    /// The popularity window (`window`).
    #[serde(rename = "p")]
    Popular,
    /// The seen-items window (`seen_window`).
    #[serde(rename = "s")]
    Seen,
}

/// One click in one of the windows, as `candidates` checkpoints it: `["p", user, item, time]`
/// (compact: a window holds many).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowClick(pub Window, pub i64, pub i64, pub i64);

impl WindowClick {
    pub(super) fn new(window: Window, c: Click) -> WindowClick {
        WindowClick(window, c.user, c.item, c.time)
    }

    pub(super) fn click(&self) -> Click {
        let WindowClick(_, user, item, time) = *self;
        Click { user, item, time }
    }
}

impl StateRecord for WindowClick {
    const KIND: &'static str = "candidates";

    /// Format 1: `p,user,item,time` or `s,user,item,time`.
    fn from_v1(text: &str) -> Option<Self> {
        let mut fields = text.split(',');
        let window = match fields.next()? {
            "p" => Window::Popular,
            "s" => Window::Seen,
            _ => return None,
        };
        let values: Vec<i64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let [user, item, time] = values[..] else {
            return None;
        };
        Some(WindowClick(window, user, item, time))
    }
}

/// A click's state record.
pub(super) fn record(window: Window, click: Click) -> String {
    encode(&WindowClick::new(window, click)).unwrap_or_else(|e| {
        tracing::error!("{e}");
        String::new()
    })
}

/// The clicks of a checkpointed state this worker owns, per window, and the latest event time.
fn restore(
    state: &SavedState,
    first_epoch: Epoch,
    (index, peers): (usize, usize),
) -> (Restore, Restore) {
    let at = first_epoch.saturating_sub(1);
    let (mut popular, mut seen) = (Vec::new(), Vec::new());
    let mut watermark = None;
    for (record, count) in state.records::<WindowClick>(NAME) {
        let (window, click) = (record.0, record.click());
        watermark = watermark.max(Some(click.time));
        if worker_for_int(click.user, peers) != index {
            continue;
        }
        let into = match window {
            Window::Popular => &mut popular,
            Window::Seen => &mut seen,
        };
        into.extend(std::iter::repeat_n(click, count.max(0) as usize));
    }
    let restore = |records| Restore {
        records,
        watermark,
        at,
    };
    (restore(popular), restore(seen))
}

/// `features: previous_epoch`: popularity counted with differential-dataflow on the clicks'
/// workers and broadcast, seen items on the users' workers; each click answered from the
/// features as of the previous epoch.
pub(super) fn previous_epoch<'scope>(
    stream: BatchStream<'scope>,
    config: CandidatesConfig,
    metrics: Arc<StageMetrics>,
    state: &SavedState,
    first_epoch: Epoch,
) -> (BatchStream<'scope>, StateUpdates<'scope>) {
    let peers = stream.scope().peers();
    let index = stream.scope().index();
    let (restore_popular, restore_seen) = if first_epoch > 0 {
        restore(state, first_epoch, (index, peers))
    } else {
        Default::default()
    };
    let owned = stream.exchange_by_key(&config.user);

    let columns = config.clone();
    let clicks: StreamVec<'scope, Epoch, Click> =
        owned.clone().unary(Pipeline, "Clicks", move |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    let mut session = output.session(&cap);
                    for batch in data.iter().filter(|b| b.kind == BatchKind::Records) {
                        if let Ok((users, items, times)) = click_columns(&batch.data, &columns) {
                            session.give_iterator(
                                (0..batch.num_rows())
                                    .filter(|&r| {
                                        users.is_valid(r) && items.is_valid(r) && times.is_valid(r)
                                    })
                                    .map(|r| Click {
                                        user: users.value(r),
                                        item: items.value(r),
                                        time: times.value(r),
                                    }),
                            );
                        }
                    }
                });
            }
        });
    // Each worker's latest event time per epoch, seen by every worker's windows.
    let watermarks = clicks
        .clone()
        .unary(Pipeline, "EventTime", |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    if let Some(max) = data.iter().map(|c| c.time).max() {
                        output.session(&cap).give(max);
                    }
                });
            }
        })
        .broadcast();

    let popular_window =
        clicks
            .clone()
            .sliding_window_from(watermarks.clone(), config.window, restore_popular);
    let seen_window = clicks.sliding_window_from(watermarks, config.seen_window, restore_seen);
    let state = popular_window
        .clone()
        .map(|(c, _, diff)| (record(Window::Popular, c), diff))
        .concat(
            seen_window
                .clone()
                .map(|(c, _, diff)| (record(Window::Seen, c), diff)),
        );
    let popularity = popular_window
        .map(|(c, t, diff)| (c.item, t, diff))
        .as_collection()
        .count()
        .inner
        .map(|((item, count), t, diff)| {
            let count = count as i64;
            (t, FeatureChange::Popularity { item, count, diff })
        })
        .broadcast();
    let seen = seen_window
        .map(|(c, t, diff)| ((c.user, c.item), t, diff))
        .as_collection()
        .distinct()
        .inner
        .map(|((user, item), t, diff)| (t, FeatureChange::Seen { user, item, diff }))
        .exchange(move |(_, c)| match c {
            FeatureChange::Seen { user, .. } => worker_for_int(*user, peers) as u64,
            FeatureChange::Popularity { .. } => 0,
        });
    let changes = popularity.concat(seen);

    let mut next_event: (Epoch, i64) = (0, 0);
    let answer = move |features: &mut Features, batch: &Batch, t: Epoch| {
        let started = Instant::now();
        let out = features.answer(&batch.data, &config, t, &mut next_event, (index, peers));
        let (records, rejected) = match out {
            Ok(out) => out,
            Err(e) => {
                let reason = e.to_string();
                let letters = (0..batch.num_rows())
                    .map(|r| DeadLetter::for_row(NAME, &batch.data, r, &reason))
                    .collect();
                (None, letters)
            }
        };
        let rows_out = records.as_ref().map_or(0, RecordBatch::num_rows);
        metrics.record_batch(
            batch.num_rows(),
            rows_out,
            rejected.len(),
            started.elapsed(),
        );
        let mut out = Vec::with_capacity(2);
        if let Some(records) = records.filter(|r| r.num_rows() > 0) {
            out.push(batch.with_data(records));
        }
        if !rejected.is_empty() {
            match dead_letter::to_batch(&rejected) {
                Ok(letters) => out.push(Batch::dead_letters(letters, batch.ingest_ns)),
                Err(e) => tracing::error!("candidates: dead letters: {e}"),
            }
        }
        out
    };
    // Clicks of epoch t are answered from the features as of epoch t - 1.
    let answers = owned.answer_from(
        changes,
        "Candidates",
        Features::default(),
        |features, change| features.apply(change),
        answer,
    );
    (answers, state)
}

/// The features one worker answers from: global popularity and its own users' seen items.
#[derive(Default)]
struct Features {
    counts: HashMap<i64, i64>,
    /// Items by popularity (count descending, then id), rebuilt when counts change.
    ranking: Vec<i64>,
    stale: bool,
    seen: HashMap<i64, HashSet<i64>>,
    schemas: Schemas,
}

impl Features {
    fn apply(&mut self, change: FeatureChange) {
        match change {
            FeatureChange::Popularity { item, count, diff } => {
                self.stale = true;
                if diff > 0 {
                    self.counts.insert(item, count);
                } else if self.counts.get(&item) == Some(&count) {
                    self.counts.remove(&item);
                }
            }
            FeatureChange::Seen { user, item, diff } => {
                if diff > 0 {
                    self.seen.entry(user).or_default().insert(item);
                } else if let Some(items) = self.seen.get_mut(&user) {
                    items.remove(&item);
                    if items.is_empty() {
                        self.seen.remove(&user);
                    }
                }
            }
        }
    }

    fn rank(&mut self) {
        if !self.stale {
            return;
        }
        let mut items: Vec<(i64, i64)> = self.counts.iter().map(|(i, c)| (-*c, *i)).collect();
        items.sort_unstable();
        self.ranking = items.into_iter().map(|(_, i)| i).collect();
        self.stale = false;
    }

    /// One row per candidate of every click in `batch`, and dead letters for incomplete clicks.
    fn answer(
        &mut self,
        batch: &RecordBatch,
        config: &CandidatesConfig,
        epoch: Epoch,
        next_event: &mut (Epoch, i64),
        (index, peers): (usize, usize),
    ) -> DataflowResult<(Option<RecordBatch>, Vec<DeadLetter>)> {
        let schema = self.schemas.output(&batch.schema(), config)?;
        let (users, items, times) = click_columns(batch, config)?;
        self.rank();
        let mut rows = AnswerRows::new(schema, batch.num_rows(), config.max_candidates);
        let mut rejected = Vec::new();
        let empty = HashSet::new();
        for row in 0..batch.num_rows() {
            if !(users.is_valid(row) && items.is_valid(row) && times.is_valid(row)) {
                rejected.push(DeadLetter::for_row(
                    NAME,
                    batch,
                    row,
                    format!(
                        "`{}`, `{}` and `{}` must not be null",
                        config.user, config.item, config.time
                    ),
                ));
                continue;
            }
            let (user, clicked) = (users.value(row), items.value(row));
            let seen = self.seen.get(&user).unwrap_or(&empty);
            // Unique across workers and restarts (a resumed run starts at a new epoch): the
            // epoch, then this worker's sequence in it interleaved with its peers'.
            if next_event.0 != epoch {
                *next_event = (epoch, 0);
            }
            let event = ((epoch as i64) << 32) | (next_event.1 * peers as i64 + index as i64);
            next_event.1 += 1;
            let candidates = self
                .ranking
                .iter()
                .copied()
                .filter(|item| *item != clicked && !seen.contains(item))
                .take(config.max_candidates);
            rows.push(row, event, clicked, candidates);
        }
        Ok((Some(rows.finish(batch, epoch)?), rejected))
    }
}

/// The output schema last built, for the input schema it was built for (batches share one).
#[derive(Default)]
pub(super) struct Schemas(Option<(SchemaRef, SchemaRef)>);

impl Schemas {
    /// The output schema for `input`.
    pub(super) fn output(
        &mut self,
        input: &SchemaRef,
        config: &CandidatesConfig,
    ) -> DataflowResult<SchemaRef> {
        match &self.0 {
            Some((seen, output)) if seen == input => Ok(output.clone()),
            _ => {
                let output = config.output_schema(input.as_ref())?;
                self.0 = Some((input.clone(), output.clone()));
                Ok(output)
            }
        }
    }
}

/// The candidate rows of one batch, as they are answered: each click's input row repeated once
/// per candidate, with the click's event id and the candidate.
pub(super) struct AnswerRows {
    schema: SchemaRef,
    take: Vec<u32>,
    events: Vec<i64>,
    candidates: Vec<i64>,
    valid: Vec<bool>,
}

impl AnswerRows {
    /// Room for `rows` clicks of up to `limit` candidates each, written as `schema`.
    pub(super) fn new(schema: SchemaRef, rows: usize, limit: usize) -> Self {
        let capacity = rows.saturating_mul(limit.min(128));
        AnswerRows {
            schema,
            take: Vec::with_capacity(capacity),
            events: Vec::with_capacity(capacity),
            candidates: Vec::with_capacity(capacity),
            valid: Vec::with_capacity(capacity),
        }
    }

    /// Answers the click in input row `row` with `items`.
    pub(super) fn push(
        &mut self,
        row: usize,
        event: i64,
        clicked: i64,
        items: impl Iterator<Item = i64>,
    ) {
        let before = self.candidates.len();
        self.candidates.extend(items);
        let n = self.candidates.len() - before;
        self.valid.extend(std::iter::repeat_n(true, n));
        if n == 0 {
            // The click still gets its row, so every click has an answer downstream; the
            // model needs a valid id, so the clicked item stands in under a null.
            self.candidates.push(clicked);
            self.valid.push(false);
        }
        let rows = n.max(1);
        let row = u32::try_from(row).unwrap_or(u32::MAX);
        self.take.extend(std::iter::repeat_n(row, rows));
        self.events.extend(std::iter::repeat_n(event, rows));
    }

    /// The rows: `batch`'s columns taken per candidate, then the event, candidate and epoch.
    pub(super) fn finish(self, batch: &RecordBatch, epoch: Epoch) -> DataflowResult<RecordBatch> {
        let indices = UInt32Array::from(self.take);
        let mut columns: Vec<ArrayRef> = batch
            .columns()
            .iter()
            .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
            .collect::<Result<_, _>>()?;
        let rows = indices.len();
        columns.push(Arc::new(Int64Array::from(self.events)));
        let nulls = NullBuffer::from(self.valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        columns.push(Arc::new(Int64Array::new(self.candidates.into(), nulls)));
        columns.push(Arc::new(UInt64Array::from_value(epoch, rows)));
        Ok(RecordBatch::try_new(self.schema, columns)?)
    }
}

/// The user, item and time columns of `batch`, or which is missing or not Int64.
pub(super) fn click_columns<'a>(
    batch: &'a RecordBatch,
    config: &CandidatesConfig,
) -> DataflowResult<(&'a Int64Array, &'a Int64Array, &'a Int64Array)> {
    let column = |key: &str, name: &str| -> DataflowResult<&'a Int64Array> {
        let c = batch.column_by_name(name).ok_or_else(|| {
            DataflowError::schema(name, "an Int64 column", "no such column").at(key)
        })?;
        c.as_primitive_opt::<Int64Type>().ok_or_else(|| {
            DataflowError::schema(name, "an Int64 column", c.data_type().to_string()).at(key)
        })
    };
    Ok((
        column("user", &config.user)?,
        column("item", &config.item)?,
        column("time", &config.time)?,
    ))
}
