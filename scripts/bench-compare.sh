#!/usr/bin/env bash
# Two riffle binaries on the same pipeline, in interleaved rounds: each round runs
# `riffle bench` (one repeat) with the old binary, then the new one, and takes the pipeline's
# records/s (row (a)) and its read → written latency p50/p99; the table gives the median
# (min–max) of each and of the per-round ratio of records/s.
# For a before/after check of a change that should not move speed (a refactor).
#
#   scripts/bench-compare.sh OLD_RIFFLE NEW_RIFFLE [PIPELINE] [ROUNDS]
#
# Build the old one from another commit in its own worktree and target directory, e.g.
#   git worktree add ../before <commit> && (cd ../before && cargo build --release --bin riffle)
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?old riffle binary}
new=${2:?new riffle binary}
pipeline=${3:-pipelines/camera-perception.yaml}
rounds=${4:-5}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    report=$("$bin" bench "$pipeline" --repeats 1 2>/dev/null) || true
    rate=$(awk -F'|' '/^\| \(a\) riffle pipeline/ { split($3, p, "("); gsub(/ /, "", p[1]); print p[1] }' <<<"$report")
    # "pipeline latency, read → written: p50 X (X–X) ms, p99 Y (Y–Y) ms" (one repeat)
    latency=$(sed -nE 's/^pipeline latency.*: p50 ([0-9.]+) .*, p99 ([0-9.]+) .*/\1 \2/p' <<<"$report")
    [ -n "$rate" ] || { echo "bench-compare: no pipeline row from $bin" >&2; exit 1; }
    [ -n "$latency" ] || { echo "bench-compare: no latency line from $bin" >&2; exit 1; }
    echo "$round $which $rate $latency" | tee -a "$raw" >&2
  done
done
python3 - "$raw" "$pipeline" "$rounds" <<'PY'
import statistics, sys
raw, pipeline, rounds = sys.argv[1:]
runs = {"old": {}, "new": {}}
for line in open(raw):
    r, which, rate, p50, p99 = line.split()
    runs[which][int(r)] = (float(rate), float(p50), float(p99))
def spread(v, digits):
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}–{max(v):.{digits}f})"
def column(which, i):
    return [runs[which][r][i] for r in sorted(runs[which])]
ratio = [n / o for o, n in zip(column("old", 0), column("new", 0))]
print(f"| {pipeline}, {rounds} interleaved rounds | records/s | read → written p50 ms | p99 ms |")
print("|---|---:|---:|---:|")
for which in ("old", "new"):
    print(f"| {which} | {spread(column(which, 0), 1)} | {spread(column(which, 1), 1)} | {spread(column(which, 2), 1)} |")
print(f"| new ÷ old (records/s), per round | {spread(ratio, 3)} | | |")
PY
