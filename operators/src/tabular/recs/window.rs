//! Sliding event-time window: clicks enter a differential collection in their epoch and leave it
//! in the first epoch whose watermark (the largest event time of all workers' clicks so far) is
//! `width` or more past them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use riffle_dataflow::Epoch;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::Click;

/// Updates of a windowed collection of clicks.
pub type WindowUpdates<'scope> = StreamVec<'scope, Epoch, (Click, Epoch, isize)>;

/// Window contents to start from (after a restart): the clicks open at epoch `at`, and the
/// latest event time of all workers then.
#[derive(Clone, Debug, Default)]
pub struct Restore {
    pub clicks: Vec<Click>,
    pub watermark: Option<i64>,
    pub at: Epoch,
}

/// Extension trait for click streams.
pub trait SlidingWindow<'scope>: Sized {
    /// The clicks as differential updates: `+1` in their epoch, and, when `width` is set, `-1` in
    /// the epoch where `watermarks` (every worker's largest event time per epoch, broadcast)
    /// first reach `time + width`. Without a width the window never closes.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use riffle_operators::tabular::recs::{Click, SlidingWindow};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let updates = Arc::new(Mutex::new(Vec::new()));
    /// let seen = updates.clone();
    /// timely::example(move |scope| {
    ///     let clicks = vec![Click { user: 1, item: 7, time: 0 }, Click { user: 2, item: 8, time: 100 }]
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>();
    ///     let marks = vec![100i64].to_stream(scope).container::<Vec<_>>();
    ///     clicks.sliding_window(marks, Some(50))
    ///         .inspect(move |(c, t, diff)| seen.lock().unwrap().push(((c.user, c.item), *t, *diff)));
    /// });
    /// let mut updates = updates.lock().unwrap().clone();
    /// updates.sort();
    /// // The click at t=0 is 100 behind the watermark: in and out again in the same epoch.
    /// assert_eq!(updates, vec![((1, 7), 0, -1), ((1, 7), 0, 1), ((2, 8), 0, 1)]);
    /// ```
    fn sliding_window(
        self,
        watermarks: StreamVec<'scope, Epoch, i64>,
        width: Option<i64>,
    ) -> WindowUpdates<'scope> {
        self.sliding_window_from(watermarks, width, Restore::default())
    }

    /// As [`SlidingWindow::sliding_window`], starting with `restore`'s clicks in the window
    /// (inserted at its epoch, which must precede the input's first).
    fn sliding_window_from(
        self,
        watermarks: StreamVec<'scope, Epoch, i64>,
        width: Option<i64>,
        restore: Restore,
    ) -> WindowUpdates<'scope>;
}

impl<'scope> SlidingWindow<'scope> for StreamVec<'scope, Epoch, Click> {
    fn sliding_window_from(
        self,
        watermarks: StreamVec<'scope, Epoch, i64>,
        width: Option<i64>,
        restore: Restore,
    ) -> WindowUpdates<'scope> {
        let Some(width) = width else {
            return self.unary(Pipeline, "Window(all)", move |initial, _| {
                // Operators run once at start: the restored clicks go out then.
                let mut restore = Some((initial, restore));
                move |input, output| {
                    if let Some((cap, restore)) = restore.take() {
                        let at = cap.delayed(&restore.at);
                        output
                            .session(&at)
                            .give_iterator(restore.clicks.into_iter().map(|c| (c, restore.at, 1)));
                    }
                    input.for_each(|cap, data| {
                        let Some(&t) = cap.least() else {
                            return;
                        };
                        output
                            .session(&cap)
                            .give_iterator(data.drain(..).map(|c| (c, t, 1)));
                    });
                }
            });
        };
        self.binary_frontier(
            watermarks,
            Pipeline,
            Pipeline,
            "Window",
            move |initial, _| {
                // Retractions can be due in any epoch not yet complete, with or without local
                // clicks in it, so one capability tracks the inputs' frontier.
                let mut cap: Option<Capability<Epoch>> = Some(initial);
                let mut arrived: BTreeMap<Epoch, Vec<Click>> = BTreeMap::new();
                let mut marks: BTreeMap<Epoch, i64> = BTreeMap::new();
                let mut watermark = restore.watermark.unwrap_or(i64::MIN);
                let mut open: BinaryHeap<Reverse<(i64, i64, i64)>> = BinaryHeap::new();
                let mut restore = Some(restore);
                move |(clicks, clicks_frontier), (wm, wm_frontier), output| {
                    if let (Some(restore), Some(held)) = (restore.take(), cap.as_ref()) {
                        let at = held.delayed(&restore.at);
                        let mut session = output.session(&at);
                        for c in restore.clicks {
                            session.give((c, restore.at, 1));
                            open.push(Reverse((c.time, c.user, c.item)));
                        }
                    }
                    clicks.for_each(|c, data| {
                        if let Some(&t) = c.least() {
                            arrived.entry(t).or_default().append(data);
                        }
                    });
                    wm.for_each(|c, data| {
                        let Some(&t) = c.least() else {
                            return;
                        };
                        let m = marks.entry(t).or_insert(i64::MIN);
                        *m = data.iter().copied().fold(*m, i64::max);
                    });
                    let bound = clicks_frontier
                        .frontier()
                        .iter()
                        .chain(wm_frontier.frontier().iter())
                        .min()
                        .copied();
                    let complete = |t: &Epoch| bound.is_none_or(|b| *t < b);
                    let Some(held) = cap.as_mut() else {
                        return;
                    };
                    loop {
                        let next = arrived
                            .keys()
                            .next()
                            .into_iter()
                            .chain(marks.keys().next())
                            .min()
                            .copied();
                        let Some(t) = next.filter(complete) else {
                            break;
                        };
                        let at = held.delayed(&t);
                        let mut session = output.session(&at);
                        if let Some(m) = marks.remove(&t) {
                            watermark = watermark.max(m);
                        }
                        for c in arrived.remove(&t).unwrap_or_default() {
                            session.give((c, t, 1));
                            open.push(Reverse((c.time, c.user, c.item)));
                        }
                        let cutoff = watermark.saturating_sub(width);
                        while let Some(Reverse((time, user, item))) = open.peek().copied() {
                            if time > cutoff {
                                break;
                            }
                            open.pop();
                            session.give((Click { user, item, time }, t, -1));
                        }
                    }
                    match bound {
                        Some(b) => held.downgrade(&b.max(*held.time())),
                        None => cap = None,
                    }
                }
            },
        )
    }
}
