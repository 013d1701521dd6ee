#!/usr/bin/env bash
# Fetches NVIDIA's runtime compiler (NVRTC, CUDA 13, from the PyPI wheel nvidia-cuda-nvrtc)
# into the cache and prints its library folder. NVRTC needs no GPU: with it on the library path
# the tests compile every CUDA kernel Riffle ships, on machines without a GPU too.
#   export LD_LIBRARY_PATH="$(scripts/nvrtc.sh):$LD_LIBRARY_PATH"
set -euo pipefail
NVRTC_VERSION=13.5.37
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
dir="$cache/nvrtc-$NVRTC_VERSION"
if [ ! -f "$dir/libnvrtc.so.13" ]; then
  command -v python3 >/dev/null || { echo "nvrtc: python3 (with pip) is needed" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "nvrtc: downloading nvidia-cuda-nvrtc==$NVRTC_VERSION wheel from PyPI" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_27_x86_64 --platform manylinux2010_x86_64 --python-version 311 \
    --dest "$tmp" "nvidia-cuda-nvrtc==$NVRTC_VERSION" >&2
  mkdir -p "$dir.part"
  python3 - "$(ls "$tmp"/nvidia_cuda_nvrtc-*.whl)" "$dir.part" <<'PY'
import os, shutil, sys, zipfile
wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/lib/" in name and ".so" in name:
            with z.open(name) as src, open(os.path.join(dest, os.path.basename(name)), "wb") as out:
                shutil.copyfileobj(src, out)
PY
  rm -rf "$dir" && mv "$dir.part" "$dir"
fi
echo "$dir"
