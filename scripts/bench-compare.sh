#!/usr/bin/env bash
# Two riffle binaries on the same pipeline, in interleaved rounds: each round runs
# `riffle bench` (one repeat) with the old binary, then the new one, and takes the pipeline's
# records/s (row (a)); the table gives the median (min–max) of each and of the per-round ratio.
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
    rate=$("$bin" bench "$pipeline" --repeats 1 2>/dev/null \
      | awk -F'|' '/^\| \(a\) riffle pipeline/ { split($3, p, "("); gsub(/ /, "", p[1]); print p[1] }')
    [ -n "$rate" ] || { echo "bench-compare: no pipeline row from $bin" >&2; exit 1; }
    echo "$round $which $rate" | tee -a "$raw" >&2
  done
done
python3 - "$raw" "$pipeline" "$rounds" <<'PY'
import statistics, sys
raw, pipeline, rounds = sys.argv[1:]
rates = {"old": {}, "new": {}}
for line in open(raw):
    r, which, rate = line.split()
    rates[which][int(r)] = float(rate)
def spread(v, digits):
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}–{max(v):.{digits}f})"
old = [rates["old"][r] for r in sorted(rates["old"])]
new = [rates["new"][r] for r in sorted(rates["new"])]
ratio = [n / o for o, n in zip(old, new)]
print(f"| {pipeline}, {rounds} interleaved rounds | records/s |")
print("|---|---:|")
print(f"| old | {spread(old, 1)} |")
print(f"| new | {spread(new, 1)} |")
print(f"| new ÷ old, per round | {spread(ratio, 3)} |")
PY
