#!/usr/bin/env bash
# Makes what the Python peers (plain loop, Bytewax, Pathway, ONNX Runtime alone: scripts/peers/)
# need and git does not hold:
# - their venv, ${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/riffle}/peers-venv (the cache
#   scripts/setup.sh uses), with exactly requirements.lock installed (requirements.txt: the
#   direct pins);
# - the MovieLens-100k ratings of the ctr job, data/ml-100k/ratings-20k.csv, through
#   scripts/ml-100k.sh: the file Riffle's side of the benchmark reads too.
# The frames (data/frames/bikes/) and models (models/*.onnx) are in git.
#
# Idempotent: a stamp in the venv holds the lock's hash, and the install is skipped when it
# matches; a venv left by another lock is rebuilt rather than patched, so nothing stale stays.
# The last line printed is the venv's python (what scripts/peers/bench.sh runs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
venv="$cache/peers-venv"
stamp="$venv/.riffle-lock"
lock="$here/requirements.lock"
want=$(sha256sum "$lock" | cut -d' ' -f1)

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "peers-setup: requirements.lock present at $venv" >&2
else
  command -v python3 >/dev/null \
    || { echo "peers-setup: python3 (with venv and pip) is needed" >&2; exit 1; }
  # The lock was frozen on CPython 3.11 (the benchmarks' figures were too).
  echo "peers-setup: installing requirements.lock into $venv ($(python3 -V))" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$venv/bin/pip" install --quiet -r "$lock"
  "$venv/bin/python" -c "import bytewax, cv2, numpy, onnxruntime, pathway"
  echo "$want" >"$stamp"
  echo "peers-setup: installed at $venv" >&2
fi
"$root/scripts/ml-100k.sh" >&2
echo "$venv/bin/python"
