//! The analytics stages as a pipeline file writes them: YAML keys, defaults, stateful steps.

use std::path::Path;

use riffle_pipelines::validate::parse;

const PIPELINE: &str = r#"
source: { ipc: { path: frames.arrow } }
stages:
  - line_count:
      lines: [{ name: door, from: [0, 400], to: [640, 400] }]
      window_frames: 1500
  - zone:
      zones: [{ name: desk, polygon: [[0, 0], [10, 0], [10, 10]] }]
      anchor: center
  - crop: { width: 224, height: 224, padding: 0.1 }
  - crop: { width: 96, height: 96, reinfer_every: 10 }
sink: { stdout: {} }
"#;

#[test]
fn analytics_stages_parse_with_their_keys_and_defaults() {
    let spec = parse(Path::new("p.yaml"), PIPELINE).expect("parses");
    let kinds: Vec<&str> = spec.stages.iter().map(|s| s.value.kind()).collect();
    assert_eq!(kinds, ["line_count", "zone", "crop", "crop"]);
    let stateful: Vec<bool> = spec
        .stages
        .iter()
        .map(|s| s.value.stage().is_some_and(|k| k.stateful()))
        .collect();
    // crop keeps state only with reinfer_every.
    assert_eq!(stateful, [true, true, false, true]);
}

#[test]
fn an_unknown_analytics_key_names_its_line() {
    let text = PIPELINE.replace("anchor: center", "anchor: feet");
    let e = parse(Path::new("p.yaml"), &text).expect_err("unknown anchor");
    assert_eq!(e.line, Some(9), "{e}");
}
