//! Each key's latest write since the last flush or commit, kept without an allocation per row:
//! the keys in one buffer, each value a slice of its batch's own buffer (a batch's JSON lines
//! are kept whole), and an open-addressing index of the keys' hashes, so that a key written
//! twice is sent once, with its latest value.

use std::hash::{BuildHasher, RandomState};

use super::render::Rendered;

/// What a key's latest row does to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write<'a> {
    Set(&'a [u8]),
    /// A null value: the key's latest value is none.
    Delete,
}

/// Where a value's bytes are: `chunks[chunk][start..end]`.
#[derive(Clone, Copy, Debug)]
struct Slice {
    chunk: usize,
    start: usize,
    end: usize,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    hash: u64,
    key_start: usize,
    key_end: usize,
    /// `None`: delete the key.
    value: Option<Slice>,
}

/// An index slot that holds no entry.
const EMPTY: usize = usize::MAX;

/// Below this many bytes of values no longer referred to, they are left where they are.
const COMPACT_FLOOR: usize = 4 << 20;

/// Keys and their latest writes, in the order each key was first written.
#[derive(Default)]
pub struct Writes {
    keys: Vec<u8>,
    entries: Vec<Entry>,
    /// Open addressing with linear probing: entry indexes, [`EMPTY`] where none; a power of
    /// two long, at most half full.
    slots: Vec<usize>,
    chunks: Vec<Vec<u8>>,
    /// Bytes of `chunks` that entries refer to; the rest were overwritten or never had a key.
    live: usize,
    held: usize,
    hasher: RandomState,
}

impl Writes {
    /// The number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of keys and values, for sizing what is sent.
    pub fn bytes(&self) -> usize {
        self.keys.len() + self.live
    }

    /// Forgets every write, keeping the buffers' and the index's room for the next ones.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.entries.clear();
        self.slots.fill(EMPTY);
        self.chunks.clear();
        self.live = 0;
        self.held = 0;
    }

    /// Each key with its latest write, in the order the keys were first written.
    #[allow(
        clippy::indexing_slicing,
        reason = "spans are taken from their buffers' lengths as they are filled; the buffers \
                  only grow until `clear`, which drops the entries too; compaction moves each \
                  value's span with it"
    )]
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Write<'_>)> + '_ {
        self.entries.iter().map(|e| {
            let value = match e.value {
                Some(s) => Write::Set(&self.chunks[s.chunk][s.start..s.end]),
                None => Write::Delete,
            };
            (&self.keys[e.key_start..e.key_end], value)
        })
    }

    /// The latest write of `key`, if any.
    #[cfg(test)]
    pub fn get(&self, key: &[u8]) -> Option<Write<'_>> {
        self.iter().find(|(k, _)| *k == key).map(|(_, w)| w)
    }

    /// Adds a batch's rows in order (a later row replaces an earlier one of the same key),
    /// taking its values' buffer; rows without a key are left out.
    pub fn add(&mut self, rendered: &mut Rendered) {
        let chunk = self.chunks.len();
        let values = rendered.take_values();
        self.held += values.len();
        self.chunks.push(values);
        for (key, value) in rendered.rows() {
            let Some(key) = key else { continue };
            let value = value.map(|(start, end)| Slice { chunk, start, end });
            self.set(key, value);
        }
        self.compact_if_mostly_dead();
    }

    /// Adds `later`'s writes, each replacing this set's write of its key.
    pub fn merge(&mut self, later: &Writes) {
        let chunk = self.chunks.len();
        let mut values = Vec::with_capacity(later.live);
        let mut spans = Vec::with_capacity(later.len());
        for (_, write) in later.iter() {
            spans.push(match write {
                Write::Set(bytes) => {
                    let start = values.len();
                    values.extend_from_slice(bytes);
                    Some(Slice {
                        chunk,
                        start,
                        end: values.len(),
                    })
                }
                Write::Delete => None,
            });
        }
        self.held += values.len();
        self.chunks.push(values);
        for ((key, _), value) in later.iter().zip(spans) {
            self.set(key, value);
        }
        self.compact_if_mostly_dead();
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`i` is masked to the slot count, a power of two that `grow` keeps above \
                  the entries; a slot holds an entry's index; key spans as in `iter`"
    )]
    fn set(&mut self, key: &[u8], value: Option<Slice>) {
        if (self.entries.len() + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let hash = self.hasher.hash_one(key);
        let mask = self.slots.len() - 1;
        let mut i = hash as usize & mask;
        loop {
            match self.slots[i] {
                EMPTY => {
                    self.slots[i] = self.entries.len();
                    let key_start = self.keys.len();
                    self.keys.extend_from_slice(key);
                    self.entries.push(Entry {
                        hash,
                        key_start,
                        key_end: self.keys.len(),
                        value,
                    });
                    self.live += len(value);
                    return;
                }
                at => {
                    let e = &mut self.entries[at];
                    if e.hash == hash && self.keys[e.key_start..e.key_end] == *key {
                        self.live = self.live - len(e.value) + len(value);
                        e.value = value;
                        return;
                    }
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Doubles the index (at least 64 slots) and places every entry again.
    #[allow(
        clippy::indexing_slicing,
        reason = "`i` is masked to the new slot count, a power of two"
    )]
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(64);
        self.slots.clear();
        self.slots.resize(size, EMPTY);
        let mask = size - 1;
        for (at, e) in self.entries.iter().enumerate() {
            let mut i = e.hash as usize & mask;
            while self.slots[i] != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = at;
        }
    }

    /// With keys written over and over between commits, the buffers would hold every value
    /// ever written: once most of what they hold is overwritten, the live values are copied
    /// into one buffer (each byte is copied a bounded number of times on average).
    #[allow(clippy::indexing_slicing, reason = "value spans as in `iter`")]
    fn compact_if_mostly_dead(&mut self) {
        let dead = self.held - self.live;
        if dead < COMPACT_FLOOR || dead < self.live {
            return;
        }
        let mut values = Vec::with_capacity(self.live);
        for e in &mut self.entries {
            if let Some(s) = &mut e.value {
                let start = values.len();
                values.extend_from_slice(&self.chunks[s.chunk][s.start..s.end]);
                *s = Slice {
                    chunk: 0,
                    start,
                    end: values.len(),
                };
            }
        }
        self.held = values.len();
        self.chunks = vec![values];
    }
}

fn len(value: Option<Slice>) -> usize {
    value.map_or(0, |s| s.end - s.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `(key, value)` rows as the renderer makes them.
    fn rendered(rows: &[(Option<&str>, Option<&str>)]) -> Rendered {
        let mut r = Rendered::default();
        for (key, value) in rows {
            r.push_row(key.map(str::as_bytes), value.map(str::as_bytes));
        }
        r
    }

    fn all(w: &Writes) -> Vec<(String, Option<String>)> {
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

    fn pair(k: &str, v: Option<&str>) -> (String, Option<String>) {
        (k.to_string(), v.map(str::to_string))
    }

    #[test]
    fn the_latest_write_of_each_key_wins_across_batches_and_keyless_rows_are_left_out() {
        let mut w = Writes::default();
        w.add(&mut rendered(&[
            (Some("a"), Some("1")),
            (Some("b"), Some("1")),
            (None, Some("x")),
            (Some("a"), Some("2")),
        ]));
        w.add(&mut rendered(&[(Some("b"), None), (Some("c"), Some("3"))]));
        assert_eq!(
            all(&w),
            [pair("a", Some("2")), pair("b", None), pair("c", Some("3"))]
        );
        assert_eq!(w.len(), 3);
        assert_eq!(w.bytes(), 3 + 2);
        w.clear();
        assert!(w.is_empty() && w.iter().next().is_none());
        w.add(&mut rendered(&[(Some("a"), Some("9"))]));
        assert_eq!(all(&w), [pair("a", Some("9"))]);
    }

    #[test]
    fn many_keys_grow_the_index_and_each_stays_findable() {
        let mut w = Writes::default();
        let keys: Vec<String> = (0..5000).map(|i| format!("k:{i}")).collect();
        let values: Vec<String> = (0..5000).map(|i| format!("v{i}")).collect();
        let rows: Vec<_> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (Some(k.as_str()), Some(v.as_str())))
            .collect();
        w.add(&mut rendered(&rows));
        w.add(&mut rendered(&rows[..10]));
        assert_eq!(w.len(), 5000);
        assert!(w.slots.len() >= 10_000 && w.slots.len().is_power_of_two());
        for i in [0, 1, 4095, 4999] {
            let v = format!("v{i}");
            assert_eq!(
                w.get(format!("k:{i}").as_bytes()),
                Some(Write::Set(v.as_bytes()))
            );
        }
        assert_eq!(w.get(b"k:5000"), None);
    }

    #[test]
    fn values_written_over_and_over_are_compacted_and_keep_their_latest() {
        let mut w = Writes::default();
        let big = "x".repeat(64 << 10);
        for round in 0..200 {
            let value = format!("{round}{big}");
            w.add(&mut rendered(&[
                (Some("same"), Some(value.as_str())),
                (Some("other"), Some("o")),
            ]));
        }
        // 200 rounds of 64 KiB, of which one value is live: the rest was let go.
        assert!(w.held <= 2 * COMPACT_FLOOR, "{} bytes held", w.held);
        let Some(Write::Set(latest)) = w.get(b"same") else {
            panic!("no value")
        };
        assert!(latest.starts_with(b"199x") && latest.len() == big.len() + 3);
        assert_eq!(w.get(b"other"), Some(Write::Set(b"o")));
    }

    #[test]
    fn a_merge_replaces_each_keys_write_with_the_later_one() {
        let mut open = Writes::default();
        open.add(&mut rendered(&[
            (Some("a"), Some("1")),
            (Some("b"), Some("1")),
        ]));
        let mut held = Writes::default();
        held.add(&mut rendered(&[(Some("a"), None), (Some("c"), Some("3"))]));
        open.merge(&held);
        assert_eq!(
            all(&open),
            [pair("a", None), pair("b", Some("1")), pair("c", Some("3"))]
        );
    }
}
