//! Pins the checkpoint encoding of operator state: checkpoint files written by this version
//! (format 2) and by the version before it (format 1) are committed under
//! `tests/fixtures/state/` and must keep decoding to the same values, so that a checkpoint
//! written by one version is read by the next.
//!
//! The files are checkpoints of epoch 12 holding a keyed stage (`track`), a model's version
//! switches (`model`) and candidate windows (`candidates`). Writing today's values must give
//! today's file byte for byte; after a deliberate format change, bless a new fixture with
//! `RIFFLE_BLESS=1 cargo test -p riffle-dataflow --test state_format` and keep the old ones.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use riffle_dataflow::checkpoint::{Checkpoint, CheckpointStore};
use riffle_dataflow::operators::{KeyedRecord, StateKey, Switch};
use riffle_dataflow::state::{encode, Envelope, SavedState, StateRecord, FORMAT};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

const EPOCH: u64 = 12;

/// The `candidates` stage's record (`riffle_operators::tabular::recs::WindowClick`), mirrored: a
/// window (`p` popularity, `s` seen) and a click's user, item and time.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct WindowClick(String, i64, i64, i64);

impl StateRecord for WindowClick {
    const KIND: &'static str = "candidates";

    fn from_v1(text: &str) -> Option<Self> {
        let f: Vec<&str> = text.split(',').collect();
        let [w, u, i, t] = f[..] else { return None };
        Some(WindowClick(
            w.to_string(),
            u.parse().ok()?,
            i.parse().ok()?,
            t.parse().ok()?,
        ))
    }
}

fn tracks() -> Vec<(KeyedRecord<Value>, isize)> {
    vec![
        (
            KeyedRecord {
                key: StateKey::Text("cam-1".into()),
                state: json!({"next_id": 3, "tracks": [[1, 0.5, [10.0, 20.0, 30.0, 40.0]]]}),
            },
            1,
        ),
        (
            KeyedRecord {
                key: StateKey::Int(42),
                state: json!({"next_id": 1, "tracks": []}),
            },
            1,
        ),
    ]
}

fn switches() -> Vec<(Switch<u64>, isize)> {
    vec![
        (
            Switch {
                from_epoch: 0,
                value: 1,
            },
            1,
        ),
        (
            Switch {
                from_epoch: 9,
                value: 2,
            },
            1,
        ),
    ]
}

fn clicks() -> Vec<(WindowClick, isize)> {
    vec![
        (WindowClick("p".into(), 7, 42, 1000), 2),
        (WindowClick("s".into(), 7, 42, 1000), 1),
    ]
}

fn checkpoint(state: BTreeMap<String, String>) -> Checkpoint {
    Checkpoint {
        epoch: EPOCH,
        workers: 2,
        sources: BTreeMap::from([("numbers".into(), BTreeMap::from([(0, 13), (1, 12)]))]),
        state,
    }
}

/// The stage's entry as the runtime writes it: its records' texts in an envelope.
fn entry<R: StateRecord>(records: &[(R, isize)]) -> String {
    let texts: Vec<(String, isize)> = records
        .iter()
        .map(|(r, n)| (encode(r).unwrap(), *n))
        .collect();
    let envelope = Envelope::new(R::KIND, texts.iter().map(|(t, n)| (t.as_str(), *n))).unwrap();
    envelope.to_text().unwrap()
}

/// Today's checkpoint (format 2).
fn today() -> Checkpoint {
    checkpoint(BTreeMap::from([
        ("operator.track".into(), entry(&tracks())),
        ("operator.model".into(), entry(&switches())),
        ("operator.candidates".into(), entry(&clicks())),
        ("sink.position".into(), "5".into()),
    ]))
}

/// The same state as the version before wrote it (format 1): bare lists of operator-specific
/// texts, sorted.
fn format_1() -> Checkpoint {
    let list = |records: &[(&str, isize)]| serde_json::to_string(records).unwrap();
    checkpoint(BTreeMap::from([
        (
            "operator.track".into(),
            list(&[
                ("i:42\t{\"next_id\":1,\"tracks\":[]}", 1),
                (
                    "s:cam-1\t{\"next_id\":3,\"tracks\":[[1,0.5,[10.0,20.0,30.0,40.0]]]}",
                    1,
                ),
            ]),
        ),
        ("operator.model".into(), list(&[("0:1", 1), ("9:2", 1)])),
        (
            "operator.candidates".into(),
            list(&[("p,7,42,1000", 2), ("s,7,42,1000", 1)]),
        ),
        ("sink.position".into(), "5".into()),
    ]))
}

fn fixtures(format: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/state/format-{format}"))
}

/// The fixture checkpoint of `format`, read as a restart reads it (written first when
/// blessing).
fn read_fixture(format: u32, blessed: impl Fn() -> Checkpoint) -> Checkpoint {
    let dir = fixtures(format);
    if std::env::var_os("RIFFLE_BLESS").is_some() {
        CheckpointStore::open(&dir, 2)
            .and_then(|s| s.write(&blessed()))
            .unwrap();
    }
    CheckpointStore::open(&dir, 2)
        .and_then(|s| s.at(EPOCH))
        .unwrap()
        .unwrap_or_else(|| panic!("no checkpoint of epoch {EPOCH} in {}", dir.display()))
}

/// The three stages' state: tracks as text, the version schedule, the window clicks.
type Decoded = (Vec<String>, Vec<(u64, u64)>, Vec<(WindowClick, isize)>);

/// Each stage's state decoded as the stage decodes it, sorted.
fn decoded(c: &Checkpoint) -> Decoded {
    let saved = |stage: &str| SavedState::parse(&c.state[&format!("operator.{stage}")]).unwrap();
    let mut tracks: Vec<String> = saved("track")
        .records::<KeyedRecord<Value>>("track")
        .into_iter()
        .map(|(r, n)| format!("{:?} {} ×{n}", r.key, r.state))
        .collect();
    tracks.sort();
    let switches = Switch::<u64>::schedule(&saved("model"), "model")
        .into_iter()
        .collect();
    let mut clicks = saved("candidates").records::<WindowClick>("candidates");
    clicks.sort_by_key(|(c, _)| c.0.clone());
    (tracks, switches, clicks)
}

#[test]
fn todays_checkpoint_file_decodes_to_its_values() {
    let file = read_fixture(2, today);
    assert_eq!(FORMAT, 2);
    for stage in ["track", "model", "candidates"] {
        let saved = SavedState::parse(&file.state[&format!("operator.{stage}")]).unwrap();
        assert_eq!(saved.format(), 2, "{stage}");
    }
    let (tracks, switches, clicks) = decoded(&file);
    assert_eq!(
        tracks,
        vec![
            r#"Int(42) {"next_id":1,"tracks":[]} ×1"#,
            r#"Text("cam-1") {"next_id":3,"tracks":[[1,0.5,[10.0,20.0,30.0,40.0]]]} ×1"#,
        ]
    );
    assert_eq!(switches, vec![(0, 1), (9, 2)]);
    assert_eq!(clicks, self::clicks());
    assert_eq!(file.sources["numbers"], BTreeMap::from([(0, 13), (1, 12)]));
    assert_eq!(file.state["sink.position"], "5");
    // This version writes the same file.
    assert_eq!(file, today());
}

#[test]
fn the_previous_formats_checkpoint_file_decodes_to_the_same_values() {
    let old = read_fixture(1, format_1);
    for stage in ["track", "model", "candidates"] {
        let saved = SavedState::parse(&old.state[&format!("operator.{stage}")]).unwrap();
        assert_eq!(saved.format(), 1, "{stage}");
    }
    assert_eq!(decoded(&old), decoded(&today()));
}
