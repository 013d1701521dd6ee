#!/usr/bin/env bash
# Python in Riffle, measured (issue #32 item 5), in one run of interleaved rounds so machine noise
# hits every side alike. Writes docs/benchmarks/python.md. Run it on a quiet machine.
#
#   1. A Python stage against the same logic in Rust: the peers' detect job with its
#      post-processing (person boxes over 0.5, counted per frame) as Riffle's `detections` and
#      `select` stages, and as a Python stage running the peers' NumPy code (examples/bench_job.rs
#      detect / detect-py): items/s and the post-processing's p50 per batch.
#   2. The same Python post-processing in both: Riffle's detect-py against Bytewax's detect
#      (2 workers, scripts/peers; skipped, and said so, where the peers' venv cannot be made).
#   3. The camera job (pipelines/camera-video.yaml, its 4 videos looped to 750 frames each) run
#      by the CLI and by Python (`riffle.run`, the release wheel): each command's wall clock,
#      start to exit.
# Each row's outputs are checked equal across its sides (detect: person frames and boxes;
# camera job: a digest of every result's camera, frame, count and boxes to the pixel), or the
# ratio reads "outputs differ".
#
#   scripts/bench-python.sh           # REPS=3
#
# The peers' venv (for the Bytewax rows) is made first if missing: scripts/peers/setup.sh.
#
# BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
REPS=${REPS:-3}
[ -f models/ssdlite_person.onnx ] && [ -f data/videos/bikes-0.mp4 ] \
  || { echo "bench-python: run scripts/setup.sh first" >&2; exit 1; }
target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --release --bin riffle --example bench_job
# The release wheel, in a venv of its own with NumPy (for the Python stage's code).
tools="$target/python-tools"
[ -x "$tools/bin/maturin" ] || { python3 -m venv "$tools"; "$tools/bin/pip" install --quiet maturin==1.16.0; }
rm -rf "$target/wheels-release"
"$tools/bin/maturin" build --quiet --release --auditwheel skip \
  --manifest-path python/Cargo.toml --out "$target/wheels-release"
venv="$target/python-bench"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
wheel=$(ls "$target"/wheels-release/riffle-*.whl)
PIP_ROOT_USER_ACTION=ignore "$venv/bin/pip" install --quiet "$wheel" numpy
PIP_ROOT_USER_ACTION=ignore "$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheel"
export VIRTUAL_ENV="$PWD/$venv"
bytewax=1
peers_python=$(scripts/peers/setup.sh) \
  || { bytewax=0; echo "bench-python: scripts/peers/setup.sh failed: no Bytewax rows" >&2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lines="$work/lines.txt"
: >"$lines"
# The camera job: camera-video.yaml with its paths absolute, each video looped to 750 frames.
sed -e "s#\.\./#$PWD/#g" \
  -e 's#^\(    queue_size: 8\).*#\1\n    loop: true\n    max_frames: 750#' \
  pipelines/camera-video.yaml >"$work/camera.yaml"
grep -q "max_frames: 750" "$work/camera.yaml" || { echo "bench-python: camera-video.yaml changed shape" >&2; exit 1; }
# Its outputs as one digest: each result's camera, frame, count and boxes to the pixel (a
# batch's make-up moves a box's last float digits, not its pixels), sorted.
digest() {
  python3 - "$1" <<'PY'
import hashlib, json, sys
rows = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    boxes = [tuple(round(d[k]) for k in ("x1", "y1", "x2", "y2")) for d in r["detections"]]
    rows.append(f'{r["camera_id"]}:{r["frame"]}:{r["detections_count"]}:{sorted(boxes)}')
print(hashlib.sha1("\n".join(sorted(rows)).encode()).hexdigest()[:12])
PY
}
for r in $(seq 1 "$REPS"); do
  for job in detect detect-py; do
    line=$("$target/release/examples/bench_job" "$job" 2>"$work/job.log" | grep '^PEER ' | tail -1) \
      || line="FAILED riffle $job: $(tail -1 "$work/job.log")"
    echo "round $r: $line" >&2
    echo "$r $line" >>"$lines"
  done
  if [ "$bytewax" = 1 ]; then
    line=$(PEERS_PYTHON="$peers_python" PEERS_RESULTS="$work/peers" REPS=1 JOBS=detect \
      CONFIGS=bytewax-w2 scripts/peers/bench.sh 2>&1 \
      | grep -E '^(PEER|FAILED) ' | tail -1) || line="FAILED bytewax-w2 detect: no PEER line"
    echo "round $r: $line" >&2
    echo "$r $line" >>"$lines"
  fi
  for side in cli python; do
    out="$work/camera-$side.jsonl"
    rm -f "$out"
    start=$(date +%s.%N)
    if [ "$side" = cli ]; then
      "$target/release/riffle" run -q "$work/camera.yaml" --output "$out" 2>"$work/camera.log" || true
    else
      "$venv/bin/python" -c 'import sys, riffle; riffle.run(sys.argv[1], output=sys.argv[2])' \
        "$work/camera.yaml" "$out" 2>"$work/camera.log" || true
    fi
    end=$(date +%s.%N)
    rows=$( [ -f "$out" ] && wc -l <"$out" || echo 0)
    check=$( [ -f "$out" ] && digest "$out" || echo none)
    line="CAMERA $side seconds=$(python3 -c "print(f'{$end - $start:.3f}')") results=$rows check=$check"
    echo "round $r: $line" >&2
    echo "$r $line" >>"$lines"
  done
done
table="$work/table.md"
python3 scripts/lib/python_table.py "$lines" >"$table"
description=$(cat <<TEXT
$REPS round(s); in each, every side back to back. **Python stage vs Rust stage**: the peers'
detect job (250 frames, SSD-Lite at batch 1, 2 workers × 1 ONNX Runtime thread, clock from the
first record read to the last result written, as \`examples/bench_job.rs\` and the peers time it)
with its post-processing as Riffle's \`detections\` + \`select\` stages, and as a \`python:\` stage
running the peers' NumPy code on each batch (the GIL held only during the call); "post p50" is
the post-processing's p50 per batch (the Rust side: both stages' p50s added). **Same Python
post-processing**: that Riffle job against Bytewax's detect (\`bytewax-w2\`, 2 workers, the
peers' code in \`scripts/peers/\`). **From Python vs the CLI**: \`pipelines/camera-video.yaml\`
(person detection, 2 workers) with its 4 videos looped to 750 frames each (3000 results) as
\`riffle run\` and as \`riffle.run(...)\` from the release wheel, each command timed from start
to exit (Python's start-up and import included); its check is a digest of every result's camera,
frame, count and boxes to the pixel.
Medians with (min–max) over the rounds; ratios are taken within each round, then their median.
A ratio is printed only where the sides' checks are equal in every round.
TEXT
)
bench_doc docs/benchmarks/python.md "Python in Riffle" "scripts/bench-python.sh (REPS=$REPS)" \
  "$description" "$table"
{ echo; echo "Raw lines:"; echo; echo '```'; cat "$lines"; echo '```'; } >>docs/benchmarks/python.md
echo "bench-python: wrote docs/benchmarks/python.md"
cat "$table"
