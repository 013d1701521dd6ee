#!/usr/bin/env bash
# Fetches what Riffle needs at run time and is not in git: ONNX Runtime's shared library,
# taken from the PyPI wheel (the only binary source reachable from every machine we run on).
# Idempotent: does nothing when the library is already in place.
set -euo pipefail

ORT_VERSION=1.31.1
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
lib_dir="$cache/onnxruntime-$ORT_VERSION"
lib="$lib_dir/libonnxruntime.so.$ORT_VERSION"

if [ -f "$lib" ]; then
  echo "setup: ONNX Runtime $ORT_VERSION present at $lib"
  exit 0
fi

command -v python3 >/dev/null || { echo "setup: python3 (with pip) is needed to fetch ONNX Runtime" >&2; exit 1; }
mkdir -p "$lib_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: downloading onnxruntime==$ORT_VERSION wheel from PyPI"
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --python-version 311 \
  --dest "$tmp" "onnxruntime==$ORT_VERSION"
wheel=$(ls "$tmp"/onnxruntime-*.whl)
python3 - "$wheel" "$lib" "$ORT_VERSION" <<'PY'
import sys, zipfile, shutil
wheel, dest, ver = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    name = f"onnxruntime/capi/libonnxruntime.so.{ver}"
    with z.open(name) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
PY
mv "$lib.part" "$lib"
echo "setup: ONNX Runtime $ORT_VERSION installed at $lib"
