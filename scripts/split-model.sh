#!/usr/bin/env bash
# scripts/split-model.py with the `onnx` Python package that scripts/setup.sh installs into the
# cache (RIFFLE_CACHE_DIR, or XDG_CACHE_HOME/riffle, or ~/.cache/riffle), e.g.
#   scripts/split-model.sh --list models/mobilenet_v2_imagenet.onnx
#   scripts/split-model.sh models/mobilenet_v2_imagenet.onnx TENSOR out/parts
set -euo pipefail
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
export PYTHONPATH="$cache/python${PYTHONPATH:+:$PYTHONPATH}"
exec python3 "$(dirname "$0")/split-model.py" "$@"
