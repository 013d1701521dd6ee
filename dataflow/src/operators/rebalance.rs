use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use super::BatchStream;

/// Spreads batches evenly over all workers, whatever worker produced them.
pub trait Rebalance<'scope> {
    /// Deals whole batches round-robin to every worker of every process (Flink's
    /// `rebalance`), for sources whose partitions are skewed. Order across batches is not kept.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::Batch;
    /// use riffle_dataflow::operators::Rebalance;
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let rows = Arc::new(Mutex::new(0));
    /// let seen = rows.clone();
    /// timely::example(move |scope| {
    ///     let one = |v| Batch::records(RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![v])) as _)]).unwrap(), 0);
    ///     (0..4).map(one)
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .rebalance()
    ///         .inspect(move |b: &Batch| *seen.lock().unwrap() += b.num_rows());
    /// });
    /// assert_eq!(*rows.lock().unwrap(), 4);
    /// ```
    fn rebalance(self) -> Self;
}

impl<'scope> Rebalance<'scope> for BatchStream<'scope> {
    fn rebalance(self) -> Self {
        let peers = self.scope().peers() as u64;
        // Start each worker at its own index so that workers do not all aim at worker 0 first.
        let mut next = self.scope().index() as u64;
        let dealt = self.unary(Pipeline, "DealRoundRobin", move |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    let mut session = output.session(&cap);
                    for mut batch in data.drain(..) {
                        batch.route = next % peers.max(1);
                        next = next.wrapping_add(1);
                        session.give(batch);
                    }
                });
            }
        });
        super::to_routes(dealt, "Rebalance")
    }
}
