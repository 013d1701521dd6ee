//! `features: previous_epoch`: popularity counted with differential-dataflow on the clicks'
//! workers and broadcast, seen items on the users' workers; each click answered from the
//! features as of the previous epoch.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::{Array, RecordBatch};
use differential_dataflow::AsCollection;
use foldhash::{HashMap, HashSet, HashSetExt};
use riffle_dataflow::dead_letter::{self, DeadLetter};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{
    worker_for_int, AnswerFrom, BatchStream, ExchangeByKey, StateUpdates,
};
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{Batch, BatchKind, DataflowResult, Epoch};
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::{Broadcast, Map};
use timely::dataflow::operators::{Concat, Exchange, Operator};
use timely::dataflow::StreamVec;

use super::answer_rows::{click_columns, AnswerRows, Schemas};
use super::checkpoint::{record, Window, WindowClick};
use super::{CandidatesConfig, Click, FeatureChange, Restore, SlidingWindow, WindowUpdates, NAME};

/// The previous-epoch candidates of `stream` (see the module docs), restored from `state`
/// before `first_epoch`, and the updates of the state to checkpoint.
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
    let clicks = complete_clicks(owned.clone(), config.clone());
    let watermarks = event_times(clicks.clone());
    let popular_window =
        clicks
            .clone()
            .sliding_window_from(watermarks.clone(), config.window, restore_popular);
    let seen_window = clicks.sliding_window_from(watermarks, config.seen_window, restore_seen);
    let state = window_records(popular_window.clone(), seen_window.clone());
    let changes = feature_changes(popular_window, seen_window, peers);
    let mut answering = Answering {
        config,
        metrics,
        next_event: (0, 0),
        worker: (index, peers),
    };
    // Clicks of epoch t are answered from the features as of epoch t - 1.
    let answers = owned.answer_from(
        changes,
        "Candidates",
        Features::default(),
        |features, change| features.apply(change),
        move |features, batch, t| answering.batch(features, batch, t),
    );
    (answers, state)
}

/// The clicks of this worker's rows that have a user, an item and a time.
fn complete_clicks<'scope>(
    owned: BatchStream<'scope>,
    columns: CandidatesConfig,
) -> StreamVec<'scope, Epoch, Click> {
    owned.unary(Pipeline, "Clicks", move |_, _| {
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
    })
}

/// Each worker's latest event time per epoch, seen by every worker's windows.
fn event_times<'scope>(clicks: StreamVec<'scope, Epoch, Click>) -> StreamVec<'scope, Epoch, i64> {
    clicks
        .unary(Pipeline, "EventTime", |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    if let Some(max) = data.iter().map(|c| c.time).max() {
                        output.session(&cap).give(max);
                    }
                });
            }
        })
        .broadcast()
}

/// The windows' changes as the state to checkpoint.
fn window_records<'scope>(
    popular_window: WindowUpdates<'scope, Click>,
    seen_window: WindowUpdates<'scope, Click>,
) -> StateUpdates<'scope> {
    popular_window
        .map(|(c, _, diff)| (record(Window::Popular, c), diff))
        .concat(seen_window.map(|(c, _, diff)| (record(Window::Seen, c), diff)))
}

/// The features' changes, counted by differential-dataflow: every item's popularity (to every
/// worker) and each user's seen items (to the user's worker).
fn feature_changes<'scope>(
    popular_window: WindowUpdates<'scope, Click>,
    seen_window: WindowUpdates<'scope, Click>,
    peers: usize,
) -> StreamVec<'scope, Epoch, (Epoch, FeatureChange)> {
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
    popularity.concat(seen)
}

/// Answers this worker's batches from its features, numbering the clicks.
struct Answering {
    config: CandidatesConfig,
    metrics: Arc<StageMetrics>,
    /// The epoch being answered and the next click's sequence in it.
    next_event: (Epoch, i64),
    /// This worker's index and the number of workers.
    worker: (usize, usize),
}

impl Answering {
    /// `batch`'s candidate rows and dead letters (every row a dead letter when the batch
    /// cannot be answered).
    fn batch(&mut self, features: &mut Features, batch: &Batch, t: Epoch) -> Vec<Batch> {
        let started = Instant::now();
        let out = features.answer(
            &batch.data,
            &self.config,
            t,
            &mut self.next_event,
            self.worker,
        );
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
        self.metrics.record_batch(
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
    }
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
