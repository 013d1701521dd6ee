//! The windows of the recommendation features: clicks in a sliding event-time window
//! (`riffle_dataflow::operators::SlidingWindow`), leaving it in event-time order.

use riffle_dataflow::operators::{EventTime, WindowStart};

use super::Click;

/// The clicks a window starts from after a restart.
pub type Restore = WindowStart<Click>;

impl EventTime for Click {
    fn event_time(&self) -> i64 {
        self.time
    }
}
