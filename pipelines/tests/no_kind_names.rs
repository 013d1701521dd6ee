//! Validation, planning and the command line name no source, sink or stage kind: what a kind
//! does differently (fuse a following `resize` into its decoder, stay open for the live view,
//! stand in for itself outside the dataflow) it says through `SourceKind` / `StageKind`
//! methods, so a new kind is its module plus one registration line.

use std::path::{Path, PathBuf};

/// Configuration types of particular kinds (`registry.rs` and `spec.rs` name them; these
/// files must not).
const KIND_TYPES: &[&str] = &[
    "ImagesConfig",
    "VideoConfig",
    "KafkaSourceConfig",
    "KafkaSinkConfig",
    "JsonlSinkConfig",
    "ResizeConfig",
    "ModelConfig",
    "DecodeConfig",
    "TapConfig",
    "ScaleMode",
    "ResizeMode",
    "riffle_connectors::video",
    "vision::resize",
];

/// `SourceConfig::Video`, `StageSpec::Model`, …: an enum of kinds with a variant named.
fn names_a_variant(line: &str) -> Option<String> {
    for enum_name in ["SourceConfig::", "SinkConfig::", "StageSpec::"] {
        let mut rest = line;
        while let Some(at) = rest.find(enum_name) {
            let after = &rest[at + enum_name.len()..];
            let variant: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            // An exchange is a move between workers, not a kind.
            if variant.starts_with(|c: char| c.is_ascii_uppercase()) && variant != "Exchange" {
                return Some(format!("{enum_name}{variant}"));
            }
            rest = after;
        }
    }
    KIND_TYPES
        .iter()
        .find(|t| line.contains(*t))
        .map(|t| t.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn validation_planning_and_the_cli_name_no_kind() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![here.join("src/plan.rs")];
    rust_files(&here.join("src/validate"), &mut files);
    rust_files(&here.join("../src"), &mut files);
    assert!(
        files.len() > 9 && files.iter().all(|f| f.exists()),
        "expected validate/, plan.rs and the CLI's files: {files:?}"
    );
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(name) = names_a_variant(line) {
                found.push(format!(
                    "{}:{}: `{name}`: {}",
                    file.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a kind named outside its module (say it through SourceKind / StageKind):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_a_named_kind() {
    assert_eq!(
        names_a_variant("if let SourceConfig::Video(v) = s {").as_deref(),
        Some("SourceConfig::Video")
    );
    assert_eq!(
        names_a_variant("Some(StageSpec::Resize(r))").as_deref(),
        Some("StageSpec::Resize")
    );
    assert_eq!(names_a_variant("StageSpec::Exchange(e) => x"), None);
    assert_eq!(
        names_a_variant("let s: &ResizeConfig = c;").as_deref(),
        Some("ResizeConfig")
    );
    assert_eq!(names_a_variant("spec.source.value.kind()"), None);
}
