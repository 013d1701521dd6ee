//! Answering batches from state that a stream of changes keeps, as of the epoch before theirs.

use std::collections::BTreeMap;

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::BatchStream;
use crate::{Batch, BatchKind, Epoch};

/// Batches answered from state built by changes of earlier epochs.
pub trait AnswerFrom<'scope> {
    /// Answers each batch of epoch `t` with `answer(state, batch, t)` once every change of
    /// epochs before `t` is in `state`: the changes' frontier has reached `t` (no change of an
    /// earlier epoch can still arrive) and those changes were applied (`apply`) in epoch order.
    /// So no worker waits on another within an epoch, yet every answer sees all earlier epochs.
    /// Each change carries its own epoch (`(epoch, change)`: differential-dataflow sends
    /// changes of several epochs in one message). Changes of epochs no batch can still need
    /// are applied as the batches' frontier passes them, so they do not pile up. Dead letters
    /// and empty batches pass through.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::operators::AnswerFrom;
    /// use riffle_dataflow::Batch;
    ///
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let answers = seen.clone();
    /// timely::example(move |scope| {
    ///     use timely::dataflow::operators::vec::Input;
    ///     let (mut batches, stream) = scope.new_input::<Batch>();
    ///     let (mut changes, updates) = scope.new_input::<(u64, i64)>();
    ///     // The state is a running total of the changes.
    ///     stream.answer_from(updates, "Total", 0i64, |total, n| *total += n, move |total, batch, _| {
    ///         answers.lock().unwrap().push(*total);
    ///         vec![batch.clone()]
    ///     });
    ///     let rows = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1])) as _)]).unwrap();
    ///     changes.send((0, 5));
    ///     batches.send(Batch::records(rows.clone(), 0));
    ///     changes.advance_to(1);
    ///     batches.advance_to(1);
    ///     changes.send((1, 7));
    ///     batches.send(Batch::records(rows, 0));
    /// });
    /// // Epoch 0's batch saw no earlier change, epoch 1's saw epoch 0's (not its own).
    /// assert_eq!(*seen.lock().unwrap(), vec![0, 5]);
    /// ```
    fn answer_from<C, S, A, F>(
        self,
        changes: StreamVec<'scope, Epoch, (Epoch, C)>,
        name: &str,
        state: S,
        apply: A,
        answer: F,
    ) -> BatchStream<'scope>
    where
        C: Clone + 'static,
        S: 'static,
        A: FnMut(&mut S, C) + 'static,
        F: FnMut(&mut S, &Batch, Epoch) -> Vec<Batch> + 'static;
}

impl<'scope> AnswerFrom<'scope> for BatchStream<'scope> {
    fn answer_from<C, S, A, F>(
        self,
        changes: StreamVec<'scope, Epoch, (Epoch, C)>,
        name: &str,
        state: S,
        mut apply: A,
        mut answer: F,
    ) -> BatchStream<'scope>
    where
        C: Clone + 'static,
        S: 'static,
        A: FnMut(&mut S, C) + 'static,
        F: FnMut(&mut S, &Batch, Epoch) -> Vec<Batch> + 'static,
    {
        self.binary_frontier(changes, Pipeline, Pipeline, name, move |_, _| {
            let mut state = state;
            let mut waiting: BTreeMap<Epoch, Vec<(Capability<Epoch>, Batch)>> = BTreeMap::new();
            let mut pending: BTreeMap<Epoch, Vec<C>> = BTreeMap::new();
            // Applies the pending changes of epochs before `t`.
            let mut apply_before =
                move |state: &mut S, pending: &mut BTreeMap<Epoch, Vec<C>>, t| {
                    while let Some(entry) = pending.first_entry() {
                        if *entry.key() >= t {
                            break;
                        }
                        for change in entry.remove() {
                            apply(state, change);
                        }
                    }
                };
            move |(batches, batches_frontier), (updates, updates_frontier), output| {
                batches.for_each(|cap, data| {
                    for batch in data.drain(..) {
                        if batch.kind != BatchKind::Records || batch.num_rows() == 0 {
                            output.session(&cap).give(batch);
                            continue;
                        }
                        if let Some(held) = cap.retain_least(output.output_index()) {
                            waiting.entry(*held.time()).or_default().push((held, batch));
                        }
                    }
                });
                updates.for_each(|_, data| {
                    for (t, change) in data.drain(..) {
                        pending.entry(t).or_default().push(change);
                    }
                });
                // Batches of epoch t are answered once every change of epochs before t is in.
                while let Some((&t, _)) = waiting.first_key_value() {
                    if updates_frontier.less_than(&t) {
                        break;
                    }
                    apply_before(&mut state, &mut pending, t);
                    for (cap, batch) in waiting.remove(&t).unwrap_or_default() {
                        let out = answer(&mut state, &batch, t);
                        output.session(&cap).give_iterator(out.into_iter());
                    }
                }
                // Changes of epochs no batch can still need go in now.
                let floor = batches_frontier
                    .frontier()
                    .iter()
                    .chain(waiting.keys())
                    .min()
                    .copied();
                match floor {
                    Some(f) => apply_before(&mut state, &mut pending, f),
                    None => pending.clear(),
                }
            }
        })
    }
}
