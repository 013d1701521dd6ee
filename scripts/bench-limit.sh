#!/usr/bin/env bash
# How close the shipped camera pipelines come to their limits (issue #17 item 2): builds riffle
# in release and runs `riffle bench` on pipelines/camera-perception.yaml and
# pipelines/camera-classify.yaml (the pipeline, a straight loop over the same stages, ONNX
# Runtime alone as one session and as the pipeline deploys it, and the sum of the parts), then
# writes the tables to docs/benchmarks/limit.md. Argument: rounds (default 3). Run it on a
# quiet machine. BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rounds="${1:-3}"
[ -f models/ssdlite_person.onnx ] || { echo "bench-limit: run scripts/setup.sh first" >&2; exit 1; }
cargo build --quiet --release --bin riffle
riffle="${CARGO_TARGET_DIR:-target}/release/riffle"
table=$(mktemp)
trap 'rm -f "$table"' EXIT
for p in pipelines/camera-perception.yaml pipelines/camera-classify.yaml; do
  {
    echo "\`riffle bench $p --repeats $rounds\`:"
    echo
    # The table only: the lines from its header on.
    "$riffle" bench "$p" --repeats "$rounds" 2>/dev/null | sed -n '/^| variant/,$p'
    echo
  } >>"$table"
done
out=docs/benchmarks/limit.md
description=$(cat <<'TEXT'
Each shipped camera pipeline as `riffle bench` measures it, every variant once per round,
rounds interleaved, median (min–max): (a) the pipeline as `riffle run` runs it (its file's
workers, one ONNX Runtime thread each); (b) a straight-line loop on one thread over the same
stage code with the same total ONNX Runtime threads; (c) ONNX Runtime alone on tensors prepared
beforehand, one session; (d) ONNX Runtime alone as the pipeline deploys it, one 1-thread
session per worker in parallel; (e) the sum of the parts: every stage but the model at its
one-core cost (timed inside (b)) plus the model at (d)'s rate, spread over the cores. a/e is
how close the pipeline comes to its own stages' limit (target ≥ 0.95 on detect, ≥ 0.90 on
classify). (a) and (b) write the same results (the JSON lines, sorted, the runtime's latency
column left out) in every round, or (b)'s ratio reads "outputs differ".
TEXT
)
bench_doc "$out" "Against the limit: riffle bench" "scripts/bench-limit.sh $rounds" "$description" "$table"
echo "bench-limit: wrote $out"
cat "$table"
