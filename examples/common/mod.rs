//! What the benchmark examples share: how a figure is reported.
#![allow(dead_code)]

use std::path::PathBuf;

use anyhow::Context;

/// The `riffle` binary a benchmark runs (`RIFFLE_BIN`, which `script` sets) and the rounds
/// asked for (the first argument, 3 by default).
pub fn binary_and_rounds(script: &str) -> anyhow::Result<(PathBuf, usize)> {
    let riffle = std::env::var("RIFFLE_BIN").with_context(|| {
        format!("RIFFLE_BIN: the riffle binary to run ({script} builds and sets it)")
    })?;
    let rounds = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(3);
    Ok((PathBuf::from(riffle), rounds))
}

/// `median (min–max)` of `values` with `digits` decimals; `-` when there are none.
pub fn spread(values: &[f64], digits: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let (Some(&min), Some(&max)) = (v.first(), v.last()) else {
        return "-".to_string();
    };
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
}

/// The `q` quantile (nearest rank) of `values`, which must not be empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

/// The peers' detect job as pipeline stages (YAML, under `stages:`): decode, resize 300×300 u8,
/// SSDLite one frame per call, persons over 0.5, then camera, frame and person count.
pub fn detect_stages(repo: &std::path::Path) -> String {
    format!(
        r#"  - decode: {{}}
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: {model}
      inputs:
        "image_tensor:0": tensor
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: 1 }}
  - detections:
      boxes: boxes
      scores: scores
      classes: classes
      box_format: yxyx_normalized
      score_threshold: 0.5
      keep_classes: [1]
      iou_threshold: 0.5
  - select: {{ columns: [camera_id, frame, detections_count] }}
"#,
        model = repo.join("models/ssdlite_person.onnx").display(),
    )
}
