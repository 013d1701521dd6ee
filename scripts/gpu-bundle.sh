#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU host without a Rust toolchain into one folder
# (default: gpu-bundle/, git-ignored): the release binary, the ONNX Runtime library, the
# libpython the binary links (for `python:` stages; GPU hosts often have another Python), the
# CTR model, 64 frames and the script, and the same as one archive, gpu-bundle.tar.xz (~22 MB:
# the folder is ~86 MB). The binary is built without its optional connectors (cargo features:
# docs/usage.md#builds), so it needs neither FFmpeg's libraries nor libpython.
#   scripts/gpu-bundle.sh && (cd gpu-bundle && ./scripts/gpu-check.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-bundle}"
scripts/setup.sh >/dev/null
# Without the optional connectors: a GPU host may lack FFmpeg's shared libraries or this
# libpython, and gpu-check needs neither.
cargo build --release --bin riffle --no-default-features
lib=$(ls "${XDG_CACHE_HOME:-$HOME/.cache}"/riffle/onnxruntime-*/libonnxruntime.so.* | head -1)
rm -rf "$out"
mkdir -p "$out/scripts" "$out/models" "$out/data/frames/bikes"
cp target/release/riffle "$out/riffle"
strip "$out/riffle" 2>/dev/null || true
cp "$lib" "$out/"
cp models/ml100k_ncf_ctr.onnx "$out/models/"
ls data/frames/bikes/*.jpg | head -64 | xargs -I{} cp {} "$out/data/frames/bikes/"
cp scripts/gpu-check.sh "$out/scripts/"
# A binary built with `python` links libpython dynamically; a host without it could not start it.
py=$(ldd "$out/riffle" | awk '/libpython/ { print $3 }')
if [ -n "$py" ]; then
  cp -L "$py" "$out/"
  strip "$out/$(basename "$py")" 2>/dev/null || true
fi
tar -C "$out" -cf - . | xz -9 -T0 > "$out.tar.xz"
du -sh "$out" "$out.tar.xz"
