//! Non-maximum suppression: of overlapping boxes of one object, the best-scoring one is kept;
//! `suppress` applies it per class (or across classes) and keeps the best detections.

use std::collections::BTreeMap;

use super::{Detection, DetectionsConfig};

/// Indices of the boxes greedy NMS keeps, best score first: a box is suppressed when its IoU
/// with an already kept box exceeds `iou_threshold`. Boxes are `[x1, y1, x2, y2]`.
pub fn non_max_suppression(boxes: &[[f32; 4]], scores: &[f32], iou_threshold: f32) -> Vec<usize> {
    // (index, box, score) of the first `min(boxes, scores)` boxes.
    let mut order: Vec<(usize, &[f32; 4], f32)> = boxes
        .iter()
        .zip(scores)
        .enumerate()
        .map(|(i, (b, &s))| (i, b, s))
        .collect();
    // NaN scores sort last; equal scores keep input order.
    order.sort_by(|&(_, _, a), &(_, _, b)| {
        b.partial_cmp(&a)
            .unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
    });
    let mut kept: Vec<(usize, &[f32; 4])> = Vec::new();
    for (i, b, _) in order {
        if kept.iter().all(|&(_, k)| iou(k, b) <= iou_threshold) {
            kept.push((i, b));
        }
    }
    kept.into_iter().map(|(i, _)| i).collect()
}

/// Intersection over union of two `[x1, y1, x2, y2]` boxes; 0 when the union is empty.
fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |r: &[f32; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// The detections NMS keeps of `candidates` (per class unless `class_agnostic`), best first,
/// at most `max_detections`.
pub(super) fn suppress(cfg: &DetectionsConfig, candidates: Vec<Detection>) -> Vec<Detection> {
    let mut groups: BTreeMap<i64, Vec<Detection>> = BTreeMap::new();
    for d in candidates {
        let group = if cfg.class_agnostic { 0 } else { d.class_id };
        groups.entry(group).or_default().push(d);
    }
    let mut kept = Vec::new();
    for candidates in groups.values() {
        if cfg.iou_threshold >= 1.0 {
            kept.extend_from_slice(candidates);
            continue;
        }
        let rects: Vec<[f32; 4]> = candidates.iter().map(|d| d.rect).collect();
        let scores: Vec<f32> = candidates.iter().map(|d| d.score).collect();
        let keep = non_max_suppression(&rects, &scores, cfg.iou_threshold);
        kept.extend(keep.into_iter().filter_map(|i| candidates.get(i).copied()));
    }
    // Scores passed the threshold, so none is NaN here.
    kept.sort_by(|a, b| b.score.total_cmp(&a.score));
    kept.truncate(cfg.max_detections);
    kept
}
