#!/usr/bin/env bash
# Latency with paced cameras (issue #17 item 1): builds examples/bench_latency.rs in release and
# runs it: the bundled frames as N live cameras at 25 fps each, at about 25, 50 and 75 % of the
# measured capacity, frame read → result latency on the live tap and on the committed output,
# beside the same paced load through the Bytewax peer (scripts/peers/bytewax_paced.py, in the
# peers' venv, which scripts/peers/setup.sh makes first if missing). Writes
# docs/benchmarks/latency.md (the README keeps no copy). Flags go to the example, e.g.
# --rounds 3.
# Run it on a quiet machine. BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
[ -f models/ssdlite_person.onnx ] || { echo "bench-latency: run scripts/setup.sh first" >&2; exit 1; }
peers_python=$(scripts/peers/setup.sh)
cargo build --quiet --release --example bench_latency
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_latency"
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"$bin" --peer-python "$peers_python" "$@" >"$table"
description=$(cat <<'TEXT'
The peers' detect job (the 250 bundled street frames, resize 300×300 u8, SSDLite, persons over
0.5) with the frames split into N cameras, each replayed live at 25 fps (`fps: 25`: a camera's
k-th frame is read k/25 s after the start), repeated to last about 10 s. N is chosen from the
capacity measured unpaced at the start of each round, for about 25, 50 and 75 % load. Latency is
from a frame's read to its result: on the live tap, as the result exists (metrics, the live
view), and committed, when its epoch is written to the results file (a live source closes its
epoch whenever it waits for its next frame, so a frame's epoch completes as soon as its result
exists; `--epoch-ms` adds `runtime.epoch_ms`). With 25 fps cameras on 2 cores the loads come in
steps of one camera: the "actual" column is the load each round got. Bytewax runs the same paced
load (`scripts/peers/bytewax_paced.py`, 2 workers in one process; its figure is read → sink
write). Riffle: 2 workers × 1 ONNX Runtime thread, one frame per model call (as
`pipelines/camera-perception.yaml`), run twice: with `exchange: { balance: true, ordered_by:
camera_id }` first, so each frame goes to an idle worker whichever camera it is from (the
live tap and committed columns), and with each camera on one worker (`partition_by: camera`
alone).
TEXT
)
bench_doc docs/benchmarks/latency.md "Latency with paced cameras" \
  "scripts/bench-latency.sh${*:+ $*}" "$description" "$table"
echo "bench-latency: wrote docs/benchmarks/latency.md"
cat "$table"
