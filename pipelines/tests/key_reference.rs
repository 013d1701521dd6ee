//! docs/pipeline-spec.md's key reference lists every key the code reads for the model stage and
//! `runtime`: a key missing there is a setting users cannot find (as `executor`,
//! `embedding_devices` and `runtime.gpus` once were).

use riffle_operators::inference::model::{BatchConfig, ModelConfig};
use riffle_pipelines::spec::{CheckpointConfig, RuntimeConfig};
use serde::de::DeserializeOwned;

/// The keys of `T`, a struct that refuses unknown keys: serde names them all in the error for
/// one it does not know.
fn keys<T: DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
    let e = serde_json::from_value::<T>(serde_json::json!({ "no such key": 0 }))
        .expect_err("an unknown key is refused")
        .to_string();
    let (_, listed) = e
        .split_once("expected")
        .unwrap_or_else(|| panic!("serde's message changed: {e}"));
    let keys: Vec<String> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect();
    assert!(!keys.is_empty(), "no keys in {e}");
    keys
}

/// The part of the reference from `heading` to the next heading of its level or above.
fn section(heading: &str) -> String {
    let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/pipeline-spec.md");
    let doc = std::fs::read_to_string(doc).unwrap();
    let level = heading.split(' ').next().unwrap();
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no `{heading}` in docs/pipeline-spec.md"));
    let rest = &doc[start + heading.len() + 2..];
    let end = rest
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|&i| {
            rest[i..].starts_with('#')
                && rest[i..]
                    .split(' ')
                    .next()
                    .is_some_and(|h| h.len() <= level.len())
        })
        .unwrap_or(rest.len());
    rest[..end].to_string()
}

/// Every key, or `prefix.key`, as a row of `section`'s tables (a row may list several keys).
fn missing(section: &str, prefix: &str, keys: &[String]) -> Vec<String> {
    keys.iter()
        .map(|k| format!("{prefix}{k}"))
        .filter(|k| {
            let listed = |line: &str| {
                line.starts_with("| `")
                    && line.split(" | ").next().is_some_and(|cell| {
                        cell.contains(&format!("`{k}`")) || cell.contains(&format!("`{k}."))
                    })
            };
            !section.lines().any(listed)
        })
        .collect()
}

#[test]
fn every_model_key_is_in_the_reference() {
    let model = section("### `model` — an ONNX model");
    let mut absent = missing(&model, "", &keys::<ModelConfig>());
    absent.extend(missing(&model, "batch.", &keys::<BatchConfig>()));
    assert!(
        absent.is_empty(),
        "the model stage's keys missing from docs/pipeline-spec.md: {absent:?}"
    );
}

#[test]
fn every_runtime_key_is_in_the_reference() {
    let runtime = section("## `runtime`");
    let mut absent = missing(&runtime, "", &keys::<RuntimeConfig>());
    absent.extend(missing(
        &runtime,
        "checkpoint.",
        &keys::<CheckpointConfig>(),
    ));
    assert!(
        absent.is_empty(),
        "runtime keys missing from docs/pipeline-spec.md: {absent:?}"
    );
}
