//! Exactly-once into Redis in step with checkpoints: a transactional [`Committer`].
//!
//! The sink holds each key's latest write instead of sending it. When a checkpoint is due the
//! runtime seals the open set at the newest epoch the sink has written (writes of later epochs
//! are held apart), writes the checkpoint, then commits: every held write of the sealed set
//! and the position key (`generation epoch`) go in one `MULTI`/`EXEC`, so Redis holds either
//! all of a checkpoint's results and its position or none of them. After a crash the position
//! key names the checkpoint that matches what Redis holds; the run resumes from it (newer
//! checkpoints are discarded) and writes the rest again. Memory: one entry per key written
//! since the last commit, so the checkpoint interval bounds it.

use std::sync::{Arc, Mutex, MutexGuard};

use riffle_dataflow::sink::{Committer, Recovery};
use riffle_dataflow::{DataflowResult, Epoch};

use super::client::{Connection, PositionUpdate};
use super::config::RedisSinkConfig;
use super::render::Rendered;
use super::writes::Writes;

/// The writes a run holds until they commit, shared by the sink and the committer.
pub(super) struct Transaction {
    config: RedisSinkConfig,
    position_key: String,
    state: Mutex<State>,
    connection: Mutex<Connection>,
}

#[derive(Default)]
struct State {
    /// Each key's latest write, of the epochs up to the seal (all of them when not sealed).
    open: Writes,
    /// Each key's latest write, of epochs after the seal.
    held: Writes,
    sealed: Option<Epoch>,
    /// The epoch the sink is writing.
    epoch: Option<Epoch>,
    /// What the position key holds: what recovery read, then this run's last commit.
    committed: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Transaction {
    /// `committed`: the position key's value as recovery read it.
    pub fn new(
        config: &RedisSinkConfig,
        connection: Connection,
        committed: Option<String>,
    ) -> Transaction {
        Transaction {
            config: config.clone(),
            position_key: config.position_key(),
            state: Mutex::new(State {
                committed,
                ..State::default()
            }),
            connection: Mutex::new(connection),
        }
    }

    /// Called by the sink before it writes the results of `epoch`.
    pub fn enter_epoch(&self, epoch: Epoch) {
        lock(&self.state).epoch = Some(epoch);
    }

    /// Keeps each row's write as its key's latest, in the open set or, past a seal, apart
    /// from it.
    pub fn write(&self, rendered: &mut Rendered) {
        lock(&self.state).write(rendered);
    }

    fn commit(&self, generation: u64, through: Epoch) -> DataflowResult<()> {
        let mut state = lock(&self.state);
        let new = position_value(generation, through);
        let update = PositionUpdate {
            key: &self.position_key,
            expected: state.committed.as_deref(),
            new: &new,
        };
        lock(&self.connection).apply(&state.open, self.config.ttl_s, Some(&update))?;
        tracing::debug!(
            key = %self.position_key,
            "committed {} key(s) through epoch {through}",
            state.open.len()
        );
        state.committed_as(new);
        Ok(())
    }
}

impl State {
    fn write(&mut self, rendered: &mut Rendered) {
        let past_seal = matches!((self.sealed, self.epoch), (Some(cut), Some(e)) if e > cut);
        if past_seal {
            self.held.add(rendered);
        } else {
            self.open.add(rendered);
        }
    }

    /// The open set is in Redis, with the position key at `position`.
    fn committed_as(&mut self, position: String) {
        self.committed = Some(position);
        self.sealed = None;
        // Swapped, not dropped: the next set reuses the room.
        std::mem::swap(&mut self.open, &mut self.held);
        self.held.clear();
    }

    /// The held writes join the open set; being later, each replaces its key's earlier one.
    fn release(&mut self) {
        self.sealed = None;
        self.open.merge(&self.held);
        self.held.clear();
    }
}

/// The position key's value: the generation and epoch of the checkpoint the keys match.
pub(super) fn position_value(generation: u64, epoch: Epoch) -> String {
    format!("{generation} {epoch}")
}

/// Where a run resumes, from the position key's value (`None`: never committed).
pub(super) fn recovery(
    config: &RedisSinkConfig,
    key: &str,
    value: Option<&str>,
) -> DataflowResult<Recovery> {
    let Some(value) = value else {
        return Ok(Recovery::Committed(None));
    };
    let mut words = value.split_whitespace().map(str::parse::<u64>);
    match (words.next(), words.next(), words.next()) {
        (Some(Ok(generation)), Some(Ok(epoch)), None) => {
            Ok(Recovery::Committed(Some((generation, epoch))))
        }
        _ => Err(config.config_error(format!(
            "the position key `{key}` holds `{value}`, expected `GENERATION EPOCH` (is another \
             program using this key? set `position_key` to one of the sink's own)"
        ))),
    }
}

/// The committer side of a transactional Redis sink.
pub(super) struct RedisCommitter {
    pub transaction: Arc<Transaction>,
}

impl Committer for RedisCommitter {
    fn commit(&mut self, generation: u64, through: Epoch) -> DataflowResult<()> {
        self.transaction.commit(generation, through)
    }

    /// Nothing of an older run is in Redis unless it committed; a commit checks the position
    /// key it expects (`WATCH`), which fences a second writer.
    fn fence(&mut self, _generation: u64) -> DataflowResult<()> {
        Ok(())
    }

    fn transactional(&self) -> bool {
        true
    }

    fn seal(&mut self, through: Epoch) -> bool {
        let mut state = lock(&self.transaction.state);
        debug_assert!(state.held.is_empty());
        state.sealed = Some(through);
        true
    }

    fn sealed(&self) -> Option<Epoch> {
        lock(&self.transaction.state).sealed
    }

    fn release(&mut self) -> DataflowResult<()> {
        lock(&self.transaction.state).release();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::writes::Write;
    use super::*;

    fn config() -> RedisSinkConfig {
        serde_json::from_value(serde_json::json!({"url": "redis://h/0", "key": "k:{a}"})).unwrap()
    }

    /// One row's write, as the sink hands it over.
    fn write(s: &mut State, key: &str, value: Option<&str>) {
        let mut r = Rendered::default();
        r.push_row(Some(key.as_bytes()), value.map(str::as_bytes));
        s.write(&mut r);
    }

    fn all(w: &Writes) -> BTreeMap<String, Option<String>> {
        w.iter()
            .map(|(k, v)| {
                let v = match v {
                    Write::Set(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    Write::Delete => None,
                };
                (String::from_utf8_lossy(k).into_owned(), v)
            })
            .collect()
    }

    fn map(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    #[test]
    fn a_seal_keeps_later_epochs_out_of_the_commit_and_the_latest_write_wins() {
        let mut s = State {
            epoch: Some(1),
            ..State::default()
        };
        write(&mut s, "a", Some("1"));
        write(&mut s, "a", Some("2"));
        s.epoch = Some(2);
        write(&mut s, "b", Some("1"));
        s.sealed = Some(2);
        s.epoch = Some(3);
        write(&mut s, "a", Some("3"));
        write(&mut s, "c", None);
        assert_eq!(all(&s.open), map(&[("a", Some("2")), ("b", Some("1"))]));
        assert_eq!(s.held.len(), 2);
        s.committed_as("7 2".into());
        assert_eq!(s.committed.as_deref(), Some("7 2"));
        assert_eq!(s.sealed, None);
        assert_eq!(all(&s.open), map(&[("a", Some("3")), ("c", None)]));
        assert!(s.held.is_empty());
        // A seal lifted without a commit: the held writes replace the open ones.
        s.sealed = Some(3);
        s.epoch = Some(4);
        write(&mut s, "a", Some("4"));
        s.release();
        assert_eq!(all(&s.open), map(&[("a", Some("4")), ("c", None)]));
        assert!(s.held.is_empty() && s.sealed.is_none());
    }

    #[test]
    fn the_position_key_names_the_committed_checkpoint() {
        let c = config();
        assert_eq!(position_value(1733, 42), "1733 42");
        assert_eq!(
            recovery(&c, "p", Some("1733 42")).unwrap(),
            Recovery::Committed(Some((1733, 42)))
        );
        assert_eq!(recovery(&c, "p", None).unwrap(), Recovery::Committed(None));
        for bad in ["", "1", "1 2 3", "a b", "-1 2"] {
            let e = recovery(&c, "p", Some(bad)).unwrap_err().to_string();
            assert!(e.contains("position key `p`"), "{bad:?}: {e}");
        }
    }
}
