use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use super::BatchStream;
use crate::BatchKind;

/// Moves work onto chosen workers: the stages after it run only there (a model part on the
/// workers with a GPU, the next part on others).
pub trait Place<'scope> {
    /// Deals whole batches round-robin to `workers` (global worker indices; empty: all of
    /// them). Dead letters stay where they are. Every worker starts at its own offset in the
    /// list so that they do not all aim at the same worker first.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::Batch;
    /// use riffle_dataflow::operators::Place;
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let workers = Arc::new(Mutex::new(Vec::new()));
    /// let seen = workers.clone();
    /// timely::execute(timely::Config::process(2), move |worker| {
    ///     let index = worker.index();
    ///     let seen = seen.clone();
    ///     worker.dataflow::<u64, _, _>(|scope| {
    ///         let one = |v| Batch::records(RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![v])) as _)]).unwrap(), 0);
    ///         (0..3).map(one)
    ///             .to_stream(scope)
    ///             .container::<Vec<_>>()
    ///             .place(&[1])
    ///             .inspect(move |_b: &Batch| seen.lock().unwrap().push(index));
    ///     });
    /// }).unwrap();
    /// // Both workers' batches ran on worker 1.
    /// assert_eq!(*workers.lock().unwrap(), vec![1; 6]);
    /// ```
    fn place(self, workers: &[usize]) -> Self;
}

impl<'scope> Place<'scope> for BatchStream<'scope> {
    #[allow(
        clippy::indexing_slicing,
        reason = "indexed modulo the length of `targets`: the given workers, or all peers (at least one)"
    )]
    fn place(self, workers: &[usize]) -> Self {
        let peers = self.scope().peers();
        let me = self.scope().index();
        let targets: Vec<u64> = if workers.is_empty() {
            (0..peers as u64).collect()
        } else {
            workers.iter().map(|w| *w as u64).collect()
        };
        let mut next = me;
        let routed = self.unary(Pipeline, "Deal", move |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    let mut session = output.session(&cap);
                    for mut batch in data.drain(..) {
                        batch.route = if batch.kind != BatchKind::Records {
                            me as u64
                        } else {
                            next = next.wrapping_add(1);
                            targets[next % targets.len()]
                        };
                        session.give(batch);
                    }
                });
            }
        });
        super::to_routes(routed, "Place")
    }
}
