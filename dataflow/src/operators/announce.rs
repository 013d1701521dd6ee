//! Announcing a value that switches while running (a model version), at one epoch for every
//! worker, as checkpointed state.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::{Broadcast, Map};
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;
use timely::ExchangeData;

use super::{BatchStream, StateUpdates};
use crate::state::{encode, SavedState, StateRecord};
use crate::Epoch;

/// "`value` from epoch `from_epoch` on": one announced switch, and the state record that
/// keeps it (`{"from_epoch":12,"value":3}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switch<V> {
    pub from_epoch: Epoch,
    pub value: V,
}

impl<V: Serialize + DeserializeOwned + FromStr> StateRecord for Switch<V> {
    const KIND: &'static str = "switch";

    /// Format 1: `from_epoch:value`.
    fn from_v1(text: &str) -> Option<Self> {
        let (e, v) = text.split_once(':')?;
        Some(Switch {
            from_epoch: e.parse().ok()?,
            value: v.parse().ok()?,
        })
    }
}

impl<V: Serialize + DeserializeOwned + FromStr> Switch<V> {
    /// The schedule (epoch → value from it on) a checkpoint's `saved` state holds.
    pub fn schedule(saved: &SavedState, stage: &str) -> BTreeMap<Epoch, V> {
        saved
            .records::<Switch<V>>(stage)
            .into_iter()
            .map(|(s, _)| (s.from_epoch, s.value))
            .collect()
    }
}

/// Announcing switches of a value.
pub trait Announce<'scope> {
    /// Worker 0 decides, every worker takes part: the operator holds a capability `lookahead`
    /// epochs ahead of its input's frontier, and whenever `next` (given the value in force)
    /// returns a new value, announces "that value from epoch `c`" at that capability's time
    /// `c`, broadcast to every worker. Each switch is also its state ([`Switch`]), so a
    /// checkpoint covering epoch `c` records it; `restored` (the schedule of the checkpoint
    /// resumed from, see [`Switch::schedule`]) is announced again before `first_epoch`, and
    /// no new value is taken for the `lookahead` epochs after it (they are served again as the
    /// crashed run served them). The input's batches themselves are dropped: it only paces the
    /// announcements.
    ///
    /// # Examples
    /// ```
    /// use std::collections::BTreeMap;
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::operators::Announce;
    /// use riffle_dataflow::Batch;
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let (switches, states) = (seen.clone(), seen.clone());
    /// timely::example(move |scope| {
    ///     let rows = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1])) as _)]).unwrap();
    ///     let input = vec![Batch::records(rows, 0)].to_stream(scope).container::<Vec<_>>();
    ///     // Version 1 from the start; no newer one shows up.
    ///     let next = |current: Option<&u64>| current.is_none().then_some(1u64);
    ///     let (announced, state) = input.announce("versions", 8, BTreeMap::new(), 0, next);
    ///     announced.inspect(move |s| switches.lock().unwrap().push(format!("{s:?}")));
    ///     state.inspect(move |r| states.lock().unwrap().push(format!("{r:?}")));
    /// });
    /// let mut seen = seen.lock().unwrap().clone();
    /// seen.sort();
    /// assert_eq!(seen, vec![r#"("{\"from_epoch\":0,\"value\":1}", 1)"#, "(0, 1)"]);
    /// ```
    fn announce<V, F>(
        self,
        name: &str,
        lookahead: Epoch,
        restored: BTreeMap<Epoch, V>,
        first_epoch: Epoch,
        next: F,
    ) -> (StreamVec<'scope, Epoch, (Epoch, V)>, StateUpdates<'scope>)
    where
        V: ExchangeData + Clone + Serialize + DeserializeOwned + FromStr,
        F: FnMut(Option<&V>) -> Option<V> + 'static;
}

/// What the operator emits: a switch, or the state record of one.
#[derive(Clone)]
enum Announced<V> {
    Switch(Epoch, V),
    State(String, isize),
}

impl<'scope> Announce<'scope> for BatchStream<'scope> {
    fn announce<V, F>(
        self,
        name: &str,
        lookahead: Epoch,
        restored: BTreeMap<Epoch, V>,
        first_epoch: Epoch,
        mut next: F,
    ) -> (StreamVec<'scope, Epoch, (Epoch, V)>, StateUpdates<'scope>)
    where
        V: ExchangeData + Clone + Serialize + DeserializeOwned + FromStr,
        F: FnMut(Option<&V>) -> Option<V> + 'static,
    {
        let decides = self.scope().index() == 0;
        let operator = name.to_string();
        let record = |from_epoch: Epoch, value: V| -> Option<String> {
            encode(&Switch { from_epoch, value })
                .map_err(|e| tracing::error!("{e}"))
                .ok()
        };
        let announced = self
            .unary_frontier::<CapacityContainerBuilder<Vec<Announced<V>>>, _, _, _>(
                Pipeline,
                name,
                move |initial, _| {
                    // Restored records are re-announced before `first_epoch`, so this run's
                    // checkpoints keep them.
                    let mut cap: Option<Capability<Epoch>> =
                        decides.then(|| initial.delayed(&first_epoch.saturating_sub(1)));
                    let mut current = restored.values().next_back().cloned();
                    let mut restore = Some(restored);
                    move |(input, frontier), output| {
                        input.for_each(|_, data| data.clear());
                        let Some(held) = cap.as_mut() else {
                            return;
                        };
                        if let Some(restored) = restore.take() {
                            // Every worker also has the schedule from the state.
                            let mut session = output.session(&*held);
                            for (&e, v) in &restored {
                                if let Some(r) = record(e, v.clone()) {
                                    session.give(Announced::State(r, 1));
                                }
                            }
                            drop(session);
                            // Epochs the crashed run served after its last checkpoint are
                            // served again by the restored value, not a newer one, for the
                            // lookahead's epochs.
                            if !restored.is_empty() {
                                held.downgrade(&first_epoch.saturating_add(lookahead));
                            }
                        }
                        if let Some(v) = next(current.as_ref()) {
                            let at = *held.time();
                            let mut session = output.session(&*held);
                            if let Some(r) = record(at, v.clone()) {
                                // Observable: tests kill a process between this and epoch `at`.
                                tracing::info!("{operator}: announced {r}");
                                session.give(Announced::State(r, 1));
                            }
                            session.give(Announced::Switch(at, v.clone()));
                            current = Some(v);
                        }
                        match frontier.frontier().iter().min() {
                            Some(&f) => {
                                let target = f.saturating_add(lookahead);
                                if *held.time() < target {
                                    held.downgrade(&target);
                                }
                            }
                            None => cap = None,
                        }
                    }
                },
            );
        let switches = announced
            .clone()
            .flat_map(|a| match a {
                Announced::Switch(e, v) => Some((e, v)),
                Announced::State(..) => None,
            })
            .broadcast();
        let state = announced.flat_map(|a| match a {
            Announced::State(r, n) => Some((r, n)),
            Announced::Switch(..) => None,
        });
        (switches, state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_read_in_both_formats() {
        let v1 = SavedState::parse(r#"[["0:1",1],["40:2",1]]"#).unwrap();
        let switches = [(0, 1u64), (40, 2)].map(|(from_epoch, value)| Switch { from_epoch, value });
        let v2 = SavedState::from_records(switches.iter().map(|s| (s, 1))).unwrap();
        let expected = BTreeMap::from([(0, 1u64), (40, 2)]);
        assert_eq!(Switch::schedule(&v1, "model"), expected);
        assert_eq!(Switch::schedule(&v2, "model"), expected);
    }
}
