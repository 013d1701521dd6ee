#!/usr/bin/env bash
# Riffle against the Python peers (scripts/peers: plain loop, Bytewax, Pathway, ONNX Runtime
# alone) on the same jobs (detect, classify, ctr), in one run: each round runs Riffle and every
# peer on a job back to back, so machine noise hits them alike. Writes the table (median and
# range over the rounds, ratios per round) to docs/benchmarks/peers.md and the README (between
# its bench-peers markers). Run it on a quiet machine.
#
#   scripts/bench-peers.sh            # REPS=3 JOBS="detect classify ctr" CONFIGS="…"
#
# The peers' venv and the ratings are made first if missing (scripts/peers/setup.sh, idempotent).
#
# BENCH_NOTE="…" adds a line under the header.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
REPS=${REPS:-3}
JOBS=${JOBS:-"detect classify ctr"}
CONFIGS=${CONFIGS:-"ortonly-s2 plain bytewax-w2 bytewax-p2w1 pathway-t2"}
peers_python=$(scripts/peers/setup.sh)
cargo build --quiet --release --example bench_job
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_job"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lines="$work/lines.txt"
# Riffle runs ctr twice: its model on ONNX Runtime (as every peer), and on Riffle's own dense
# executor (`executor: dense`), each its own row.
riffles() { if [ "$1" = ctr ]; then echo "riffle riffle-dense"; else echo riffle; fi; }
for r in $(seq 1 "$REPS"); do
  for j in $JOBS; do
    for c in $(riffles "$j") $CONFIGS; do
      if [ "${c%%-*}" = riffle ]; then
        arg=$j
        [ "$c" = riffle ] || arg="$j-${c#riffle-}"
        line=$("$bin" "$arg" 2>"$work/riffle.log" | grep '^PEER ' | tail -1) || true
        [ -n "$line" ] || line="FAILED $c $j: $(tail -1 "$work/riffle.log")"
      else
        line=$(PEERS_PYTHON="$peers_python" PEERS_RESULTS="$work/peers" REPS=1 JOBS="$j" \
          CONFIGS="$c" scripts/peers/bench.sh 2>&1 \
          | grep -E '^(PEER|FAILED) ' | tail -1) || true
        [ -n "$line" ] || line="FAILED $c $j: no PEER line"
      fi
      echo "round $r: $line" >&2
      echo "$r $line" >>"$lines"
    done
  done
done
table="$work/table.md"
python3 scripts/lib/peers_table.py "$lines" >"$table"
description=$(cat <<TEXT
The peers' three jobs (see \`scripts/peers/README.md\`), Riffle as \`examples/bench_job.rs\` runs
them (the shipped pipelines, 2 workers × 1 ONNX Runtime thread; ctr also with its model on
Riffle's dense executor, \`executor: dense\`, its own row) and each Python peer as
\`scripts/peers/bench.sh\` runs it, $REPS round(s), in each round Riffle and every peer back to
back on the same job. Every clock starts after the models are loaded and have run once and
stops at the last result written. "Best peer" is the peer with the highest median; ratios are
taken within each round. Outputs are counted: detect's check is frames with a person and person
boxes, classify's and ctr's a digest of every output, comparable with the peers' \`check=\`.
A ratio and a target status are printed only where every run of the job (Riffle, each peer,
ONNX Runtime alone, every round) printed the same \`check=\`; otherwise they read "outputs differ"
(Riffle against the peers) or "peers' outputs differ".
TEXT
)
bench_doc docs/benchmarks/peers.md "Riffle against the Python peers" \
  "scripts/bench-peers.sh (REPS=$REPS)" "$description" "$table"
{ echo; echo "Raw lines:"; echo; echo '```'; cat "$lines"; echo '```'; } >>docs/benchmarks/peers.md
readme_table bench-peers "$table"
echo "bench-peers: wrote docs/benchmarks/peers.md and the README's table"
cat "$table"
