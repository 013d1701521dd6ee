use std::collections::HashMap;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::OutputBuilder;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;
use timely::progress::operate::FrontierInterest;
use timely::progress::Antichain;

use super::exchange_by_key::{give_parts, route_by};
use super::BatchStream;
use crate::credit::Credit;
use crate::{Batch, BatchKind, Epoch};

/// Load reports, broadcast to every balancer: (worker, its measured service time per row in
/// ns, the rows waiting there).
pub type DelayReports<'scope> = StreamVec<'scope, Epoch, (usize, f64, u64)>;

/// A worker's load, shared by its balanced stages (which time their work), the balancer's
/// receiving side (which counts arrivals) and the reporter, all on the worker's thread.
#[derive(Debug, Default)]
pub struct Service {
    pub arrived_rows: u64,
    pub done_rows: u64,
    pub busy_ns: u64,
    pub busy_rows: u64,
}

/// See [`Service`].
pub type ServiceCell = std::sync::Arc<std::sync::Mutex<Service>>;

/// The load behind `cell` (a poisoned lock only means a panic elsewhere; the counts stand).
pub fn service(cell: &ServiceCell) -> std::sync::MutexGuard<'_, Service> {
    cell.lock().unwrap_or_else(|p| p.into_inner())
}

/// Routes work to the workers that are keeping up, instead of by hash.
pub trait Balance<'scope> {
    /// Sends each batch (or, with `ordered_by`, each key's rows) to the one of `workers`
    /// (empty: all) where it would wait least: (rows queued there + its rows) × that worker's
    /// service time per row, from `reports` (see [`Balance::report_delays`]) plus what this
    /// balancer sent since. With `ordered_by`, all rows of one key within an epoch go to one
    /// worker, so they stay in order (the sink writes epochs in order). Arrivals are counted
    /// in `service`. With `credit` (the source's, on this worker), the rows waiting at the least
    /// loaded target are kept in it, so the source reads only while some model has room:
    /// frames wait in the camera's queue, where the freshest are kept, not at a busy model.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::Batch;
    /// use riffle_dataflow::operators::Balance;
    /// use timely::dataflow::operators::{ConnectLoop, Feedback, Inspect, ToStream};
    ///
    /// let rows = Arc::new(Mutex::new(0));
    /// let seen = rows.clone();
    /// timely::example(move |scope| {
    ///     let one = |v| Batch::records(RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![v])) as _)]).unwrap(), 0);
    ///     let (handle, reports) = scope.feedback(1);
    ///     let service = riffle_dataflow::operators::ServiceCell::default();
    ///     let balanced = (0..8).map(one)
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .balance(&[], None, reports, service.clone(), None);
    ///     balanced.clone().report_delays(service).connect_loop(handle);
    ///     balanced.inspect(move |b: &Batch| *seen.lock().unwrap() += b.num_rows());
    /// });
    /// assert_eq!(*rows.lock().unwrap(), 8);
    /// ```
    fn balance(
        self,
        workers: &[usize],
        ordered_by: Option<String>,
        reports: DelayReports<'scope>,
        service: ServiceCell,
        credit: Option<Credit>,
    ) -> Self;

    /// This worker's load (from `service`) as batches leave the balanced stages, broadcast,
    /// for the feedback loop into [`Balance::balance`].
    fn report_delays(self, service: ServiceCell) -> DelayReports<'scope>;
}

/// Least expected delay: per target, the service time per row and the rows queued there.
struct LeastDelay {
    targets: Vec<usize>,
    /// Service time per row in ns (exponentially weighted), none before a report.
    ns_per_row: Vec<Option<f64>>,
    /// Rows queued at the last report, and rows this balancer sent since.
    backlog: Vec<u64>,
    sent: Vec<u64>,
    /// This balancer's own worker, as a position in `targets`: it wins ties, so that balancers
    /// that all see the same (equal) loads keep their batches instead of all sending them to
    /// one worker at once (paced cameras are due at the same instants on every worker).
    home: Option<usize>,
    /// Rotates the other ties (e.g. before any report).
    turn: usize,
}

impl LeastDelay {
    fn new(targets: Vec<usize>, me: usize) -> Self {
        let n = targets.len();
        LeastDelay {
            home: targets.iter().position(|t| *t == me),
            targets,
            ns_per_row: vec![None; n],
            backlog: vec![0; n],
            sent: vec![0; n],
            turn: me,
        }
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`i` is a position in `targets`, and the per-target vectors have its length"
    )]
    fn report(&mut self, worker: usize, ns_per_row: f64, backlog: u64) {
        if let Some(i) = self.targets.iter().position(|t| *t == worker) {
            let s = &mut self.ns_per_row[i];
            *s = Some(s.map_or(ns_per_row, |old| 0.7 * old + 0.3 * ns_per_row));
            self.backlog[i] = backlog;
            self.sent[i] = 0;
        }
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`i` and `best.1` are positions in `targets`, and the per-target vectors have its length"
    )]
    fn pick(&mut self, rows: u64) -> usize {
        // Unmeasured workers count as the fastest measured one, so they get tried.
        let fastest = self
            .ns_per_row
            .iter()
            .flatten()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let fastest = if fastest.is_finite() { fastest } else { 1.0 };
        let n = self.targets.len();
        self.turn = self.turn.wrapping_add(1);
        let delay = |i: usize| {
            let queued = (self.backlog[i] + self.sent[i] + rows) as f64;
            queued * self.ns_per_row[i].unwrap_or(fastest)
        };
        // An idle home keeps the batch: moving it gains at most the difference in speed, and
        // risks landing on a worker that is about to get its own (a stale speed estimate
        // would send every idle balancer's batches to the one that looked fastest).
        if let Some(h) = self.home.filter(|h| self.backlog[*h] + self.sent[*h] == 0) {
            self.sent[h] += rows;
            return self.targets[h];
        }
        // Home first; only a strictly smaller delay elsewhere moves the batch.
        let mut best = self.home.map_or((f64::INFINITY, 0), |h| (delay(h), h));
        for k in 0..n {
            let i = (self.turn + k) % n;
            if Some(i) == self.home {
                continue;
            }
            let d = delay(i);
            if d < best.0 {
                best = (d, i);
            }
        }
        self.sent[best.1] += rows;
        self.targets[best.1]
    }

    /// Rows waiting at the least loaded target: queued at its last report plus sent since.
    fn least_queued(&self) -> u64 {
        self.backlog
            .iter()
            .zip(&self.sent)
            .map(|(b, s)| b + s)
            .min()
            .unwrap_or(0)
    }
}

impl<'scope> Balance<'scope> for BatchStream<'scope> {
    fn balance(
        self,
        workers: &[usize],
        ordered_by: Option<String>,
        reports: DelayReports<'scope>,
        cell: ServiceCell,
        credit: Option<Credit>,
    ) -> Self {
        let peers = self.scope().peers();
        let me = self.scope().index();
        let targets: Vec<usize> = if workers.is_empty() {
            (0..peers).collect()
        } else {
            workers.to_vec()
        };
        let mut least = LeastDelay::new(targets, me);
        // With `ordered_by`: this epoch's key → worker.
        let mut sticky: (Option<Epoch>, HashMap<u64, usize>) = (None, HashMap::new());
        // The reports only steer routing: the reports input is connected to no output, so
        // a batch's epoch never waits on the load loop. Connected (as `binary` would make
        // it), each epoch could close only once every worker had reported the one before,
        // through a broadcast and the feedback: a progress round trip per epoch that, on a
        // busy host, held committed results back for hundreds of ms.
        let mut builder = OperatorBuilder::new("Balance".to_owned(), self.scope());
        let mut input = builder.new_input_connection(self, Pipeline, []);
        let mut delays = builder.new_input_connection(reports, Pipeline, []);
        let (output, balanced) =
            builder.new_output_connection([(0, Antichain::from_elem(Default::default()))]);
        let mut output = OutputBuilder::<_, CapacityContainerBuilder<Vec<Batch>>>::from(output);
        builder.set_notify_for(0, FrontierInterest::Never);
        builder.set_notify_for(1, FrontierInterest::Never);
        builder.build(move |_initial| {
            move |_frontiers| {
                let mut output = output.activate();
                delays.for_each(|_, data| {
                    for (worker, ns_per_row, backlog) in data.drain(..) {
                        least.report(worker, ns_per_row, backlog);
                    }
                });
                input.for_each(|cap, data| {
                    let Some(&epoch) = cap.least() else {
                        return;
                    };
                    let mut session = output.session(&cap);
                    for mut batch in data.drain(..) {
                        if batch.kind != BatchKind::Records {
                            batch.route = me as u64;
                            session.give(batch);
                            continue;
                        }
                        let Some(column) = ordered_by.as_deref() else {
                            batch.route = least.pick(batch.num_rows() as u64) as u64;
                            session.give(batch);
                            continue;
                        };
                        if sticky.0 != Some(epoch) {
                            sticky = (Some(epoch), HashMap::new());
                        }
                        let rows = batch.num_rows() as u64;
                        let parts = route_by(&batch.data, column, &mut |key| {
                            Ok(*sticky.1.entry(key).or_insert_with(|| least.pick(rows)))
                        });
                        let what = format!("balance by `{column}`");
                        give_parts(batch, parts, me as u64, &what, &mut |b| session.give(b));
                    }
                });
                if let Some(c) = &credit {
                    c.set_queued(usize::try_from(least.least_queued()).unwrap_or(usize::MAX));
                }
            }
        });
        balanced.unary(
            Exchange::new(|b: &Batch| b.route),
            "Balanced",
            move |_, _| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        service(&cell).arrived_rows += record_rows(data);
                        output.session(&cap).give_container(data);
                    });
                }
            },
        )
    }

    fn report_delays(self, cell: ServiceCell) -> DelayReports<'scope> {
        use timely::dataflow::operators::vec::Broadcast;
        let me = self.scope().index();
        self.unary(Pipeline, "ReportLoad", move |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    let mut s = service(&cell);
                    s.done_rows += record_rows(data);
                    if s.busy_rows == 0 {
                        return;
                    }
                    let ns_per_row = s.busy_ns as f64 / s.busy_rows as f64;
                    let backlog = s.arrived_rows.saturating_sub(s.done_rows);
                    (s.busy_ns, s.busy_rows) = (0, 0);
                    output.session(&cap).give((me, ns_per_row, backlog));
                });
            }
        })
        .broadcast()
    }
}

/// Rows of result records (not dead letters) in `batches`.
fn record_rows(batches: &[Batch]) -> u64 {
    batches
        .iter()
        .filter(|b| b.kind == BatchKind::Records)
        .map(|b| b.num_rows() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::LeastDelay;

    #[test]
    fn an_epoch_closes_without_waiting_for_load_reports() {
        use super::{Balance, ServiceCell};
        use crate::{Batch, Epoch};
        use arrow_array::{Int64Array, RecordBatch};
        use std::sync::Arc;
        use timely::container::CapacityContainerBuilder;
        use timely::dataflow::operators::{Input, Probe};
        use timely::dataflow::InputHandle;

        timely::execute_directly(|worker| {
            let mut data: InputHandle<Epoch, CapacityContainerBuilder<Vec<Batch>>> =
                InputHandle::new();
            // Reports stay at epoch 0 for the whole test: a stalled load loop.
            type Reports = CapacityContainerBuilder<Vec<(usize, f64, u64)>>;
            let mut reports: InputHandle<Epoch, Reports> = InputHandle::new();
            let probe = worker.dataflow::<Epoch, _, _>(|scope| {
                let stream = scope.input_from(&mut data).container::<Vec<Batch>>();
                let reports = scope.input_from(&mut reports).container::<Vec<_>>();
                stream
                    .balance(&[], None, reports, ServiceCell::default(), None)
                    .probe()
                    .0
            });
            for epoch in 0..5 {
                let rows = Int64Array::from(vec![epoch as i64]);
                let batch = RecordBatch::try_from_iter([("x", Arc::new(rows) as _)]).unwrap();
                data.send(Batch::records(batch, epoch));
                data.advance_to(epoch + 1);
            }
            for _ in 0..50 {
                worker.step();
            }
            assert!(
                !probe.less_than(&5),
                "epochs 0..5 stayed open, waiting on load reports"
            );
            assert!(reports.time() == &0);
        });
    }

    #[test]
    fn a_slow_worker_gets_a_smaller_share() {
        let mut l = LeastDelay::new(vec![0, 1], 0);
        let first: Vec<usize> = (0..4).map(|_| l.pick(4)).collect();
        assert_eq!(
            first.iter().filter(|p| **p == 0).count(),
            2,
            "even before reports"
        );
        // Worker 1 takes 4× as long per row: it gets about 1 batch in 5.
        l.report(0, 1_000.0, 0);
        l.report(1, 4_000.0, 0);
        let picks: Vec<usize> = (0..100).map(|_| l.pick(4)).collect();
        let to_slow = picks.iter().filter(|p| **p == 1).count();
        assert!((15..=25).contains(&to_slow), "{to_slow}");
    }

    #[test]
    fn equal_loads_keep_the_batch_home() {
        // Two balancers (workers 0 and 1) see the same idle cluster at the same instant:
        // each keeps its own batch instead of both picking one worker.
        let mut on_0 = LeastDelay::new(vec![0, 1], 0);
        let mut on_1 = LeastDelay::new(vec![0, 1], 1);
        for l in [&mut on_0, &mut on_1] {
            l.report(0, 1_000.0, 0);
            l.report(1, 1_000.0, 0);
        }
        for _ in 0..5 {
            assert_eq!((on_0.pick(1), on_1.pick(1)), (0, 1));
            on_0.report(0, 1_000.0, 0);
            on_1.report(1, 1_000.0, 0);
        }
        // A second batch before the first is done goes to the idle worker.
        assert_eq!(on_0.pick(1), 0);
        assert_eq!(on_0.pick(1), 1);
    }

    #[test]
    fn an_idle_home_keeps_its_batch_beside_a_faster_worker() {
        let mut l = LeastDelay::new(vec![0, 1], 1);
        l.report(0, 1_000.0, 0);
        l.report(1, 1_300.0, 0);
        assert_eq!(l.pick(1), 1);
        // Once home has a queue, the faster idle worker gets the next one.
        assert_eq!(l.pick(1), 0);
    }

    #[test]
    fn the_least_queued_target_is_what_a_source_may_read_for() {
        let mut l = LeastDelay::new(vec![0, 1], 0);
        assert_eq!(l.least_queued(), 0);
        l.pick(1);
        assert_eq!(l.least_queued(), 0, "worker 1 is still idle");
        l.pick(1);
        assert_eq!(
            l.least_queued(),
            1,
            "a frame at each model: none has room for one more"
        );
        l.report(1, 1_000.0, 0);
        assert_eq!(l.least_queued(), 0, "worker 1 is done: room again");
        l.report(0, 1_000.0, 3);
        l.report(1, 1_000.0, 2);
        assert_eq!(l.least_queued(), 2);
    }

    #[test]
    fn a_backlog_steers_work_away() {
        let mut l = LeastDelay::new(vec![0, 1], 0);
        l.report(0, 1_000.0, 100);
        l.report(1, 1_000.0, 0);
        assert_eq!(l.pick(4), 1);
    }
}
