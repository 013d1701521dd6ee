#!/usr/bin/env bash
# How cost grows with cameras (issue #31 item 3): the detector + tracker job over 1, 2, 4, 8 and
# 16 live cameras at a low rate (each a 60 s camera-like clip of data/videos/live/, H.264 at
# CRF 20 with a keyframe a second, read in real time, looped, sampled at SAMPLE_FPS, 2 by
# default: 32 frames/s at 16 cameras, under this job's capacity on 2 cores),
# REPS interleaved rounds. Per camera count: frames/s, peak RSS (GNU time), results-ready and
# written p99 (the run's summary), and frames dropped by the source; then the memory each camera
# adds (the slope of peak RSS over the counts). Writes docs/benchmarks/camera-growth.md. Run it
# on a quiet machine.
#
#   scripts/bench-camera-growth.sh          # REPS=3 SECONDS_PER_RUN=20 COUNTS="1 2 4 8 16"
#
# BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
REPS=${REPS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-20}
SAMPLE_FPS=${SAMPLE_FPS:-2}
COUNTS=${COUNTS:-"1 2 4 8 16"}
[ -f models/ssdlite_person.onnx ] && [ -f data/videos/bikes-0.mp4 ] \
  || { echo "bench-camera-growth: run scripts/setup.sh first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench-camera-growth: needs GNU time (/usr/bin/time)" >&2; exit 1; }
cargo build --quiet --release --bin riffle
riffle="${CARGO_TARGET_DIR:-target}/release/riffle"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
frames=$((SECONDS_PER_RUN * SAMPLE_FPS))

# pipeline N: camera-tracking's stages over N looped real-time clips, sampled.
pipeline() {
  local n=$1 list="" i
  for ((i = 0; i < n; i++)); do
    list+="{ id: c$i, uri: \"$PWD/data/videos/live/bikes-$((i % 4)).mp4\" }, "
  done
  sed -n '/^stages:/,/^  - select:/p' pipelines/camera-tracking.yaml \
    | sed -e '$d' -e '/^  - decode:/d' -e "s#\.\./models/#$PWD/models/#" >"$work/stages.yaml"
  cat <<YAML
name: camera-growth
source:
  video:
    cameras: [ ${list%, } ]
    loop: true
    realtime: true
    sample_fps: $SAMPLE_FPS
    max_frames: $frames
    batch_size: 4
$(cat "$work/stages.yaml")
  - select: { columns: [camera_id, frame, detections_count] }
sink: { jsonl: { path: "$work/out.jsonl" } }
runtime: { workers: 2, intra_op_threads: 1, epoch_ms: 100 }
YAML
}

lines="$work/lines.txt"
: >"$lines"
for r in $(seq 1 "$REPS"); do
  for n in $COUNTS; do
    pipeline "$n" >"$work/p$n.yaml"
    rm -f "$work/out.jsonl"
    /usr/bin/time -f "RSS_KB %M" "$riffle" run "$work/p$n.yaml" >"$work/log" 2>&1 || {
      echo "round $r: $n cameras FAILED: $(tail -3 "$work/log")" >&2
      continue
    }
    line=$(python3 - "$work/log" "$n" "$work/out.jsonl" <<'PY'
import re, sys
log, n, out = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
def ms(text):
    value, unit = text.split()
    return float(value) * {"µs": 1e-3, "ms": 1.0, "s": 1000.0}[unit]
lat = re.search(r"results ready p50 (\S+ \S+) p99 (\S+ \S+) .*written p50 (\S+ \S+) p99 (\S+ \S+)", log)
m = re.search(r"results: (\d+) in ([\d.]+) s = ([\d.]+) records/s", log)
rss = re.search(r"RSS_KB (\d+)", log)
dropped = sum(float(v) for v in re.findall(r"riffle_video_frames_dropped_total\{[^}]*\} ([\d.]+)", log))
results = sum(1 for _ in open(out))
print(f"cameras={n} results={results} fps={m.group(3)} ready_p99_ms={ms(lat.group(2)):.1f} "
      f"written_p99_ms={ms(lat.group(4)):.1f} rss_mb={int(rss.group(1)) / 1024:.0f} dropped={dropped:.0f}")
PY
)
    echo "round $r: $line" >&2
    echo "$r $line" >>"$lines"
  done
done

table="$work/table.md"
python3 - "$lines" "$frames" >"$table" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    words = line.split()
    f = dict(w.split("=", 1) for w in words[1:])
    runs[int(f["cameras"])].append(f)
def spread(values, digits=0):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"
print("| cameras | frames/s | results (expected) | results ready p99 ms | written p99 ms | peak RSS MB | dropped frames |")
print("|---:|---:|---:|---:|---:|---:|---:|")
rss = {}
for n in sorted(runs):
    rs = runs[n]
    get = lambda k: [float(r[k]) for r in rs]
    rss[n] = statistics.median(get("rss_mb"))
    print(f"| {n} | {spread(get('fps'), 1)} | {spread(get('results'))} ({n * int(sys.argv[2])}) | "
          f"{spread(get('ready_p99_ms'))} | {spread(get('written_p99_ms'))} | {spread(get('rss_mb'))} | "
          f"{spread(get('dropped'))} |")
if len(rss) >= 2:
    xs, ys = list(rss), [rss[n] for n in rss]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    print()
    print(f"Memory per camera (least-squares slope of the median peak RSS over the camera counts): "
          f"**{slope:.1f} MB**; with {min(xs)} camera(s) {rss[min(xs)]:.0f} MB, with {max(xs)} {rss[max(xs)]:.0f} MB.")
PY
description=$(cat <<TEXT
The detector + tracker stages of \`pipelines/camera-tracking.yaml\` (resize 300×300 u8 → SSD-Lite
→ detections → track; 2 workers × 1 ONNX Runtime thread, \`epoch_ms: 100\`) over N live cameras:
each a 60 s 640×272 H.264 clip encoded as a camera sends (\`live/bikes-(i mod 4).mp4\`: CRF 20,
a keyframe a second) read in real time at its 25 fps (every frame decoded: H.264 cannot skip
them), sampled at $SAMPLE_FPS fps, $frames frames per camera ($SECONDS_PER_RUN s). $REPS round(s),
the camera counts interleaved within each; median (min–max). frames/s is results over the whole
run (model loading included); latency is from a frame's read: *ready* when its result exists at
the sink operator (what the live view sees), *written* when its epoch commits; peak RSS is GNU
time's maximum resident set of the process; dropped frames are the video source's
\`riffle_video_frames_dropped_total\` (its queue full).
TEXT
)
bench_doc docs/benchmarks/camera-growth.md "How cost grows with cameras" \
  "scripts/bench-camera-growth.sh (REPS=$REPS)" "$description" "$table"
{ echo; echo "Raw lines:"; echo; echo '```'; cat "$lines"; echo '```'; } >>docs/benchmarks/camera-growth.md
echo "bench-camera-growth: wrote docs/benchmarks/camera-growth.md"
cat "$table"
