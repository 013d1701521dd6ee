#!/usr/bin/env bash
# Runs each Python peer config on each job REPS times (the reps interleaved, so machine noise
# hits every config alike) and prints a table of medians (summarize.py). scripts/bench-peers.sh
# calls it one config and job at a time, beside Riffle.
#
#   scripts/peers/setup.sh                                     # once: the venv, the ratings
#   scripts/peers/bench.sh                                     # every config x job, 3 reps
#   REPS=1 JOBS=ctr CONFIGS="plain bytewax-w2" scripts/peers/bench.sh
#
# Configs: ortonly ortonly-s2 (ONNX Runtime alone, 1 session x 2 threads / 2 x 1), plain,
# bytewax-w1 bytewax-w2 (1 or 2 workers, one process), bytewax-p2w1 (2 processes x 1 worker
# over loopback ports 21101-21102), pathway-t1 pathway-t2 (1 or 2 threads).
# PEERS_PYTHON: the venv's python (default: the one scripts/peers/setup.sh makes).
# Writes out/peers/<stamp>/ (PEERS_RESULTS moves it): a log per run, peer_lines.txt, table.md.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
py="${PEERS_PYTHON:-$cache/peers-venv/bin/python}"

# One run of one config on one job: prints its PEER line (bench.sh --one CONFIG JOB).
if [ "${1:-}" = --one ]; then
  c=$2 j=$3
  cd "$here"  # bytewax.run imports bytewax_peer from the working directory
  case $c in
    ortonly) exec "$py" ortonly.py "$j" ;;
    ortonly-s2) exec "$py" ortonly.py "$j" --sessions 2 ;;
    plain) exec "$py" plain.py "$j" ;;
    bytewax-w1 | bytewax-w2) exec "$py" -m bytewax.run "bytewax_peer:flow('$j')" -w "${c#bytewax-w}" ;;
    bytewax-p2w1)
      a="127.0.0.1:21101;127.0.0.1:21102"
      "$py" -m bytewax.run "bytewax_peer:flow('$j')" -i 0 -a "$a" &
      p0=$!
      "$py" -m bytewax.run "bytewax_peer:flow('$j')" -i 1 -a "$a" &
      p1=$!
      rc=0
      wait $p0 || rc=$?
      wait $p1 || rc=$?
      [ $rc -eq 0 ] || exit $rc
      exec "$py" bytewax_peer.py merge "$j" ;;
    pathway-t1 | pathway-t2) PATHWAY_THREADS="${c#pathway-t}" exec "$py" pathway_peer.py "$j" ;;
    *) echo "bench: unknown config $c" >&2; exit 2 ;;
  esac
fi

REPS=${REPS:-3}
JOBS=${JOBS:-"classify detect ctr"}
CONFIGS=${CONFIGS:-"ortonly ortonly-s2 plain bytewax-w1 bytewax-w2 bytewax-p2w1 pathway-t1 pathway-t2"}
[ -x "$py" ] || { echo "bench: no peers' python at $py: run scripts/peers/setup.sh" >&2; exit 1; }
[ -f "$root/data/ml-100k/ratings-20k.csv" ] || case " $JOBS " in
  *" ctr "*) echo "bench: no data/ml-100k/ratings-20k.csv: run scripts/peers/setup.sh" >&2; exit 1 ;;
esac
out="${PEERS_RESULTS:-$root/out/peers}/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
# Each run's processes hand files to each other here (Bytewax's parts, Pathway's input).
PEER_SCRATCH=$(mktemp -d)
export PEER_SCRATCH
trap 'rm -rf "$PEER_SCRATCH"' EXIT
lines="$out/peer_lines.txt"
{
  echo "# $(date -Is) $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# $("$py" -V 2>&1), reps=$REPS, configs=$CONFIGS, jobs=$JOBS"
} >"$lines"
for r in $(seq 1 "$REPS"); do
  for j in $JOBS; do
    for c in $CONFIGS; do
      log="$out/$c-$j-$r.log"
      echo "# load before $c $j rep $r: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$lines"
      PEERS_PYTHON="$py" timeout 600 "$here/bench.sh" --one "$c" "$j" >"$log" 2>&1
      rc=$?
      line=$(grep '^PEER ' "$log" | tail -1)
      if [ $rc -ne 0 ] || [ -z "$line" ]; then
        line="FAILED $c $j rc=$rc: $(grep -v '^ ' "$log" | tail -1)"
      fi
      echo "$line" | tee -a "$lines"
    done
  done
done
"$py" "$here/summarize.py" "$lines" | tee "$out/table.md"
echo "results in $out"
