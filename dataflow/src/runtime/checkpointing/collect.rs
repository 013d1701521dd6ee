//! What the checkpointer gathers on worker 0: every worker's source positions by epoch, and
//! stateful stages' state updates.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Concatenate, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle, Scope};

use super::{Offsets, OPERATOR_PREFIX};
use crate::runtime::chain::StepState;
use crate::state::Envelope;
use crate::{DataflowError, DataflowResult, Epoch};

/// Epoch → (stage, record, diff).
type StateByEpoch = BTreeMap<Epoch, Vec<(String, String, isize)>>;

/// Stateful stages' state updates, gathered on worker 0 and consolidated as epochs complete.
pub struct OperatorState {
    pub probe: ProbeHandle<Epoch>,
    /// Epoch → (stage, record, diff), filled on worker 0.
    received: Rc<RefCell<StateByEpoch>>,
    /// Stage → record → count, for the epochs folded in so far.
    current: BTreeMap<String, HashMap<String, isize>>,
    /// Stage → its records' kind.
    kinds: BTreeMap<String, &'static str>,
}

impl OperatorState {
    /// Gathers `streams` on worker 0.
    pub fn build<'scope>(
        scope: Scope<'scope, Epoch>,
        streams: Vec<StepState<'scope>>,
    ) -> OperatorState {
        let received: Rc<RefCell<StateByEpoch>> = Rc::default();
        let sink = received.clone();
        let kinds = streams
            .iter()
            .map(|(name, kind, _)| (name.clone(), *kind))
            .collect();
        let tagged = streams.into_iter().map(|(name, _, updates)| {
            updates.map(move |(record, diff)| (name.clone(), record, diff))
        });
        let (probe, _) = scope
            .concatenate(tagged)
            .unary_frontier::<CapacityContainerBuilder<Vec<()>>, _, _, _>(
                Exchange::new(|_: &(String, String, isize)| 0),
                "CollectState",
                move |_, _| {
                    move |(input, _), _| {
                        input.for_each(|cap, data| {
                            if let Some(epoch) = cap.least().copied() {
                                sink.borrow_mut().entry(epoch).or_default().append(data);
                            }
                        });
                    }
                },
            )
            .probe();
        OperatorState {
            probe,
            received,
            current: BTreeMap::new(),
            kinds,
        }
    }

    /// Folds the updates of epochs ≤ `epoch` into the current state.
    pub(super) fn fold_through(&mut self, epoch: Epoch) {
        let mut received = self.received.borrow_mut();
        while let Some(entry) = received.first_entry() {
            if *entry.key() > epoch {
                break;
            }
            for (stage, record, diff) in entry.remove() {
                let records = self.current.entry(stage).or_default();
                match records.get_mut(&record) {
                    Some(count) => {
                        *count += diff;
                        if *count == 0 {
                            records.remove(&record);
                        }
                    }
                    None => {
                        records.insert(record, diff);
                    }
                }
            }
        }
    }

    /// The state map entries for a checkpoint: each stage's records in the versioned envelope
    /// ([`crate::state::Envelope`]).
    pub(super) fn serialise(&self) -> DataflowResult<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (stage, records) in &self.current {
            let kind = self.kinds.get(stage).copied().unwrap_or_default();
            let records = records.iter().map(|(r, n)| (r.as_str(), *n));
            let text = Envelope::new(kind, records)
                .and_then(|e| e.to_text())
                .map_err(|e| DataflowError::Config(format!("the state of `{stage}`: {e}")))?;
            out.insert(format!("{OPERATOR_PREFIX}{stage}"), text);
        }
        Ok(out)
    }
}

/// The positions side of the dataflow, per worker.
pub struct Positions {
    pub input: InputHandle<Epoch, CapacityContainerBuilder<Vec<(i32, i64)>>>,
    pub probe: ProbeHandle<Epoch>,
    /// Epoch → partition → next offset, filled on worker 0.
    pub(super) received: Rc<RefCell<BTreeMap<Epoch, Offsets>>>,
}

impl Positions {
    /// Builds the positions stream in `scope`, gathered on worker 0.
    pub fn build(scope: Scope<'_, Epoch>) -> Positions {
        let mut input = InputHandle::new();
        let received: Rc<RefCell<BTreeMap<Epoch, Offsets>>> = Rc::default();
        let sink = received.clone();
        let (probe, _) = input
            .to_stream(scope)
            .unary_frontier::<CapacityContainerBuilder<Vec<()>>, _, _, _>(
                Exchange::new(|_: &(i32, i64)| 0),
                "CollectPositions",
                move |_, _| {
                    move |(input, _), _| {
                        input.for_each(|cap, data| {
                            let Some(epoch) = cap.least().copied() else {
                                return;
                            };
                            let mut received = sink.borrow_mut();
                            let offsets = received.entry(epoch).or_default();
                            for (partition, next) in data.drain(..) {
                                let at = offsets.entry(partition).or_insert(next);
                                *at = (*at).max(next);
                            }
                        });
                    }
                },
            )
            .probe();
        Positions {
            input,
            probe,
            received,
        }
    }

    /// Ends the positions stream (with the source).
    pub fn close(&mut self) {
        // Dropping the connected handle closes it; the fresh one is never connected.
        drop(std::mem::replace(&mut self.input, InputHandle::new()));
    }
}
