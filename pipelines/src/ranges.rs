//! Every number in a pipeline file has a range, checked before anything reads it: a worker
//! count of 2^63 or a batch delay of 2^63 ms is a typo, and left alone it becomes a capacity
//! overflow, an allocation of gigabytes or a run that never ends.
//!
//! Ranges go by key name (the last key of a field's path, or the last two), wherever the key
//! appears: the same name means the same kind of quantity in every stage. A source or sink
//! kind declares its own keys' ranges beside them (`riffle_connectors::Limits`); those come
//! first in its block, then these.
//! Numbers under no rule must be integers that fit 32 bits or finite decimals. Maps of
//! client options (`options`, `topic_config`) hold strings and are not looked at.

use riffle_dataflow::range::Range;
use serde_json::Value;

const fn int(key: &'static str, min: i64, max: i64) -> Range {
    Range::int(key, min, max)
}

const fn real(key: &'static str, min: f64, max: f64) -> Range {
    Range::real(key, min, max)
}

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// Ten years, in seconds: windows over event time.
const DECADE_S: i64 = 10 * 365 * 24 * 3600;

/// The ranges of the runtime's and the stages' keys, most specific key first
/// (docs/pipeline-spec.md lists them too, with the connectors' own).
pub const RANGES: &[Range] = &[
    // runtime
    int("workers", 1, 1024),
    int("intra_op_threads", 1, 1024),
    int("epoch_records", 1, 10_000_000),
    int("epoch_ms", 1, HOUR_MS),
    int("max_epochs_in_flight", 1, 1024),
    int("peer_timeout_ms", 1, HOUR_MS),
    int("checkpoint.keep", 2, 1000),
    int("checkpoint.interval_ms", 0, DAY_MS),
    int("checkpoint.give_up_s", 1, DAY_MS / 1000),
    int("checkpoint.lease_s", 3, HOUR_MS / 1000),
    int("checkpoint.timeout_s", 1, 3600),
    int("slow_worker.worker", 0, 1023),
    int("slow_worker.delay_ms", 0, 60_000),
    real("max_dead_letter_ratio", 0.0, 1.0),
    // batching
    int("batch.max_size", 1, 65_536),
    int("batch.max_delay_ms", 0, 60_000),
    int("late_after_ms", 0, HOUR_MS),
    // decoding limits
    int("max_pixels", 1, i32::MAX as i64 / 3),
    int("max_batch_bytes", 1, i32::MAX as i64),
    // images
    int("width", 1, 16_384),
    int("height", 1, 16_384),
    real("std", 1e-9, 1e9),
    real("mean", -1e9, 1e9),
    real("min_size", 0.0, 16_384.0),
    real("padding", 0.0, 16_384.0),
    int("reinfer_every", 1, 1_000_000),
    // detections and tracking
    real("score_threshold", 0.0, 1.0),
    real("iou_threshold", 0.0, 1.0),
    real("high_threshold", 0.0, 1.0),
    real("low_threshold", 0.0, 1.0),
    real("new_track_threshold", 0.0, 1.0),
    real("match_iou", 0.0, 1.0),
    int("max_detections", 1, 100_000),
    int("track_buffer", 1, 1_000_000),
    int("forget_after_frames", 1, 1_000_000_000),
    int("window_frames", 1, 1_000_000_000),
    real("fps", 1e-6, 1000.0),
    // recommendations
    int("max_candidates", 1, 100_000),
    int("seen_window", 1, DECADE_S),
    int("window", 1, DECADE_S),
    int("k", 1, 10_000),
];

/// Subtrees of strings for other programs (librdkafka properties, topic configs).
const OPAQUE: &[&str] = &["options", "topic_config"];

/// A number out of its range: the field's path below the top-level key and the message.
#[derive(Debug, PartialEq)]
pub struct OutOfRange {
    /// `runtime`, `source`, `sink`, `dead_letter` or `stages[i]`.
    pub top: String,
    /// The rest of the path, dotted (`kafka.batch_size`, `model.batch.max_size`).
    pub path: String,
    pub message: String,
}

/// The first number of `document` (the pipeline file as a YAML value) out of its range, with
/// no connector's own ranges (see [`check_with`]).
pub fn check(document: &Value) -> Result<(), OutOfRange> {
    check_with(document, &|_| &[])
}

/// The first number of `document` out of its range; `own` gives a top-level block's own
/// ranges (`source` → its kind's), looked at before the stages' and runtime's.
pub fn check_with(
    document: &Value,
    own: &dyn Fn(&str) -> &'static [Range],
) -> Result<(), OutOfRange> {
    let Value::Object(top) = document else {
        return Ok(());
    };
    for (key, value) in top {
        match value {
            Value::Array(stages) if key == "stages" => {
                for (i, stage) in stages.iter().enumerate() {
                    walk(stage, &mut Vec::new(), &format!("stages[{i}]"), &[])?;
                }
            }
            value => walk(value, &mut Vec::new(), key, own(key))?,
        }
    }
    Ok(())
}

fn walk<'a>(
    value: &'a Value,
    path: &mut Vec<&'a str>,
    top: &str,
    own: &'static [Range],
) -> Result<(), OutOfRange> {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                if OPAQUE.contains(&key.as_str()) {
                    continue;
                }
                path.push(key);
                walk(inner, path, top, own)?;
                path.pop();
            }
            Ok(())
        }
        // A list's numbers share its key's range (`mean: [0.5, 0.5, 0.5]`).
        Value::Array(items) => items.iter().try_for_each(|item| walk(item, path, top, own)),
        Value::Number(n) => check_number(n, path, own).map_err(|message| OutOfRange {
            top: top.to_string(),
            path: path.join("."),
            message,
        }),
        _ => Ok(()),
    }
}

/// The rule for a field's whole dotted path (`stages[2].model.batch.max_size`), by its keys
/// alone: the kinds' own ranges are not known while the file does not parse.
pub(crate) fn rule_at(field: &str) -> Option<&'static Range> {
    let keys = crate::locate::split_path(field);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    rule_for(&keys, &[])
}

fn rule_for(path: &[&str], own: &'static [Range]) -> Option<&'static Range> {
    own.iter().chain(RANGES).find(|r| r.applies_to(path))
}

fn check_number(
    n: &serde_json::Number,
    path: &[&str],
    own: &'static [Range],
) -> Result<(), String> {
    let value = n.as_f64().unwrap_or(f64::NAN);
    let shown = n.to_string();
    let whole = n.is_i64() || n.is_u64();
    match rule_for(path, own) {
        Some(r) => r.check_value(value, whole, &shown),
        None if whole => {
            let limit = i32::MAX as f64;
            if value.abs() > limit {
                return Err(format!(
                    "expected an integer from {} to {}, found {shown}",
                    i32::MIN,
                    i32::MAX
                ));
            }
            Ok(())
        }
        None if !value.is_finite() => Err(format!("expected a finite number, found {shown}")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(yaml: &str) -> Value {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn huge_and_zero_counts_are_out_of_range_with_the_allowed_range() {
        let e = check(&doc("runtime: { workers: 9223372036854775807 }")).unwrap_err();
        assert_eq!(e.top, "runtime");
        assert_eq!(e.path, "workers");
        assert_eq!(
            e.message,
            "expected an integer from 1 to 1024, found 9223372036854775807"
        );
        let e = check(&doc(
            "stages:\n  - resize: {width: 8}\n  - model: { batch: { max_size: 0 } }",
        ))
        .unwrap_err();
        assert_eq!(
            (e.top.as_str(), e.path.as_str()),
            ("stages[1]", "model.batch.max_size")
        );
        assert!(e.message.contains("from 1 to 65536"), "{}", e.message);
    }

    #[test]
    fn fractions_thresholds_and_lists_are_checked() {
        let e = check(&doc("stages: [ { detections: { score_threshold: 1.5 } } ]")).unwrap_err();
        assert!(
            e.message.contains("from 0 to 1, found 1.5"),
            "{}",
            e.message
        );
        let e = check(&doc("stages: [ { resize: { std: [1, 0, 1] } } ]")).unwrap_err();
        assert_eq!(e.path, "resize.std");
        let e = check(&doc("runtime: { epoch_records: 2.5 }")).unwrap_err();
        assert!(
            e.message.starts_with("expected an integer"),
            "{}",
            e.message
        );
    }

    #[test]
    fn numbers_under_no_rule_fit_32_bits_and_options_are_not_numbers() {
        let e = check(&doc("source: { images: { unknown_count: 99999999999 } }")).unwrap_err();
        assert_eq!(e.path, "images.unknown_count");
        assert!(check(&doc(
            "source: { kafka: { options: { fetch.max.bytes: 99999999999 } } }"
        ))
        .is_ok());
        assert!(check(&doc(
            "runtime: { workers: 2, epoch_records: 64 }\nstages: [ { detections: { labels: { 1: person } } } ]"
        ))
        .is_ok());
    }

    #[test]
    fn a_connectors_own_ranges_bound_its_block_in_a_loaded_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(
            &file,
            "source:\n  jsonl:\n    path: in.jsonl\n    max_line_bytes: 0\nsink: { stdout: {} }\n",
        )
        .unwrap();
        let Err(e) = crate::load(&file, None) else {
            panic!("max_line_bytes: 0 is out of the jsonl source's range");
        };
        assert_eq!(e.field, "source.jsonl.max_line_bytes");
        assert_eq!(e.line, Some(4));
        assert_eq!(
            e.message,
            "expected an integer from 1 to 268435456, found 0"
        );
        // The same key under no connector is only a number that fits 32 bits.
        assert!(check(&doc("stages: [ { x: { max_line_bytes: 0 } } ]")).is_ok());
    }

    #[test]
    fn every_range_is_in_the_spec_reference() {
        let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/pipeline-spec.md");
        let doc = std::fs::read_to_string(doc).unwrap();
        let connectors = riffle_connectors::source_ranges()
            .into_iter()
            .chain(riffle_connectors::sink_ranges())
            .flat_map(|r| r.iter());
        for r in RANGES.iter().chain(connectors) {
            assert!(
                doc.contains(&format!("| `{}` |", r.key)),
                "docs/pipeline-spec.md's range table lacks `{}`",
                r.key
            );
        }
    }

    #[test]
    fn shipped_pipelines_are_in_range() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut checked = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                // `${VAR}`s are strings here: only numbers are looked at.
                check(&doc(&text)).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
                checked += 1;
            }
        }
        assert!(checked >= 5, "{checked} pipeline files");
    }
}
