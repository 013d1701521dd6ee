//! `features: per_click` (the default): every click is answered from features that include
//! every earlier click and the click itself, exactly as a one-click-at-a-time loop would.
//!
//! Each click's user, item and time (a few bytes) go to every worker, so every worker keeps the
//! global popularity itself; a user's seen items stay on the user's worker, with the click's
//! row. Once an epoch is complete, every worker puts its clicks in one global order and replays
//! them: it counts each click, expires what left the windows, and answers the clicks of its own
//! users at their place. Batching stays per epoch; the answers are those of the loop.
//!
//! The order: epochs in turn; within an epoch, event time, then input order. Input order across
//! workers is the `k`-th records batch each worker read in the epoch, then the worker, then the
//! row: a file is dealt in chunks of `batch_size` records, chunk `c` to worker `c % workers`,
//! and every worker closes its epochs after the same number of records, so for a file replay
//! this is the file's order (and the same in every run). A click that arrives in a later epoch
//! than a click with a later event time is answered after it: answers already given are not
//! revised.

mod part;
mod replay;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{BatchStream, ExchangeByKey, StateUpdates};
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{Batch, BatchKind, Epoch};
use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::{Broadcast, Map};
use timely::dataflow::operators::{Capability, InputCapability, Operator};
use timely::dataflow::StreamVec;

use super::answer_rows::click_columns;
use super::{CandidatesConfig, Click};
use replay::{restore, Replay, Restored};

/// The column that carries each row's place (`worker << 32 | sequence`) from the worker that
/// read it to the worker that answers it; never in the output.
const PLACE: &str = "__riffle_candidates_place";

/// A click as every worker replays it. Ordered as the replay goes: event time, then input order
/// (the reading worker's `round`-th records batch of the epoch, the worker, its sequence there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Placed {
    time: i64,
    round: u32,
    worker: u32,
    /// The row's place among the reading worker's rows of the epoch.
    seq: u32,
    user: i64,
    item: i64,
}

impl Placed {
    fn place(&self) -> i64 {
        place(self.worker, self.seq)
    }

    fn click(&self) -> Click {
        Click {
            user: self.user,
            item: self.item,
            time: self.time,
        }
    }
}

fn place(worker: u32, seq: u32) -> i64 {
    (i64::from(worker) << 32) | i64::from(seq)
}

/// What the reading side sends on: rows towards their user's worker, clicks to every worker.
#[derive(Clone)]
enum Read {
    Rows(Batch),
    Click(Placed),
}

/// What the answering side sends on: candidate rows, and changes of the checkpointed windows.
#[derive(Clone)]
enum Out {
    Rows(Batch),
    State(String, isize),
}

/// The per-click candidates of `stream` (see the module docs), restored from `state` before
/// `first_epoch`, and the updates of the state to checkpoint.
pub(super) fn candidates<'scope>(
    stream: BatchStream<'scope>,
    config: CandidatesConfig,
    metrics: Arc<StageMetrics>,
    state: &SavedState,
    first_epoch: Epoch,
) -> (BatchStream<'scope>, StateUpdates<'scope>) {
    let peers = stream.scope().peers();
    let index = stream.scope().index();
    let restored = (first_epoch > 0).then(|| restore(state, (index, peers)));
    let worker = u32::try_from(index).unwrap_or(u32::MAX);
    let read = read_in_order(stream, config.clone(), worker);
    let owned = read
        .clone()
        .flat_map(|r| match r {
            Read::Rows(batch) => Some(batch),
            Read::Click(_) => None,
        })
        .exchange_by_key(&config.user);
    let clicks = read
        .flat_map(|r| match r {
            Read::Click(click) => Some(click),
            Read::Rows(_) => None,
        })
        .broadcast();

    let replay = Replay::new(&config, (index, peers));
    let out = answer_in_order(owned, clicks, replay, restored, first_epoch, metrics);
    let answers = out.clone().flat_map(|o| match o {
        Out::Rows(batch) => Some(batch),
        Out::State(..) => None,
    });
    let updates = out.flat_map(|o| match o {
        Out::State(record, diff) => Some((record, diff)),
        Out::Rows(_) => None,
    });
    (answers, updates)
}

/// The reading side: each records batch with its rows' places, and its clicks, numbered in
/// the order this worker reads them (per epoch: the batch's round, the row's sequence).
fn read_in_order<'scope>(
    stream: BatchStream<'scope>,
    columns: CandidatesConfig,
    worker: u32,
) -> StreamVec<'scope, Epoch, Read> {
    stream.unary_frontier::<CapacityContainerBuilder<Vec<Read>>, _, _, _>(
        Pipeline,
        "ClickOrder",
        move |_, _| {
            // Per open epoch: records batches read so far, rows read so far.
            let mut counters: BTreeMap<Epoch, (u32, u32)> = BTreeMap::new();
            move |(input, frontier), output| {
                input.for_each(|cap, data| {
                    let Some(&t) = cap.least() else {
                        return;
                    };
                    let mut session = output.session(&cap);
                    let (round, seq) = counters.entry(t).or_default();
                    for batch in data.drain(..) {
                        if batch.kind != BatchKind::Records || batch.num_rows() == 0 {
                            session.give(Read::Rows(batch));
                            continue;
                        }
                        let (rows, clicks) = place_rows(batch, &columns, worker, *round, seq);
                        *round += 1;
                        session.give_iterator(clicks.into_iter().map(Read::Click));
                        session.give(Read::Rows(rows));
                    }
                });
                counters.retain(|t, _| frontier.less_equal(t));
            }
        },
    )
}

/// The answering side: holds this worker's rows and every worker's clicks until their epoch
/// is complete, then replays it; first announces the restored windows, if any.
fn answer_in_order<'scope>(
    owned: BatchStream<'scope>,
    clicks: StreamVec<'scope, Epoch, Placed>,
    mut replay: Replay,
    restored: Option<Restored>,
    first_epoch: Epoch,
    metrics: Arc<StageMetrics>,
) -> StreamVec<'scope, Epoch, Out> {
    owned.binary_frontier::<_, CapacityContainerBuilder<Vec<Out>>, _, _, _, _>(
        clicks,
        Pipeline,
        Pipeline,
        "Candidates",
        move |initial, _| {
            let mut restore = restored.map(|r| (initial, r));
            let mut pending = Pending::default();
            move |(batches, batches_frontier), (placed, placed_frontier), output| {
                if let Some((initial, restored)) = restore.take() {
                    // At the checkpoint's own epoch, so the next checkpoint keeps them.
                    let at = initial.delayed(&first_epoch.saturating_sub(1));
                    let announce = replay.restore(restored);
                    output
                        .session(&at)
                        .give_iterator(announce.into_iter().map(|(r, d)| Out::State(r, d)));
                }
                batches.for_each(|cap, data| {
                    for batch in data.drain(..) {
                        if batch.kind != BatchKind::Records || batch.num_rows() == 0 {
                            output.session(&cap).give(Out::Rows(batch));
                        } else {
                            pending.hold_rows(&cap, batch);
                        }
                    }
                });
                placed.for_each(|cap, data| pending.hold_clicks(&cap, data));
                // An epoch is replayed once every worker's clicks and rows of it are here.
                let complete =
                    |t: &Epoch| !batches_frontier.less_equal(t) && !placed_frontier.less_equal(t);
                while let Some((cap, rows, clicks)) = pending.next_complete(complete) {
                    let out = replay.epoch(*cap.time(), clicks, rows, &metrics);
                    output.session(&cap).give_iterator(out.into_iter());
                }
            }
        },
    )
}

/// The epochs not yet replayed: a capability for each, this worker's rows and every worker's
/// clicks of it.
#[derive(Default)]
struct Pending {
    held: BTreeMap<Epoch, Capability<Epoch>>,
    rows: BTreeMap<Epoch, Vec<Batch>>,
    clicks: BTreeMap<Epoch, Vec<Placed>>,
}

impl Pending {
    fn hold_rows(&mut self, cap: &InputCapability<Epoch>, batch: Batch) {
        if let Some(c) = cap.retain_least(0) {
            let t = *c.time();
            self.held.entry(t).or_insert(c);
            self.rows.entry(t).or_default().push(batch);
        }
    }

    fn hold_clicks(&mut self, cap: &InputCapability<Epoch>, data: &mut Vec<Placed>) {
        if let Some(c) = cap.retain_least(0) {
            let t = *c.time();
            self.held.entry(t).or_insert(c);
            self.clicks.entry(t).or_default().append(data);
        }
    }

    /// The earliest epoch held, taken out, if `complete` says no more of it can arrive.
    fn next_complete(
        &mut self,
        complete: impl Fn(&Epoch) -> bool,
    ) -> Option<(Capability<Epoch>, Vec<Batch>, Vec<Placed>)> {
        let entry = self.held.first_entry()?;
        let t = *entry.key();
        if !complete(&t) {
            return None;
        }
        let cap = entry.remove();
        let rows = self.rows.remove(&t).unwrap_or_default();
        let clicks = self.clicks.remove(&t).unwrap_or_default();
        Some((cap, rows, clicks))
    }
}

/// `batch` with each row's place appended, and its complete clicks (rows `seq..` of the reading
/// worker's epoch, its `round`-th records batch). A batch whose click columns are missing goes
/// on as it is: the answering side turns it into dead letters that say so.
fn place_rows(
    batch: Batch,
    config: &CandidatesConfig,
    worker: u32,
    round: u32,
    seq: &mut u32,
) -> (Batch, Vec<Placed>) {
    let Ok((users, items, times)) = click_columns(&batch.data, config) else {
        return (batch, Vec::new());
    };
    let rows = batch.num_rows();
    let mut places = Vec::with_capacity(rows);
    let mut clicks = Vec::with_capacity(rows);
    for row in 0..rows {
        places.push(place(worker, *seq));
        if users.is_valid(row) && items.is_valid(row) && times.is_valid(row) {
            clicks.push(Placed {
                time: times.value(row),
                round,
                worker,
                seq: *seq,
                user: users.value(row),
                item: items.value(row),
            });
        }
        *seq = seq.wrapping_add(1);
    }
    let data = &batch.data;
    let mut fields: Vec<Arc<Field>> = data.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(PLACE, DataType::Int64, false)));
    let mut columns: Vec<ArrayRef> = data.columns().to_vec();
    columns.push(Arc::new(Int64Array::from(places)));
    let schema = Arc::new(Schema::new_with_metadata(
        fields,
        data.schema().metadata().clone(),
    ));
    match RecordBatch::try_new(schema, columns) {
        Ok(placed) => (batch.with_data(placed), clicks),
        Err(e) => {
            tracing::error!("candidates: placing rows: {e}");
            (batch, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tabular::recs::NAME;

    #[test]
    fn clicks_replay_by_time_then_batch_round_then_worker_then_row() {
        let at = |time, round, worker, seq| Placed {
            time,
            round,
            worker,
            seq,
            user: 0,
            item: 0,
        };
        // A later round of worker 0 comes after an earlier round of worker 1 at equal times
        // (the file's chunk order), and event time comes before everything.
        let mut clicks = [
            at(5, 1, 0, 64),
            at(5, 0, 1, 63),
            at(4, 1, 1, 70),
            at(5, 0, 0, 3),
        ];
        clicks.sort_unstable();
        let order: Vec<(u32, u32)> = clicks.iter().map(|c| (c.worker, c.seq)).collect();
        assert_eq!(order, vec![(1, 70), (0, 3), (1, 63), (0, 64)]);
    }

    /// Clicks of 7 users on 9 items, times rising with ties.
    fn clicks(n: i64) -> Vec<Click> {
        (0..n)
            .map(|k| Click {
                user: (k * 5) % 7,
                item: (k * k + 3 * k) % 9,
                time: k / 2 + (k % 5),
            })
            .collect()
    }

    fn config() -> CandidatesConfig {
        serde_json::from_value(serde_json::json!({
            "window": 6, "seen_window": 4, "max_candidates": 3
        }))
        .unwrap()
    }

    /// Replays `clicks` on `peers` workers; every click's candidates (from its user's worker)
    /// and the checkpointed records so far, consolidated.
    fn replay(
        workers: &mut [Replay],
        clicks: &[Click],
        state: &mut BTreeMap<String, isize>,
    ) -> Vec<Vec<i64>> {
        let mut answers = Vec::new();
        for c in clicks {
            let mut owner = None;
            for (w, replay) in workers.iter_mut().enumerate() {
                let mut out = Vec::new();
                replay.apply(*c, &mut out);
                for o in out {
                    if let Out::State(record, diff) = o {
                        *state.entry(record).or_default() += diff;
                    }
                }
                if replay.owns(c.user) {
                    assert!(owner.replace(w).is_none(), "one owner per user");
                    answers.push(replay.candidates_for(c.user, c.item).collect());
                }
            }
        }
        state.retain(|_, n| *n != 0);
        answers
    }

    fn saved(state: &BTreeMap<String, isize>) -> SavedState {
        let envelope = riffle_dataflow::state::Envelope::new(
            NAME,
            state.iter().map(|(r, n)| (r.as_str(), *n)),
        )
        .unwrap();
        SavedState::parse(&serde_json::to_string(&envelope).unwrap()).unwrap()
    }

    #[test]
    fn restored_windows_answer_as_an_uninterrupted_run_on_any_worker_count() {
        let config = config();
        let all = clicks(120);
        let (before, after) = all.split_at(70);
        let fresh = |peers: usize| -> Vec<Replay> {
            (0..peers)
                .map(|w| Replay::new(&config, (w, peers)))
                .collect()
        };
        let mut state = BTreeMap::new();
        let mut whole = fresh(2);
        let expected = replay(&mut whole, &all, &mut state);
        assert!(
            expected.iter().any(|c| c.len() == 3),
            "some clicks fill their candidates"
        );

        let mut state = BTreeMap::new();
        let mut first = fresh(2);
        replay(&mut first, before, &mut state);
        assert!(
            state.values().all(|n| *n == 1),
            "each window click once: {state:?}"
        );
        let kept: usize = state.len();
        assert!(
            kept > 0 && kept < 2 * before.len(),
            "the windows dropped old clicks"
        );
        for peers in [2, 3] {
            let saved = saved(&state);
            let mut resumed = fresh(peers);
            let mut announced = BTreeMap::new();
            for (w, r) in resumed.iter_mut().enumerate() {
                for (record, diff) in r.restore(restore(&saved, (w, peers))) {
                    *announced.entry(record).or_default() += diff;
                }
            }
            assert_eq!(
                announced, state,
                "the workers announce the restored windows once"
            );
            let mut later = state.clone();
            let got = replay(&mut resumed, after, &mut later);
            assert_eq!(
                got,
                expected[before.len()..],
                "{peers} workers after the restart"
            );
        }
    }
}
