#!/usr/bin/env bash
# The `video` sink's cost (issue #30 items 2 and 6): frames per second of the same pipeline
# (video source, person detector, tracker; 2 workers) with a `jsonl` sink, with the `video` sink
# (H.264, each frame drawn and encoded, files and live stream, on the results' writer) and with
# the `jsonl` sink plus a `tap: { video }` before it (the same encoding, on the workers holding
# the cameras), for 1 and 4 cameras, all in one run of this script, interleaved; the median of 3
# runs each (and their range), as a markdown table on standard output (docs/sinks/video.md
# quotes it).
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

# pipeline CAMERAS SINK [TAP]: the pipeline file's text (TAP: a stage line before the select).
pipeline() {
  local cameras=$1 sink=$2 tap=${3:-} list="" i
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
$tap
  - select: { columns: [camera_id, frame, pts_ms, width, height, pixels, detections] }
runtime: { workers: 2 }
sink: $sink
YAML
}

# once CAMERAS SINK [TAP]: frames per second of one run, wall clock of the whole run; the
# frames encoded are checked to be every frame.
once() {
  local cameras=$1 sink=$2 tap=${3:-} start end encoded f
  pipeline "$cameras" "$sink" "$tap" >"$work/p.yaml"
  rm -rf "$work/out" "$work/out.jsonl"
  start=$(date +%s.%N)
  RUST_LOG=error "$riffle" run -q "$work/p.yaml" >/dev/null
  end=$(date +%s.%N)
  if [[ -d $work/out ]]; then
    encoded=0
    for f in "$work"/out/*/*.mp4; do
      encoded=$((encoded + $(ffprobe -v error -count_frames -select_streams v:0 \
        -show_entries stream=nb_read_frames -of csv=p=0 "$f")))
    done
    if ((encoded != cameras * frames)); then
      echo "encoded $encoded frames, expected $((cameras * frames))" >&2
      exit 1
    fi
  fi
  awk -v n="$((cameras * frames))" -v s="$start" -v e="$end" 'BEGIN { print n / (e - s) }'
}

# median VALUES...: "median (min–max)" and the median alone on the next line.
median() {
  local sorted
  sorted=$(printf '%s\n' "$@" | sort -g)
  printf '%.0f (%.0f–%.0f)\n%s\n' "$(sed -n 2p <<<"$sorted")" "$(head -1 <<<"$sorted")" \
    "$(tail -1 <<<"$sorted")" "$(sed -n 2p <<<"$sorted")"
}

jsonl="{ jsonl: { path: \"$work/out.jsonl\" } }"
video="{ video: { dir: \"$work/out\", segment_seconds: 10, fps: 25, crf: 23, preset: veryfast } }"
tap="  - tap: $video"
echo "| cameras | frames | jsonl sink, frames/s | video sink, frames/s | jsonl + video tap, frames/s | video sink's cost per frame | tap's cost per frame |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for cameras in 1 4; do
  a=() b=() c=()
  # Interleaved, so a slow spell of the machine falls on all three alike.
  for run in 1 2 3; do
    a+=("$(once "$cameras" "$jsonl")")
    b+=("$(once "$cameras" "$video")")
    c+=("$(once "$cameras" "$jsonl" "$tap")")
  done
  { read -r ra; read -r ma; } < <(median "${a[@]}")
  { read -r rb; read -r mb; } < <(median "${b[@]}")
  { read -r rc; read -r mc; } < <(median "${c[@]}")
  # The time per frame each adds: 1/b - 1/a, in milliseconds.
  printf '| %d | %d | %s | %s | %s | %.2f ms | %.2f ms |\n' "$cameras" "$((cameras * frames))" \
    "$ra" "$rb" "$rc" "$(awk -v a="$ma" -v b="$mb" 'BEGIN { print 1000 / b - 1000 / a }')" \
    "$(awk -v a="$ma" -v c="$mc" 'BEGIN { print 1000 / c - 1000 / a }')"
done
