//! Timely operators over streams of [`Batch`]es, one per module, each an extension trait.
//! Stateful ones ([`KeyedState`], [`Announce`]) report their state as [`StateUpdates`] of
//! typed records ([`crate::state`]).

mod announce;
mod answer_from;
mod apply_stage;
mod balance;
mod by_schedule;
mod dynamic_batch;
mod exchange_by_key;
mod keyed;
mod place;
mod rebalance;
mod sliding_window;
mod spread;
mod write_to_sink;

pub use announce::{Announce, Switch};
pub use answer_from::AnswerFrom;
pub use apply_stage::{run_stage, ApplyStage};
pub use balance::{service, Balance, DelayReports, Service, ServiceCell};
pub use by_schedule::BySchedule;
pub use dynamic_batch::{BatchPolicy, DynamicBatch};
pub use exchange_by_key::{
    is_key_type, route_rows, take_rows, worker_for, worker_for_int, ExchangeByKey,
};
pub use keyed::{Keyed, KeyedLogic, KeyedRecord, KeyedState, StateKey};
pub use place::Place;
pub use rebalance::Rebalance;
pub use sliding_window::{EventTime, SlidingWindow, WindowStart, WindowUpdates};
pub use spread::Spread;
pub use write_to_sink::{SinkOptions, WriteToSink};

use crate::{Batch, Epoch};

/// A stateful operator's state as changes to a multiset of records (`+1` in, `-1` out) at the
/// epoch they happen: consolidated up to epoch `e` they are the state to checkpoint at `e`,
/// and replayed into the operator they restore it. Each record is the text of a typed
/// [`StateRecord`](crate::state::StateRecord) ([`crate::state::encode`]).
pub type StateUpdates<'scope> = timely::dataflow::StreamVec<'scope, Epoch, (String, isize)>;

/// The state updates of a step that keeps no state: none.
pub fn no_state_updates(scope: timely::dataflow::Scope<'_, Epoch>) -> StateUpdates<'_> {
    timely::dataflow::operators::generic::operator::empty(scope)
}

/// A stream of Arrow batches timestamped with epochs.
pub type BatchStream<'scope> = timely::dataflow::StreamVec<'scope, Epoch, Batch>;

/// Sends every batch to the worker its `route` names (set by the operator before).
pub(crate) fn to_routes<'scope>(stream: BatchStream<'scope>, name: &str) -> BatchStream<'scope> {
    use timely::dataflow::channels::pact::Exchange;
    use timely::dataflow::operators::Operator;
    stream.unary(Exchange::new(|b: &Batch| b.route), name, |_, _| {
        |input, output| input.for_each(|cap, data| output.session(&cap).give_container(data))
    })
}
