#!/usr/bin/env bash
# The recommendation benchmark (examples/bench_recs.rs): Riffle at three epoch sizes (and two
# variants) beside a straight Rust loop and ONNX Runtime alone (per click and in large
# batches), interleaved rounds, written to docs/benchmarks/recs.md. Argument: rounds (default 3). Run it on a quiet
# machine; the Python peers are compared by scripts/bench-peers.sh. BENCH_NOTE="…" adds a line
# under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rounds="${1:-3}"
[ -f data/ml-100k/ratings-20k.csv ] || { echo "bench-recs: run scripts/setup.sh first" >&2; exit 1; }
cargo build --quiet --release --example bench_recs
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"${CARGO_TARGET_DIR:-target}/release/examples/bench_recs" "$rounds" >"$table"
out=docs/benchmarks/recs.md
description=$(cat <<'TEXT'
The targets' job: the first 20,000 MovieLens-100k ratings in time order; per click, the ≤ 100
most popular items so far that the user has not rated → the NCF click model → top 10.
Riffle runs it as `pipelines/clickstream-recs.yaml` does (2 workers × 1 ONNX Runtime thread,
model batches of up to 8192 rows, one epoch in flight, candidates spread over the workers) at
three epoch sizes, once without the spread and once with two epochs in flight (more
throughput for more latency: the next epoch's clicks wait behind the current one's); the
straight loop
is one Rust thread with exact per-click features and one model call per click (ORT with 2
threads); ONNX Runtime alone runs the loop's prepared tensors in 2 sessions × 1 thread, per
click and merged into 8192-row batches. Latency is from reading a click to writing its
recommendations (committed). Features lag by at most one epoch.
TEXT
)
bench_doc "$out" "Recommendations" "scripts/bench-recs.sh $rounds" "$description" "$table"
echo "bench-recs: wrote $out"
cat "$table"
