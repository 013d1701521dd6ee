//! `sliding_window`: records in an event-time window, as differential updates. A record enters
//! in its epoch and leaves in the first epoch whose watermark (the largest event time of all
//! workers' records so far) is `width` or more past it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use crate::Epoch;

/// A record with an event time (seconds, milliseconds: the window's `width` is in the same
/// unit). Records leave the window in event-time order, equal times in record order.
pub trait EventTime: Clone + Ord + 'static {
    fn event_time(&self) -> i64;
}

/// Updates of a windowed collection: the record, the epoch and `+1` or `-1`.
pub type WindowUpdates<'scope, D> = StreamVec<'scope, Epoch, (D, Epoch, isize)>;

/// Window contents to start from (after a restart): the records open at epoch `at`, and the
/// latest event time of all workers then.
#[derive(Clone, Debug)]
pub struct WindowStart<D> {
    pub records: Vec<D>,
    pub watermark: Option<i64>,
    pub at: Epoch,
}

impl<D> Default for WindowStart<D> {
    fn default() -> Self {
        WindowStart {
            records: Vec::new(),
            watermark: None,
            at: 0,
        }
    }
}

/// Extension trait for streams of timed records.
pub trait SlidingWindow<'scope, D>: Sized {
    /// The records as differential updates: `+1` in their epoch, and, when `width` is set, `-1`
    /// in the epoch where `watermarks` (every worker's largest event time per epoch, broadcast)
    /// first reach `time + width`. Without a width the window never closes.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use riffle_dataflow::operators::{EventTime, SlidingWindow};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
    /// struct Click { user: i64, time: i64 }
    /// impl EventTime for Click {
    ///     fn event_time(&self) -> i64 { self.time }
    /// }
    ///
    /// let updates = Arc::new(Mutex::new(Vec::new()));
    /// let seen = updates.clone();
    /// timely::example(move |scope| {
    ///     let clicks = vec![Click { user: 1, time: 0 }, Click { user: 2, time: 100 }]
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>();
    ///     let marks = vec![100i64].to_stream(scope).container::<Vec<_>>();
    ///     clicks.sliding_window(marks, Some(50))
    ///         .inspect(move |(c, t, diff)| seen.lock().unwrap().push((c.user, *t, *diff)));
    /// });
    /// let mut updates = updates.lock().unwrap().clone();
    /// updates.sort();
    /// // The click at t=0 is 100 behind the watermark: in and out again in the same epoch.
    /// assert_eq!(updates, vec![(1, 0, -1), (1, 0, 1), (2, 0, 1)]);
    /// ```
    fn sliding_window(
        self,
        watermarks: StreamVec<'scope, Epoch, i64>,
        width: Option<i64>,
    ) -> WindowUpdates<'scope, D> {
        self.sliding_window_from(watermarks, width, WindowStart::default())
    }

    /// As [`SlidingWindow::sliding_window`], starting with `start`'s records in the window
    /// (inserted at its epoch, which must precede the input's first).
    fn sliding_window_from(
        self,
        watermarks: StreamVec<'scope, Epoch, i64>,
        width: Option<i64>,
        start: WindowStart<D>,
    ) -> WindowUpdates<'scope, D>;
}

impl<'scope, D: EventTime> SlidingWindow<'scope, D> for StreamVec<'scope, Epoch, D> {
    fn sliding_window_from(
        self,
        watermarks: StreamVec<'scope, Epoch, i64>,
        width: Option<i64>,
        restore: WindowStart<D>,
    ) -> WindowUpdates<'scope, D> {
        let Some(width) = width else {
            return self.unary(Pipeline, "Window(all)", move |initial, _| {
                // Operators run once at start: the restored clicks go out then.
                let mut restore = Some((initial, restore));
                move |input, output| {
                    if let Some((cap, restore)) = restore.take() {
                        let at = cap.delayed(&restore.at);
                        output
                            .session(&at)
                            .give_iterator(restore.records.into_iter().map(|r| (r, restore.at, 1)));
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
                let mut arrived: BTreeMap<Epoch, Vec<D>> = BTreeMap::new();
                let mut marks: BTreeMap<Epoch, i64> = BTreeMap::new();
                let mut watermark = restore.watermark.unwrap_or(i64::MIN);
                let mut open: BinaryHeap<Reverse<(i64, D)>> = BinaryHeap::new();
                let mut restore = Some(restore);
                move |(clicks, clicks_frontier), (wm, wm_frontier), output| {
                    if let (Some(restore), Some(held)) = (restore.take(), cap.as_ref()) {
                        let at = held.delayed(&restore.at);
                        let mut session = output.session(&at);
                        for r in restore.records {
                            open.push(Reverse((r.event_time(), r.clone())));
                            session.give((r, restore.at, 1));
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
                        for r in arrived.remove(&t).unwrap_or_default() {
                            open.push(Reverse((r.event_time(), r.clone())));
                            session.give((r, t, 1));
                        }
                        let cutoff = watermark.saturating_sub(width);
                        while open
                            .peek()
                            .is_some_and(|Reverse((time, _))| *time <= cutoff)
                        {
                            if let Some(Reverse((_, r))) = open.pop() {
                                session.give((r, t, -1));
                            }
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
