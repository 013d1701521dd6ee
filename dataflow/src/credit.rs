//! Credit between a worker's source and its first model: the worker reads only as far ahead
//! as the model can take, so records wait in the source's own queue (a camera's, where
//! `drop_oldest` keeps the freshest frames), not inside the dataflow; and the model knows
//! whether more rows are on their way, so it batches only what is coming and runs what is
//! ready the moment it is idle.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use timely::scheduling::Activator;

/// One worker's credit, shared by its read loop and its first batched stage (same thread).
///
/// # Examples
/// ```
/// use riffle_dataflow::credit::Credit;
///
/// let credit = Credit::new(4);
/// credit.sent(3);
/// assert!(credit.available());
/// credit.sent(2);
/// assert!(!credit.available()); // 5 rows in flight: the source waits
/// credit.done(5);
/// assert!(credit.available());
/// credit.set_busy(true);
/// assert!(!credit.available()); // the model runs: reads now would queue behind it
/// ```
#[derive(Clone, Debug)]
pub struct Credit(Rc<State>);

#[derive(Debug)]
struct State {
    limit: usize,
    in_flight: Cell<usize>,
    /// The model is running a group: rows read now would only queue behind it.
    busy: Cell<bool>,
    more_coming: Cell<bool>,
    /// The batched stage to wake when no more rows are coming.
    model: RefCell<Option<Activator>>,
}

impl Credit {
    /// Credit for `limit` rows (at least one) between the source and the model.
    pub fn new(limit: usize) -> Self {
        Credit(Rc::new(State {
            limit: limit.max(1),
            in_flight: Cell::new(0),
            busy: Cell::new(false),
            more_coming: Cell::new(false),
            model: RefCell::new(None),
        }))
    }

    /// The model can take more rows now: fewer than `limit` are in flight, and it is not
    /// running a group (rows read meanwhile would wait behind it, older by the time it is
    /// done than what the source will have then, as a hand-written loop's next read).
    pub fn available(&self) -> bool {
        self.0.in_flight.get() < self.0.limit && !self.0.busy.get()
    }

    /// The model started (`true`) or finished running a group.
    pub fn set_busy(&self, busy: bool) {
        self.0.busy.set(busy);
    }

    pub fn in_flight(&self) -> usize {
        self.0.in_flight.get()
    }

    /// The source sent `rows` into the dataflow.
    pub fn sent(&self, rows: usize) {
        let s = &self.0;
        s.in_flight.set(s.in_flight.get().saturating_add(rows));
    }

    /// For a source ahead of a balanced exchange: the rows waiting at the least loaded of its
    /// models (the balancer's estimate, from the workers' load reports and what it sent since),
    /// so that the source reads only while some model has room, wherever it is.
    pub fn set_queued(&self, rows: usize) {
        self.0.in_flight.set(rows);
    }

    /// The model finished (or dropped) `rows`.
    pub fn done(&self, rows: usize) {
        let s = &self.0;
        s.in_flight.set(s.in_flight.get().saturating_sub(rows));
    }

    /// At most `rows` can still be in flight: the rows of the epochs the sink has not passed.
    /// Rows a stage before the model drops (dead letters, filters) never reach it; this
    /// returns their credit once their epoch is through.
    pub fn bound(&self, rows: usize) {
        let s = &self.0;
        s.in_flight.set(s.in_flight.get().min(rows));
    }

    /// Whether the worker will read again before the model next runs: only then is a
    /// partial batch worth waiting for. Turning false wakes the model.
    pub fn set_more_coming(&self, more: bool) {
        let was = self.0.more_coming.replace(more);
        if was && !more {
            if let Some(a) = self.0.model.borrow().as_ref() {
                a.activate();
            }
        }
    }

    pub fn more_coming(&self) -> bool {
        self.0.more_coming.get()
    }

    /// The batched stage this credit feeds, woken when no more rows are coming.
    pub fn attach(&self, model: Activator) {
        *self.0.model.borrow_mut() = Some(model);
    }
}
