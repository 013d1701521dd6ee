//! The engine names no connector: sources and sinks plug in through `SourceFactory` /
//! `SinkFactory` and register their own metrics, so no file of `src/` (code or comment) may
//! mention one. Nor does it know what a picture is: the live view samples through a generic
//! hook and the picture column's layout lives in `riffle_formats::picture`.

use std::path::{Path, PathBuf};

/// Connector names, lower case; matched anywhere in a line, in any case.
const CONNECTORS: &[&str] = &[
    "kafka", "video", "rtsp", "jsonl", "images", "annotate", "parquet", "postgres", "redis",
];

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

/// Picture words, lower case: what a frame's columns are called and how they are laid out.
const PICTURE: &[&str] = &["pixel", "rgb8", "\"width\"", "\"height\""];

/// Each line of `src/` (up to a file's unit tests when `production_only`) naming one of `names`.
fn lines_naming(names: &[&str], production_only: bool) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 10,
        "found only {files:?} under {}",
        src.display()
    );
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if production_only && line.trim() == "#[cfg(test)]" {
                break;
            }
            let lower = line.to_lowercase();
            for name in names.iter().filter(|c| lower.contains(*c)) {
                let at = file.strip_prefix(&src).unwrap_or(file).display();
                found.push(format!("src/{at}:{}: `{name}`: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn src_names_no_connector() {
    let found = lines_naming(CONNECTORS, false);
    assert!(
        found.is_empty(),
        "the engine names connectors (move this to the connector):\n{}",
        found.join("\n")
    );
}

#[test]
fn src_knows_no_picture() {
    // Unit tests may use camera-shaped rows as sample data; the code itself may not.
    let found = lines_naming(PICTURE, true);
    assert!(
        found.is_empty(),
        "the engine knows what a picture is (move this to riffle_formats::picture or the \
         vision stages):\n{}",
        found.join("\n")
    );
}
