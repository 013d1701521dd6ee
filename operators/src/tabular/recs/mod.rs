//! Real-time recommendation features on a click stream, maintained with differential-dataflow.
//!
//! Clicks are sharded by user. Per epoch, differential keeps two collections up to date:
//! item popularity over a sliding event-time window (counted on the item's worker, then
//! broadcast) and each user's recently seen items (kept on the user's worker). Every click is
//! answered from the features as of the previous epoch, so no worker waits on another within an
//! epoch: its candidates are the most popular items the user has not seen (the clicked item
//! included), one output row per candidate, ready for a scoring model and a `rank` stage.

mod candidates;
mod step;
mod window;

pub use candidates::{Candidates, CandidatesConfig, Window, WindowClick};
pub use riffle_dataflow::operators::{SlidingWindow, WindowUpdates};
pub use window::Restore;

use serde::{Deserialize, Serialize};

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
