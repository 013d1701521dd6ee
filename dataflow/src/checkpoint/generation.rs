//! Run generations that grow whatever the clock does.
//!
//! A run that checkpoints has a generation: its results and commit markers carry it, and sinks
//! fence older ones (the committed-results protocol drops results of a generation below the last
//! fence). It was the start time in milliseconds, which a clock stepped back (NTP correcting a
//! host, a VM restored from a snapshot) makes smaller than an earlier run's, so that run's
//! results would be hidden from readers: seen while adding clock steps to the fault campaign
//! (`scripts/campaign.sh`). The store keeps the last generation handed out
//! (`riffle.generation`, beside the checkpoints), and the leader takes the larger of its clock
//! and one past it before it fences or writes anything.

use super::{store_error, write_file, Backend, CheckpointStore};
use crate::error::{DataflowError, DataflowResult};

/// The record's name in the checkpoint directory or under the prefix.
pub const GENERATION: &str = "riffle.generation";

impl CheckpointStore {
    /// This run's generation: `now_ms`, or one past the last handed out when that is not
    /// smaller; recorded before it is returned.
    pub fn next_generation(&self, now_ms: u64) -> DataflowResult<u64> {
        let next = match self.last_generation()? {
            Some(last) => now_ms.max(last.saturating_add(1)),
            None => now_ms,
        };
        let text = format!("{next}\n");
        match &self.backend {
            Backend::Dir(dir) => write_file(dir, GENERATION, &text).map(|_| ()),
            Backend::Object(at) => at
                .put(GENERATION, text.into_bytes())
                .map_err(|e| store_error("recording the run's generation", e)),
        }?;
        Ok(next)
    }

    /// The last generation handed out; `None` before the first (or when the record is not a
    /// number, which only a hand can make: the clock is then the only guide, as before).
    fn last_generation(&self) -> DataflowResult<Option<u64>> {
        let text = match &self.backend {
            Backend::Dir(dir) => match std::fs::read_to_string(dir.join(GENERATION)) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => {
                    return Err(DataflowError::io(
                        format!("reading {}", dir.join(GENERATION).display()),
                        e,
                    ))
                }
            },
            Backend::Object(at) => match at
                .get(GENERATION)
                .map_err(|e| store_error("reading the last run's generation", e))?
            {
                Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                None => return Ok(None),
            },
        };
        let last = text.trim().parse().ok();
        if last.is_none() {
            tracing::warn!(
                "{}: `{GENERATION}` holds no number; generations follow the clock",
                self.describe()
            );
        }
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_grow_when_the_clock_steps_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        assert_eq!(store.next_generation(1_000_000).unwrap(), 1_000_000);
        // The host's clock was stepped back five minutes before the next run started.
        let after_step = store.next_generation(1_000_000 - 300_000).unwrap();
        assert!(after_step > 1_000_000, "got {after_step}");
        // Two runs in the same millisecond still differ.
        let same_ms = store.next_generation(after_step).unwrap();
        assert!(same_ms > after_step);
        // A clock ahead of every earlier run is used as it is.
        assert_eq!(store.next_generation(5_000_000).unwrap(), 5_000_000);
        // The record is not a checkpoint: none is listed or resumed from.
        assert!(store.latest().unwrap().is_none());
    }

    #[test]
    fn a_record_that_is_no_number_leaves_the_clock_in_charge() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(GENERATION), "not a number").unwrap();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        assert_eq!(store.next_generation(42).unwrap(), 42);
        assert_eq!(store.next_generation(7).unwrap(), 43);
    }
}
