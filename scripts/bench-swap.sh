#!/usr/bin/env bash
# Latency while a model version is switched in (issue #14 item 4): builds riffle and
# examples/bench_swap.rs in release, runs pipelines/camera-versions.yaml (2 cameras sampled at
# 12.5 fps, 2 workers) and publishes a second version 8 s into each run; writes the table to
# docs/benchmarks/swap.md. Argument: rounds (default 3). Run it on a quiet machine.
# BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rounds="${1:-3}"
[ -f models/ssdlite_person.onnx ] && [ -f data/videos/bikes-0.mp4 ] \
  || { echo "bench-swap: run scripts/setup.sh first" >&2; exit 1; }
cargo build --quiet --release --bin riffle --example bench_swap
target="${CARGO_TARGET_DIR:-target}/release"
table=$(mktemp)
trap 'rm -f "$table"' EXIT
RIFFLE_BIN="$target/riffle" "$target/examples/bench_swap" "$rounds" >"$table"
out=docs/benchmarks/swap.md
description=$(cat <<'TEXT'
`pipelines/camera-versions.yaml` with 2 of the test videos read in real time (like live
cameras) and sampled at 12.5 fps each: 25 frames/s, under half of what its 2 workers detect
here; epochs of 4 records (results are written when their epoch completes, so the epoch's
fill time is most of the latency). The SSD-Lite person detector is read from a model
repository; 18 s per run.
8 s into each run a second version (the same weights) is published; the watcher finds it within
500 ms, loads and checks it, every worker loads it in the background, and the switch takes
effect at one epoch for all. Latency is each row's `latency_ms` (source read → sink). Steady
state: rows read from 1 s into the run until the publish; swap: rows read from the publish
until 1 s after the first row served by version 2.
TEXT
)
bench_doc "$out" "Latency during a model swap" "scripts/bench-swap.sh $rounds" "$description" "$table"
echo "bench-swap: wrote $out"
cat "$table"
