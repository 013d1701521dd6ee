#!/usr/bin/env bash
# The main job on a fresh machine: fetch what is missing, build, and run the camera pipeline
# on the bundled frames (or the pipeline and flags you pass).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --bin riffle
if [ $# -eq 0 ]; then
  set -- run pipelines/camera-perception.yaml
fi
exec target/release/riffle "$@"
