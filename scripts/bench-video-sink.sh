#!/usr/bin/env bash
# The `video` sink's cost (issue #30 item 2): frames per second of the same pipeline (video
# source, person detector, tracker) with a `jsonl` sink and with the `video` sink (H.264, each
# frame drawn and encoded), for 1 and 4 cameras; the median of 3 runs each, as a markdown table
# on standard output (docs/sinks/video.md quotes it).
#
# Arguments: frames per camera (default 300). Needs scripts/media.sh's videos, ONNX Runtime
# (scripts/setup.sh) and a release build of riffle (made here). Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
frames="${1:-300}"

cargo build --quiet --release --bin riffle
riffle="${CARGO_TARGET_DIR:-target}/release/riffle"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# pipeline CAMERAS SINK: the pipeline file's text.
pipeline() {
  local cameras=$1 sink=$2 list="" i
  for ((i = 0; i < cameras; i++)); do
    list+="{ id: c$i, uri: \"$PWD/data/videos/bikes-$i.mp4\", loop: true, max_frames: $frames }, "
  done
  cat <<YAML
name: bench-video-sink
source:
  video: { cameras: [ ${list%, } ], batch_size: 4 }
stages:
  - resize: { width: 300, height: 300, layout: nhwc, dtype: u8, keep_input: true }
  - model:
      path: "$PWD/models/ssdlite_person.onnx"
      inputs: { "image_tensor:0": tensor }
      outputs:
        "detection_boxes:0": { column: boxes, shape: [100, 4] }
        "detection_scores:0": { column: scores, shape: [100] }
        "detection_classes:0": { column: classes, shape: [100] }
      batch: { max_size: 4, max_delay_ms: 5 }
  - detections: { boxes: boxes, scores: scores, classes: classes, box_format: yxyx_normalized, score_threshold: 0.3, keep_classes: [1], labels: { 1: person } }
  - exchange: { key: camera_id }
  - track: {}
  - select: { columns: [camera_id, frame, pts_ms, width, height, pixels, detections] }
runtime: { workers: 2 }
sink: $sink
YAML
}

# fps CAMERAS SINK: the median frames per second of 3 runs, wall clock of the whole run.
fps() {
  local cameras=$1 sink=$2 runs=() run start end
  pipeline "$cameras" "$sink" >"$work/p.yaml"
  for run in 1 2 3; do
    rm -rf "$work/out" "$work/out.jsonl"
    start=$(date +%s.%N)
    RUST_LOG=error "$riffle" run -q "$work/p.yaml" >/dev/null
    end=$(date +%s.%N)
    runs+=("$(awk -v n="$((cameras * frames))" -v s="$start" -v e="$end" 'BEGIN { print n / (e - s) }')")
  done
  printf '%s\n' "${runs[@]}" | sort -g | sed -n 2p
}

jsonl="{ jsonl: { path: \"$work/out.jsonl\" } }"
video="{ video: { dir: \"$work/out\", segment_seconds: 10, fps: 25, crf: 23, preset: veryfast } }"
echo "| cameras | frames | jsonl sink, frames/s | video sink, frames/s | video sink's cost per frame |"
echo "|---:|---:|---:|---:|---:|"
for cameras in 1 4; do
  a=$(fps "$cameras" "$jsonl")
  b=$(fps "$cameras" "$video")
  # The time per frame the video sink adds: 1/b - 1/a, in milliseconds.
  printf '| %d | %d | %.0f | %.0f | %.2f ms |\n' "$cameras" "$((cameras * frames))" "$a" "$b" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN { print 1000 / b - 1000 / a }')"
done
