//! Real-time recommendation features on a click stream, maintained with differential-dataflow.
//!
//! Clicks are sharded by user. Two features answer each click: item popularity over a sliding
//! event-time window (global) and the user's recently seen items (kept on the user's worker).
//! A click's candidates are the most popular items the user has not seen (the clicked item
//! included), one output row per candidate, ready for a scoring model and a `rank` stage.
//!
//! `features: per_click` (the default): each click is answered from features
//! that include every earlier click and itself, in event-time order (equal times in input
//! order), as a loop over the clicks one at a time would: every worker gets every click's item
//! and replays the epoch's clicks in one global order, answering its own users' clicks at their
//! place. `features: previous_epoch` (an explicit option): differential-dataflow keeps the
//! features per epoch and each click is answered from those as of the previous epoch, so no
//! worker waits for another's clicks of the same epoch, but a click does not see the clicks
//! just before it (nor its own user's): a different, easier job than real-time features.

mod answer_rows;
mod candidates;
mod checkpoint;
mod per_click;
mod previous_epoch;
mod step;
mod window;

pub use candidates::{Candidates, CandidatesConfig, FeaturesAsOf};
pub use checkpoint::{Window, WindowClick};
pub use riffle_dataflow::operators::{SlidingWindow, WindowUpdates};
pub use window::Restore;

use std::sync::Arc;

use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{BatchStream, StateUpdates};
use riffle_dataflow::state::SavedState;
use riffle_dataflow::Epoch;
use serde::{Deserialize, Serialize};

/// The stage's name: in its dead letters, and the name its checkpointed state is kept under.
const NAME: &str = "candidates";

/// One click: who, what, and when (event time, e.g. seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Click {
    pub user: i64,
    pub item: i64,
    pub time: i64,
}

/// A change to a feature, as differential reports it (`diff` is +1 or -1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FeatureChange {
    /// `item` was clicked `count` times within the window.
    Popularity { item: i64, count: i64, diff: isize },
    /// `user` clicked `item` within the seen-window.
    Seen { user: i64, item: i64, diff: isize },
}

// The mode is chosen here, so neither implementation's module depends on the other.
impl<'scope> Candidates<'scope> for BatchStream<'scope> {
    fn candidates_from(
        self,
        config: CandidatesConfig,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (Self, StateUpdates<'scope>) {
        match config.features {
            FeaturesAsOf::PerClick => {
                per_click::candidates(self, config, metrics, state, first_epoch)
            }
            FeaturesAsOf::PreviousEpoch => {
                previous_epoch::previous_epoch(self, config, metrics, state, first_epoch)
            }
        }
    }
}
