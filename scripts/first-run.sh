#!/usr/bin/env bash
# Times the README's first command as a new user meets it: a fresh clone of HEAD, an empty cargo
# home (every crate downloaded) and an empty Riffle cache (ONNX Runtime downloaded), then
# `scripts/run.sh`; checks its results (250 frames, 53 with a person) and prints the time.
# Debian packages already installed stay installed: it says which of the first run's were.
#   scripts/first-run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d "${TMPDIR:-/tmp}/riffle-first-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
for p in g++ cmake nasm; do
  dpkg -s "$p" >/dev/null 2>&1 && echo "first-run: $p was installed already" || echo "first-run: $p is not installed (run.sh installs it)"
done
git clone --quiet "$here" "$work/riffle"
start=$(date +%s)
(cd "$work/riffle" && CARGO_HOME="$work/cargo-home" RIFFLE_CACHE_DIR="$work/cache" scripts/run.sh) \
  > "$work/run.log" 2>&1 || { cat "$work/run.log"; echo "first-run: scripts/run.sh failed" >&2; exit 1; }
seconds=$(( $(date +%s) - start ))
out="$work/riffle/out/camera-perception.jsonl"
frames=$(wc -l < "$out")
persons=$(grep -c '"label":"person"' "$out" || true)
grep -E '^(latency|results):' "$work/run.log"
if [ "$frames" -ne 250 ] || [ "$persons" -ne 53 ]; then
  echo "first-run: expected 250 frames, 53 with a person; got $frames and $persons" >&2
  exit 1
fi
echo "first-run: $(git -C "$here" rev-parse --short HEAD): scripts/run.sh from a fresh clone took $((seconds / 60)) min $((seconds % 60)) s ($frames frames, $persons with a person)"
