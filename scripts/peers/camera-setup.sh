#!/usr/bin/env bash
# Makes the venv of the Python camera peer (scripts/peers/camera_peer.py), which
# examples/bench_cameras.rs runs side by side with Riffle:
#   ${RIFFLE_CACHE_DIR:-$HOME/.cache/riffle}/camera-peer-venv
# (where the bench looks for it; RIFFLE_CACHE_DIR as scripts/setup.sh's cache).
#
# Pins, and why:
# - av (PyAV): its wheel bundles its own FFmpeg (8.1.2 for av 18.1.0), whose H.264 decoder and
#   swscale give the same bytes as the system FFmpeg 5.1 Riffle links (checked: 300x300 RGB24
#   in one swscale pass with Riffle's flags, every frame of the 4 bundled yuvj420p clips and of
#   the 720p / 1080p bikes-0, 300 frames of the yuv420p live clip: identical), so the wheel is
#   used rather than a build against the system libraries.
# - onnxruntime: the version scripts/setup.sh gives Riffle, so both run the same kernels.
# - supervision: its ByteTrack (0.30 is the last release with it), the pin of setup.sh's
#   track venv.
# - numpy: the post-processing's float32 arithmetic; pinned so runs stay comparable.
#
# Idempotent: a stamp file holding the pins skips the install when they are what is there.
# The last line printed is the venv's python (what `bench_cameras --peer` takes).
set -euo pipefail

AV_VERSION=18.1.0
ORT_VERSION=1.31.1
NUMPY_VERSION=2.4.6
SUPERVISION_VERSION=0.30.9

cache="${RIFFLE_CACHE_DIR:-$HOME/.cache/riffle}"
venv="$cache/camera-peer-venv"
stamp="$venv/.riffle-pins"
pins="av==$AV_VERSION onnxruntime==$ORT_VERSION numpy==$NUMPY_VERSION"
pins="$pins supervision==$SUPERVISION_VERSION"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ]; then
  echo "camera-setup: $pins present at $venv" >&2
else
  command -v python3 >/dev/null \
    || { echo "camera-setup: python3 (with venv and pip) is needed" >&2; exit 1; }
  echo "camera-setup: installing $pins into $venv" >&2
  # A venv left by other pins is rebuilt rather than patched, so nothing stale stays in it.
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086 # $pins is a list of requirement words
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$venv/bin/pip" install --quiet $pins
  "$venv/bin/python" -c "import av, numpy, onnxruntime, supervision"
  echo "$pins" > "$stamp"
  echo "camera-setup: installed at $venv" >&2
fi
echo "$venv/bin/python"
