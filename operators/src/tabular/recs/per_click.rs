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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use foldhash::{HashMap, HashMapExt};
use riffle_dataflow::dead_letter::{self, DeadLetter};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{worker_for_int, BatchStream, ExchangeByKey, StateUpdates};
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{Batch, BatchKind, Epoch};
use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::{Broadcast, Map};
use timely::dataflow::operators::{Capability, Operator};

use super::candidates::{click_columns, record, AnswerRows, Schemas, Window, WindowClick, NAME};
use super::{CandidatesConfig, Click};

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
    let columns = config.clone();
    let worker = u32::try_from(index).unwrap_or(u32::MAX);
    let read = stream.unary_frontier::<CapacityContainerBuilder<Vec<Read>>, _, _, _>(
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
    );
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

    let out = owned.binary_frontier::<_, CapacityContainerBuilder<Vec<Out>>, _, _, _, _>(
        clicks,
        Pipeline,
        Pipeline,
        "Candidates",
        move |initial, _| {
            let mut replay = Replay::new(&config, (index, peers));
            let mut restore = restored.map(|r| (initial, r));
            let mut held: BTreeMap<Epoch, Capability<Epoch>> = BTreeMap::new();
            let mut rows: BTreeMap<Epoch, Vec<Batch>> = BTreeMap::new();
            let mut clicks: BTreeMap<Epoch, Vec<Placed>> = BTreeMap::new();
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
                            continue;
                        }
                        if let Some(c) = cap.retain_least(0) {
                            let t = *c.time();
                            held.entry(t).or_insert(c);
                            rows.entry(t).or_default().push(batch);
                        }
                    }
                });
                placed.for_each(|cap, data| {
                    if let Some(c) = cap.retain_least(0) {
                        let t = *c.time();
                        held.entry(t).or_insert(c);
                        clicks.entry(t).or_default().append(data);
                    }
                });
                // An epoch is replayed once every worker's clicks and rows of it are here.
                while let Some(entry) = held.first_entry() {
                    let t = *entry.key();
                    if batches_frontier.less_equal(&t) || placed_frontier.less_equal(&t) {
                        break;
                    }
                    let cap = entry.remove();
                    let batches = rows.remove(&t).unwrap_or_default();
                    let epoch_clicks = clicks.remove(&t).unwrap_or_default();
                    let out = replay.epoch(t, epoch_clicks, batches, &metrics);
                    output.session(&cap).give_iterator(out.into_iter());
                }
            }
        },
    );
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

/// The restored windows: every worker's popularity clicks, this worker's users' seen clicks.
struct Restored {
    popular: Vec<Click>,
    seen: Vec<Click>,
}

fn restore(state: &SavedState, (index, peers): (usize, usize)) -> Restored {
    let mut restored = Restored {
        popular: Vec::new(),
        seen: Vec::new(),
    };
    for (record, count) in state.records::<WindowClick>(NAME) {
        let click = record.click();
        let into = match record.0 {
            Window::Popular => &mut restored.popular,
            Window::Seen if worker_for_int(click.user, peers) == index => &mut restored.seen,
            Window::Seen => continue,
        };
        into.extend(std::iter::repeat_n(click, count.max(0) as usize));
    }
    restored
}

/// The features one worker keeps and replays clicks into: global popularity, its users' seen
/// items, and the clicks in each window.
struct Replay {
    config: CandidatesConfig,
    index: usize,
    peers: usize,
    counts: HashMap<i64, i64>,
    /// Items by popularity: count descending, then item id.
    ranking: BTreeSet<(Reverse<i64>, i64)>,
    /// This worker's users' items, with how many of their clicks are in the seen-window.
    seen: HashMap<i64, HashMap<i64, u32>>,
    /// Clicks in the bounded windows, oldest event time first.
    popular_open: BinaryHeap<Reverse<(i64, Click)>>,
    seen_open: BinaryHeap<Reverse<(i64, Click)>>,
    /// The largest event time replayed so far.
    watermark: i64,
    schemas: Schemas,
}

impl Replay {
    fn new(config: &CandidatesConfig, (index, peers): (usize, usize)) -> Self {
        Replay {
            config: config.clone(),
            index,
            peers,
            counts: HashMap::new(),
            ranking: BTreeSet::new(),
            seen: HashMap::new(),
            popular_open: BinaryHeap::new(),
            seen_open: BinaryHeap::new(),
            watermark: i64::MIN,
            schemas: Schemas::default(),
        }
    }

    fn owns(&self, user: i64) -> bool {
        worker_for_int(user, self.peers) == self.index
    }

    /// Takes the restored windows in; returns the records this worker checkpoints again.
    fn restore(&mut self, restored: Restored) -> Vec<(String, isize)> {
        let mut announce = Vec::new();
        for c in restored.popular {
            self.watermark = self.watermark.max(c.time);
            self.count(c.item, 1);
            if self.config.window.is_some() {
                self.popular_open.push(Reverse((c.time, c)));
            }
            if self.owns(c.user) {
                announce.push((record(Window::Popular, c), 1));
            }
        }
        for c in restored.seen {
            self.watermark = self.watermark.max(c.time);
            *self
                .seen
                .entry(c.user)
                .or_default()
                .entry(c.item)
                .or_default() += 1;
            if self.config.seen_window.is_some() {
                self.seen_open.push(Reverse((c.time, c)));
            }
            announce.push((record(Window::Seen, c), 1));
        }
        announce
    }

    fn count(&mut self, item: i64, diff: i64) {
        let count = self.counts.entry(item).or_default();
        if *count > 0 {
            self.ranking.remove(&(Reverse(*count), item));
        }
        *count += diff;
        if *count > 0 {
            self.ranking.insert((Reverse(*count), item));
        } else {
            self.counts.remove(&item);
        }
    }

    /// Replays one click: it enters the windows, the watermark moves, older clicks leave. The
    /// window changes of this worker's users go to `state`.
    fn apply(&mut self, c: Click, state: &mut Vec<Out>) {
        let own = self.owns(c.user);
        self.watermark = self.watermark.max(c.time);
        self.count(c.item, 1);
        if own {
            state.push(Out::State(record(Window::Popular, c), 1));
            state.push(Out::State(record(Window::Seen, c), 1));
            *self
                .seen
                .entry(c.user)
                .or_default()
                .entry(c.item)
                .or_default() += 1;
        }
        if let Some(width) = self.config.window {
            self.popular_open.push(Reverse((c.time, c)));
            let cutoff = self.watermark.saturating_sub(width);
            while let Some(old) = pop_through(&mut self.popular_open, cutoff) {
                self.count(old.item, -1);
                if self.owns(old.user) {
                    state.push(Out::State(record(Window::Popular, old), -1));
                }
            }
        }
        if let Some(width) = self.config.seen_window {
            if own {
                self.seen_open.push(Reverse((c.time, c)));
            }
            let cutoff = self.watermark.saturating_sub(width);
            while let Some(old) = pop_through(&mut self.seen_open, cutoff) {
                if let Some(items) = self.seen.get_mut(&old.user) {
                    if let Some(n) = items.get_mut(&old.item) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            items.remove(&old.item);
                        }
                    }
                    if items.is_empty() {
                        self.seen.remove(&old.user);
                    }
                }
                state.push(Out::State(record(Window::Seen, old), -1));
            }
        }
    }

    /// The most popular items `user` has not seen, nor just clicked (`clicked`).
    fn candidates_for(&self, user: i64, clicked: i64) -> impl Iterator<Item = i64> + '_ {
        let seen = self.seen.get(&user);
        self.ranking
            .iter()
            .map(|(_, item)| *item)
            .filter(move |item| *item != clicked && !seen.is_some_and(|s| s.contains_key(item)))
            .take(self.config.max_candidates)
    }

    /// Replays epoch `t`'s clicks (every worker's) in order and answers this worker's `batches`.
    fn epoch(
        &mut self,
        t: Epoch,
        mut clicks: Vec<Placed>,
        batches: Vec<Batch>,
        metrics: &StageMetrics,
    ) -> Vec<Out> {
        let started = Instant::now();
        clicks.sort_unstable();
        let mut parts: Vec<Part> = batches
            .into_iter()
            .map(|b| Part::new(b, &self.config, &mut self.schemas))
            .collect();
        let mut rows_at: HashMap<i64, (usize, usize)> =
            HashMap::with_capacity(parts.iter().map(|p| p.batch.num_rows()).sum());
        for (p, part) in parts.iter().enumerate() {
            if let Some(places) = &part.places {
                rows_at.extend(
                    places
                        .values()
                        .iter()
                        .enumerate()
                        .map(|(r, &at)| (at, (p, r))),
                );
            }
        }
        let mut out = Vec::new();
        for (position, c) in clicks.iter().enumerate() {
            self.apply(c.click(), &mut out);
            let Some(&(p, row)) = rows_at.get(&c.place()) else {
                continue;
            };
            // Unique across workers and restarts (a resumed run starts at a new epoch): the
            // epoch, then the click's place in the epoch's order.
            let event = ((t as i64) << 32) | position as i64;
            if let Some(part) = parts.get_mut(p) {
                if let Some(answers) = part.answers.as_mut() {
                    answers.push(row, event, c.item, self.candidates_for(c.user, c.item));
                }
                if let Some(done) = part.answered.get_mut(row) {
                    *done = true;
                }
            }
        }
        let rows: usize = parts.iter().map(|p| p.batch.num_rows()).sum();
        let elapsed = started.elapsed();
        for part in parts {
            let share = elapsed.mul_f64(part.batch.num_rows() as f64 / rows.max(1) as f64);
            out.extend(
                part.finish(&self.config, t, share, metrics)
                    .into_iter()
                    .map(Out::Rows),
            );
        }
        out
    }
}

/// The oldest click of `open` if its event time is `cutoff` or earlier, taken out.
fn pop_through(open: &mut BinaryHeap<Reverse<(i64, Click)>>, cutoff: i64) -> Option<Click> {
    if open
        .peek()
        .is_some_and(|Reverse((time, _))| *time <= cutoff)
    {
        open.pop().map(|Reverse((_, c))| c)
    } else {
        None
    }
}

/// One of this worker's batches of an epoch, being answered.
struct Part {
    /// The rows as they came in (their place left out).
    batch: Batch,
    places: Option<Int64Array>,
    /// The candidate rows so far, or why the batch cannot be answered.
    answers: Option<AnswerRows>,
    problem: Option<String>,
    answered: Vec<bool>,
}

impl Part {
    fn new(mut batch: Batch, config: &CandidatesConfig, schemas: &mut Schemas) -> Part {
        let rows = batch.num_rows();
        let schema = batch.data.schema();
        let places = schema.index_of(PLACE).ok().and_then(|i| {
            let places = batch
                .data
                .column(i)
                .as_primitive_opt::<Int64Type>()
                .cloned();
            let keep: Vec<usize> = (0..schema.fields().len()).filter(|&c| c != i).collect();
            batch.data = batch.data.project(&keep).ok()?;
            places
        });
        let mut part = Part {
            answers: None,
            problem: None,
            answered: vec![false; rows],
            places: None,
            batch,
        };
        let ready = schemas
            .output(&part.batch.data.schema(), config)
            .and_then(|schema| {
                click_columns(&part.batch.data, config)?;
                Ok(schema)
            });
        match (ready, places) {
            (Ok(schema), Some(places)) => {
                part.places = Some(places);
                part.answers = Some(AnswerRows::new(schema, rows, config.max_candidates));
            }
            (Ok(_), None) => {
                part.problem = Some("the row lost its place in the click order".into());
            }
            (Err(e), _) => part.problem = Some(e.to_string()),
        }
        part
    }

    /// The candidate rows and the dead letters of this batch.
    fn finish(
        self,
        config: &CandidatesConfig,
        epoch: Epoch,
        elapsed: std::time::Duration,
        metrics: &StageMetrics,
    ) -> Vec<Batch> {
        let data = &self.batch.data;
        let mut rejected = Vec::new();
        let mut records = None;
        match (self.answers, self.problem) {
            (Some(answers), None) => {
                if let Ok((users, items, times)) = click_columns(data, config) {
                    for (row, answered) in self.answered.iter().enumerate() {
                        if *answered {
                            continue;
                        }
                        let reason =
                            if users.is_valid(row) && items.is_valid(row) && times.is_valid(row) {
                                "the click was not in its epoch's order".to_string()
                            } else {
                                format!(
                                    "`{}`, `{}` and `{}` must not be null",
                                    config.user, config.item, config.time
                                )
                            };
                        rejected.push(DeadLetter::for_row(NAME, data, row, reason));
                    }
                }
                match answers.finish(data, epoch) {
                    Ok(r) => records = Some(r),
                    Err(e) => {
                        let reason = e.to_string();
                        rejected = (0..data.num_rows())
                            .map(|r| DeadLetter::for_row(NAME, data, r, &reason))
                            .collect();
                    }
                }
            }
            (_, problem) => {
                let reason = problem.unwrap_or_else(|| "no answers".into());
                rejected = (0..data.num_rows())
                    .map(|r| DeadLetter::for_row(NAME, data, r, &reason))
                    .collect();
            }
        }
        let rows_out = records.as_ref().map_or(0, RecordBatch::num_rows);
        metrics.record_batch(data.num_rows(), rows_out, rejected.len(), elapsed);
        let mut out = Vec::with_capacity(2);
        if let Some(records) = records.filter(|r| r.num_rows() > 0) {
            out.push(self.batch.with_data(records));
        }
        if !rejected.is_empty() {
            match dead_letter::to_batch(&rejected) {
                Ok(letters) => out.push(Batch::dead_letters(letters, self.batch.ingest_ns)),
                Err(e) => tracing::error!("candidates: dead letters: {e}"),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
