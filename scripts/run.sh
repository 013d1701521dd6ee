#!/usr/bin/env bash
# The main job on a fresh machine: fetch what it needs, build, and run the camera pipeline on
# the bundled frames (or the riffle command and flags you pass).
#
# With no arguments riffle is built without its optional connectors (`--no-default-features`:
# no Kafka, Parquet, PostgreSQL, Redis, S3, FFmpeg or Python): the bundled pipeline needs none,
# and the first build is minutes quicker. With arguments it is built whole, with the Debian
# packages that takes (scripts/setup.sh --build).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  scripts/setup.sh --run
  exec cargo run --quiet --release --no-default-features --bin riffle -- \
    run pipelines/camera-perception.yaml
fi
scripts/setup.sh --build
exec cargo run --quiet --release --bin riffle -- "$@"
