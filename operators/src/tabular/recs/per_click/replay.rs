//! The features one worker keeps, and the replay of an epoch's clicks through them.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::Instant;

use foldhash::{HashMap, HashMapExt};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::worker_for_int;
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{Batch, Epoch};

use super::part::Part;
use super::{Out, Placed};
use crate::tabular::recs::answer_rows::Schemas;
use crate::tabular::recs::checkpoint::{record, Window, WindowClick};
use crate::tabular::recs::{CandidatesConfig, Click, NAME};

/// The restored windows: every worker's popularity clicks, this worker's users' seen clicks.
pub(super) struct Restored {
    popular: Vec<Click>,
    seen: Vec<Click>,
}

pub(super) fn restore(state: &SavedState, (index, peers): (usize, usize)) -> Restored {
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
pub(super) struct Replay {
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
    pub(super) fn new(config: &CandidatesConfig, (index, peers): (usize, usize)) -> Self {
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

    pub(super) fn owns(&self, user: i64) -> bool {
        worker_for_int(user, self.peers) == self.index
    }

    /// Takes the restored windows in; returns the records this worker checkpoints again.
    pub(super) fn restore(&mut self, restored: Restored) -> Vec<(String, isize)> {
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
    pub(super) fn apply(&mut self, c: Click, state: &mut Vec<Out>) {
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
    pub(super) fn candidates_for(&self, user: i64, clicked: i64) -> impl Iterator<Item = i64> + '_ {
        let seen = self.seen.get(&user);
        self.ranking
            .iter()
            .map(|(_, item)| *item)
            .filter(move |item| *item != clicked && !seen.is_some_and(|s| s.contains_key(item)))
            .take(self.config.max_candidates)
    }

    /// Replays epoch `t`'s clicks (every worker's) in order and answers this worker's `batches`.
    pub(super) fn epoch(
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
