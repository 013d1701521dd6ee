//! Applying the value in force at each batch's epoch, from a schedule of switches.

use std::collections::BTreeMap;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::BatchStream;
use crate::{Batch, BatchKind, Epoch};

/// Batches by a schedule of switches.
pub trait BySchedule<'scope> {
    /// Hands each batch of epoch `e` to `apply` with the value in force at `e` (the latest
    /// switch at or before it; `None` before the first), once no switch for `e` can still
    /// arrive: `switches`' frontier has passed `e` (with [`Announce`](super::Announce)'s
    /// lookahead, almost always at once). `schedule` holds the switches known at the start
    /// (restored from a checkpoint). Dead letters pass through untouched.
    ///
    /// # Examples
    /// ```
    /// use std::collections::BTreeMap;
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::operators::BySchedule;
    /// use riffle_dataflow::Batch;
    /// use timely::dataflow::operators::ToStream;
    ///
    /// let applied = Arc::new(Mutex::new(Vec::new()));
    /// let seen = applied.clone();
    /// timely::example(move |scope| {
    ///     use timely::dataflow::operators::vec::Input;
    ///     let (mut input, batches) = scope.new_input();
    ///     // Value 10 from epoch 0, 20 from epoch 3.
    ///     let switches = vec![(0u64, 10u64), (3, 20)].to_stream(scope).container::<Vec<_>>();
    ///     batches.by_schedule(switches, BTreeMap::new(), "tag", move |batch: Batch, v: Option<&u64>| {
    ///         seen.lock().unwrap().push(v.copied());
    ///         batch
    ///     });
    ///     let rows = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1])) as _)]).unwrap();
    ///     input.send(Batch::records(rows.clone(), 0));
    ///     input.advance_to(5);
    ///     input.send(Batch::records(rows, 0));
    /// });
    /// assert_eq!(*applied.lock().unwrap(), vec![Some(10), Some(20)]);
    /// ```
    fn by_schedule<V, F>(
        self,
        switches: StreamVec<'scope, Epoch, (Epoch, V)>,
        schedule: BTreeMap<Epoch, V>,
        name: &str,
        apply: F,
    ) -> BatchStream<'scope>
    where
        V: Clone + 'static,
        F: FnMut(Batch, Option<&V>) -> Batch + 'static;
}

impl<'scope> BySchedule<'scope> for BatchStream<'scope> {
    fn by_schedule<V, F>(
        self,
        switches: StreamVec<'scope, Epoch, (Epoch, V)>,
        schedule: BTreeMap<Epoch, V>,
        name: &str,
        mut apply: F,
    ) -> BatchStream<'scope>
    where
        V: Clone + 'static,
        F: FnMut(Batch, Option<&V>) -> Batch + 'static,
    {
        self.binary_frontier::<_, CapacityContainerBuilder<Vec<Batch>>, _, _, _, _>(
            switches,
            Pipeline,
            Pipeline,
            name,
            move |_, _| {
                let mut schedule = schedule;
                let mut waiting: BTreeMap<Epoch, Vec<(Capability<Epoch>, Batch)>> = BTreeMap::new();
                move |(data, _), (switches, switch_frontier), output| {
                    switches.for_each(|_, items| {
                        for (e, v) in items.drain(..) {
                            schedule.insert(e, v);
                        }
                    });
                    data.for_each(|cap, batches| {
                        for batch in batches.drain(..) {
                            if batch.kind != BatchKind::Records {
                                output.session(&cap).give(batch);
                            } else if let Some(held) = cap.retain_least(0) {
                                waiting.entry(*held.time()).or_default().push((held, batch));
                            }
                        }
                    });
                    while let Some(entry) = waiting.first_entry() {
                        let epoch = *entry.key();
                        if switch_frontier.less_equal(&epoch) {
                            break;
                        }
                        let value = schedule.range(..=epoch).next_back().map(|(_, v)| v);
                        for (cap, batch) in entry.remove() {
                            output.session(&cap).give(apply(batch, value));
                        }
                    }
                }
            },
        )
    }
}
