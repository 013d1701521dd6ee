//! Operator state as checkpoints keep it: one typed, versioned encoding for every stateful
//! operator.
//!
//! A stateful operator's state is a multiset of records, reported as changes (`+1` in, `-1`
//! out) on its [`StateUpdates`](crate::operators::StateUpdates) stream. Each record is a value
//! of a type implementing [`StateRecord`]: serde for its content, a [`KIND`](StateRecord::KIND)
//! naming what it is, and a reader of the format before this one. A record travels to the
//! checkpoint as its compact JSON text ([`encode`]), so that the runtime consolidates records of
//! any type; the checkpoint keeps each stateful stage's records in an [`Envelope`]:
//!
//! ```json
//! {"format":2,"kind":"keyed","records":[[{"key":{"text":"cam-1"},"state":{"frames":3}},1]]}
//! ```
//!
//! and [`SavedState`] reads it back. **Compatibility**: a reader accepts its own [`FORMAT`] and
//! the one before. Format 1 (Riffle before this envelope) was a bare list `[["<text>", count],
//! …]`, each operator with its own text syntax (`s:cam-1\t{json}`, `12:3`, `p,7,42,1000`), which
//! [`StateRecord::from_v1`] reads. A change of the encoding bumps [`FORMAT`] and keeps a reader
//! of the previous one, so a checkpoint written by one version is read by the next;
//! `dataflow/tests/state_format.rs` pins checkpoint files of both formats.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{DataflowError, DataflowResult};

/// The encoding this version writes.
pub const FORMAT: u32 = 2;

/// The oldest encoding this version reads.
pub const OLDEST_FORMAT: u32 = 1;

/// A record of a stateful operator's state.
pub trait StateRecord: Serialize + DeserializeOwned {
    /// What the records are (`keyed`, `switch`, `candidates`): written in the envelope and
    /// checked on reading, so a stage that changed kind under the same name starts empty
    /// rather than misreading another kind's state.
    const KIND: &'static str;

    /// The record as format 1 wrote it (one line of operator-specific text), if it reads as
    /// one.
    fn from_v1(text: &str) -> Option<Self>;
}

/// `record` as it travels to the checkpoint: compact JSON, equal for equal records (the
/// runtime adds up the counts of equal texts).
pub fn encode<R: StateRecord>(record: &R) -> DataflowResult<String> {
    serde_json::to_string(record)
        .map_err(|e| DataflowError::Config(format!("encoding a `{}` state record: {e}", R::KIND)))
}

/// One stateful stage's state in a checkpoint, as written.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope {
    /// The encoding ([`FORMAT`] when written by this version).
    pub format: u32,
    /// The records' [`StateRecord::KIND`].
    pub kind: String,
    /// Each record (its JSON) and its count, in the order of their texts.
    pub records: Vec<(Box<RawValue>, isize)>,
}

impl Envelope {
    /// The envelope of `kind` holding `records`, given as [`encode`]d texts with their counts.
    pub fn new<'a>(
        kind: &str,
        records: impl IntoIterator<Item = (&'a str, isize)>,
    ) -> DataflowResult<Envelope> {
        let mut records = records
            .into_iter()
            .map(|(text, count)| {
                RawValue::from_string(text.to_string())
                    .map(|raw| (raw, count))
                    .map_err(|e| {
                        DataflowError::Config(format!(
                            "a `{kind}` state record is not JSON ({e}): {text}"
                        ))
                    })
            })
            .collect::<DataflowResult<Vec<_>>>()?;
        records.sort_by(|a, b| a.0.get().cmp(b.0.get()).then(a.1.cmp(&b.1)));
        Ok(Envelope {
            format: FORMAT,
            kind: kind.to_string(),
            records,
        })
    }

    /// The envelope as the text a checkpoint stores.
    pub fn to_text(&self) -> DataflowResult<String> {
        serde_json::to_string(self)
            .map_err(|e| DataflowError::Config(format!("encoding `{}` state: {e}", self.kind)))
    }
}

/// A record as read back, in the format it was written in.
#[derive(Clone, Debug)]
enum Saved {
    /// Format 1: operator-specific text.
    Text(String),
    /// Format 2: the record's JSON.
    Json(Box<RawValue>),
}

/// One stateful stage's checkpointed state as read back, in any format this version reads;
/// [`records`](SavedState::records) decodes it as the operator's record type.
#[derive(Clone, Debug, Default)]
pub struct SavedState {
    /// The format it was written in (0: no state).
    format: u32,
    /// The records' kind (format 2 on).
    kind: Option<String>,
    records: Vec<(Saved, isize)>,
}

impl SavedState {
    /// Reads a checkpoint's entry for one stage: an [`Envelope`] of a format this version
    /// reads, or format 1's bare list of `(text, count)`.
    pub fn parse(text: &str) -> DataflowResult<SavedState> {
        let unreadable =
            |e: serde_json::Error| DataflowError::Config(format!("unreadable operator state: {e}"));
        if text.trim_start().starts_with('[') {
            let records: Vec<(String, isize)> = serde_json::from_str(text).map_err(unreadable)?;
            return Ok(SavedState {
                format: 1,
                kind: None,
                records: records
                    .into_iter()
                    .map(|(t, n)| (Saved::Text(t), n))
                    .collect(),
            });
        }
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        let Format { format } = serde_json::from_str(text).map_err(unreadable)?;
        if !(OLDEST_FORMAT..=FORMAT).contains(&format) {
            return Err(DataflowError::Config(format!(
                "operator state of format {format}: this version of Riffle reads formats \
                 {OLDEST_FORMAT} to {FORMAT} (was it written by a newer one?)"
            )));
        }
        let envelope: Envelope = serde_json::from_str(text).map_err(unreadable)?;
        Ok(SavedState {
            format: envelope.format,
            kind: Some(envelope.kind),
            records: envelope
                .records
                .into_iter()
                .map(|(raw, n)| (Saved::Json(raw), n))
                .collect(),
        })
    }

    /// The records of `R`'s kind as written by this version, as a restored operator holds them
    /// (tests and tools build a state to restore from with this).
    pub fn from_records<'a, R: StateRecord + 'a>(
        records: impl IntoIterator<Item = (&'a R, isize)>,
    ) -> DataflowResult<SavedState> {
        let texts = records
            .into_iter()
            .map(|(r, n)| Ok((encode(r)?, n)))
            .collect::<DataflowResult<Vec<_>>>()?;
        let envelope = Envelope::new(R::KIND, texts.iter().map(|(t, n)| (t.as_str(), *n)))?;
        SavedState::parse(&envelope.to_text()?)
    }

    /// The format the state was written in (0 when there is none).
    pub fn format(&self) -> u32 {
        self.format
    }

    /// The records' kind, when the format names it.
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// The records decoded as `R`, with their counts (records of a count ≤ 0 left out). A
    /// record that does not read as `R` is skipped with a warning naming `stage`; state of
    /// another kind is skipped whole.
    pub fn records<R: StateRecord>(&self, stage: &str) -> Vec<(R, isize)> {
        if let Some(kind) = self.kind.as_deref().filter(|k| *k != R::KIND) {
            tracing::warn!(
                "{stage}: ignoring checkpointed state of kind `{kind}` (this stage keeps `{}`)",
                R::KIND
            );
            return Vec::new();
        }
        let mut out = Vec::with_capacity(self.records.len());
        for (saved, count) in &self.records {
            if *count <= 0 {
                continue;
            }
            let record = match saved {
                Saved::Text(text) => R::from_v1(text).ok_or_else(|| text.clone()),
                Saved::Json(raw) => {
                    serde_json::from_str(raw.get()).map_err(|e| format!("{e}: {}", raw.get()))
                }
            };
            match record {
                Ok(record) => out.push((record, *count)),
                Err(why) => tracing::warn!("{stage}: ignoring unreadable state record {why}"),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Count {
        key: String,
        n: i64,
    }

    impl StateRecord for Count {
        const KIND: &'static str = "count";
        fn from_v1(text: &str) -> Option<Self> {
            let (key, n) = text.split_once(',')?;
            Some(Count {
                key: key.to_string(),
                n: n.parse().ok()?,
            })
        }
    }

    #[test]
    fn an_envelope_reads_back_as_its_records() {
        let a = Count {
            key: "b".into(),
            n: 2,
        };
        let b = Count {
            key: "a".into(),
            n: 1,
        };
        let texts = [(encode(&a).unwrap(), 1), (encode(&b).unwrap(), 3)];
        let envelope = Envelope::new("count", texts.iter().map(|(t, n)| (t.as_str(), *n))).unwrap();
        let text = envelope.to_text().unwrap();
        assert_eq!(
            text,
            r#"{"format":2,"kind":"count","records":[[{"key":"a","n":1},3],[{"key":"b","n":2},1]]}"#
        );
        let saved = SavedState::parse(&text).unwrap();
        assert_eq!((saved.format(), saved.kind()), (2, Some("count")));
        assert_eq!(saved.records::<Count>("s"), vec![(b, 3), (a, 1)]);
    }

    #[test]
    fn format_1_reads_through_the_record_type() {
        let saved = SavedState::parse(r#"[["a,1",1],["junk",1],["b,2",-1]]"#).unwrap();
        assert_eq!(saved.format(), 1);
        let records = saved.records::<Count>("s");
        let a = Count {
            key: "a".into(),
            n: 1,
        };
        assert_eq!(records, vec![(a, 1)]);
    }

    #[test]
    fn another_kind_or_a_newer_format_is_not_misread() {
        let other = r#"{"format":2,"kind":"switch","records":[[{"key":"a","n":1},1]]}"#;
        assert!(SavedState::parse(other)
            .unwrap()
            .records::<Count>("s")
            .is_empty());
        let newer = r#"{"format":3,"kind":"count","records":[]}"#;
        let e = SavedState::parse(newer).unwrap_err().to_string();
        assert!(e.contains("format 3"), "{e}");
    }
}
