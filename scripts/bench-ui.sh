#!/usr/bin/env bash
# Cost of the live view (issue #13 item 2): builds examples/bench_ui.rs in release and times
# the camera pipeline without the view and with it open in headless Chromium, in interleaved
# rounds; writes the table to docs/benchmarks/ui.md. Arguments: rounds (default 5) and how many times the 250 frames are replayed
# (default 4). Run it on a quiet machine. BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rounds="${1:-5}"
repeat="${2:-4}"
[ -f models/ssdlite_person.onnx ] || { echo "bench-ui: run scripts/setup.sh first" >&2; exit 1; }
[ -x /usr/bin/chromium ] || { echo "bench-ui: needs Debian's chromium (apt-get install chromium)" >&2; exit 1; }
cargo build --quiet --release --example bench_ui
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_ui"
table=$(mktemp)
trap 'rm -f "$table"' EXIT
RUST_LOG=error "$bin" "$rounds" "$repeat" >"$table"
out=docs/benchmarks/ui.md
description=$(cat <<'TEXT'
`pipelines/camera-perception.yaml` (4 cameras, 2 workers, the SSD-Lite person detector), run
in one process by `examples/bench_ui.rs`, alternately without the view and with `riffle_ui`
serving the page and a headless Chromium (on the same cores) showing it: frames sampled at 2
per second per camera, snapshots pushed every 500 ms, the page repainting at most once a second. Timing starts once the page is
connected; rounds alternate which variant goes first; the ratio is taken per round.
TEXT
)
bench_doc "$out" "Cost of the live view" "scripts/bench-ui.sh $rounds $repeat" "$description" "$table"
echo "bench-ui: wrote $out"
cat "$table"
