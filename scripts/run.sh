#!/usr/bin/env bash
# The main job on a fresh machine: fetch what it needs (ONNX Runtime and the build's Debian
# packages only: the tests' set-up is scripts/test.sh's), build, and run the camera pipeline
# on the bundled frames (or the riffle command and flags you pass).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --run
if [ $# -eq 0 ]; then
  set -- run pipelines/camera-perception.yaml
fi
exec cargo run --quiet --release --bin riffle -- "$@"
