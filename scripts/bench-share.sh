#!/usr/bin/env bash
# One model instance per worker vs one per process (`share: process`, issue #14 item 6): builds
# riffle and examples/bench_share.rs in release, runs pipelines/camera-perception.yaml with 4
# workers both ways in interleaved rounds, and writes the table to docs/benchmarks/share.md. Argument: rounds (default 3). Run it on a
# quiet machine. BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rounds="${1:-3}"
[ -f models/ssdlite_person.onnx ] || { echo "bench-share: run scripts/setup.sh first" >&2; exit 1; }
cargo build --quiet --release --bin riffle --example bench_share
target="${CARGO_TARGET_DIR:-target}/release"
table=$(mktemp)
trap 'rm -f "$table"' EXIT
RIFFLE_BIN="$target/riffle" "$target/examples/bench_share" "$rounds" >"$table"
out=docs/benchmarks/share.md
description=$(cat <<'TEXT'
`pipelines/camera-perception.yaml` (250 frames, 4 cameras, the SSD-Lite person detector, model
batches of up to 4) run by the `riffle` binary with `--workers 4`: with one ONNX Runtime session
per worker (the default), and with `share: process`, one session whose own thread runs the
batches all 4 workers send it, merged. Peak RSS is the process's (`wait4`'s `ru_maxrss`);
frames/s is 250 over the whole run, start-up included for both.
TEXT
)
bench_doc "$out" "One model per process" "scripts/bench-share.sh $rounds" "$description" "$table"
echo "bench-share: wrote $out"
cat "$table"
