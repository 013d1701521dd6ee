#!/usr/bin/env bash
# Scaling from 1 to 2 workers (issue #17 item 2): builds examples/bench_scaling.rs in release,
# runs a camera pipeline (pipelines/camera-perception.yaml by default) at 1 and 2 workers beside
# ONNX Runtime alone with as many 1-thread sessions, in interleaved rounds, and writes the table
# to docs/benchmarks/scaling.md. Arguments: rounds (default 3), pipeline file. Run it on a quiet
# machine. BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rounds="${1:-3}"
pipeline="${2:-pipelines/camera-perception.yaml}"
[ -f models/ssdlite_person.onnx ] || { echo "bench-scaling: run scripts/setup.sh first" >&2; exit 1; }
cargo build --quiet --release --example bench_scaling
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"${CARGO_TARGET_DIR:-target}/release/examples/bench_scaling" "$rounds" "$pipeline" >"$table"
out=docs/benchmarks/scaling.md
description=$(cat <<'TEXT'
The pipeline file's job (its stages, epochs and flow control) at 1 and 2 worker threads, each
worker's model with one ONNX Runtime thread, beside ONNX Runtime alone: the same model on the
tensors the pipeline's pre-processing made, beforehand, in one 1-thread session per worker. The
pipeline's clock runs from its first record read to its last result (models warmed when built),
ORT alone's from when its sessions exist. The speed-ups are taken within each round; the last
row divides the pipeline's by ORT alone's, which is what adding a worker can give on this
machine. End-to-end latency is mostly queueing in an unpaced replay (`max_epochs_in_flight`
epochs of `epoch_records` frames read ahead); the paced figures are in
[latency.md](latency.md).
TEXT
)
bench_doc "$out" "Scaling from 1 to 2 workers" "scripts/bench-scaling.sh $rounds $pipeline" "$description" "$table"
echo "bench-scaling: wrote $out"
cat "$table"
