//! The state `candidates` checkpoints, in both modes: the clicks in each window.

use riffle_dataflow::state::{encode, StateRecord};
use serde::{Deserialize, Serialize};

use super::Click;

/// The window a checkpointed click is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Window {
    /// The popularity window (`window`).
    #[serde(rename = "p")]
    Popular,
    /// The seen-items window (`seen_window`).
    #[serde(rename = "s")]
    Seen,
}

/// One click in one of the windows, as `candidates` checkpoints it: `["p", user, item, time]`
/// (compact: a window holds many).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowClick(pub Window, pub i64, pub i64, pub i64);

impl WindowClick {
    fn new(window: Window, c: Click) -> WindowClick {
        WindowClick(window, c.user, c.item, c.time)
    }

    pub(super) fn click(&self) -> Click {
        let WindowClick(_, user, item, time) = *self;
        Click { user, item, time }
    }
}

impl StateRecord for WindowClick {
    const KIND: &'static str = "candidates";

    /// Format 1: `p,user,item,time` or `s,user,item,time`.
    fn from_v1(text: &str) -> Option<Self> {
        let mut fields = text.split(',');
        let window = match fields.next()? {
            "p" => Window::Popular,
            "s" => Window::Seen,
            _ => return None,
        };
        let values: Vec<i64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let [user, item, time] = values[..] else {
            return None;
        };
        Some(WindowClick(window, user, item, time))
    }
}

/// A click's state record.
pub(super) fn record(window: Window, click: Click) -> String {
    encode(&WindowClick::new(window, click)).unwrap_or_else(|e| {
        tracing::error!("{e}");
        String::new()
    })
}
