#!/usr/bin/env bash
# GPU check, for a host with an NVIDIA GPU and no Rust toolchain: runs the GPU paths and the CPU
# paths on the same inputs, checks they agree within 1e-4, and prints the throughput of each.
#
# Carry a release build made elsewhere (same x86-64): this script, `riffle`
# (target/release/riffle), `libonnxruntime.so.1.31.1`, `models/ml100k_ncf_ctr.onnx` and the
# frames in `data/frames/bikes` (or any folder of JPEGs: RIFFLE_GPU_CHECK_FRAMES), e.g.
#   scripts/gpu-check.sh                   # from a checkout with target/release/riffle
#   RIFFLE_BIN=./riffle RIFFLE_ORT_LIB=./libonnxruntime.so.1.31.1 scripts/gpu-check.sh
# CUDA 13 libraries (NVRTC, cuBLAS) are taken from a PyTorch environment's nvidia/*/lib folders
# when they are not on the library path already; the driver's libcuda comes from the system.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin="${RIFFLE_BIN:-$here/target/release/riffle}"
[ -x "$bin" ] || bin="$here/riffle"
[ -x "$bin" ] || { echo "gpu-check: no riffle binary (set RIFFLE_BIN)" >&2; exit 2; }
if [ -z "${RIFFLE_ORT_LIB:-}" ] && [ -f "$here/libonnxruntime.so.1.31.1" ]; then
  export RIFFLE_ORT_LIB="$here/libonnxruntime.so.1.31.1"
fi
# A bundle carries the libpython its binary links (scripts/gpu-bundle.sh).
if ls "$here"/libpython*.so* >/dev/null 2>&1; then
  export LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
model="${RIFFLE_GPU_CHECK_MODEL:-$here/models/ml100k_ncf_ctr.onnx}"
frames="${RIFFLE_GPU_CHECK_FRAMES:-$here/data/frames/bikes}"

if command -v python3 >/dev/null; then
  libs=$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + sys.path)
found = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        if d not in found:
            found.append(d)
print(":".join(found))
PY
)
  if [ -n "$libs" ]; then
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi

"$bin" devices
"$bin" gpu-check "$model" --frames "$frames" --pairs "${RIFFLE_GPU_CHECK_PAIRS:-200000}"
