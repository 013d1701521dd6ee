#!/usr/bin/env bash
# The whole test suite on a fresh machine: fetch what is missing, then lint and test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --all-targets 2>&1 | tee "$log"
cargo test --workspace --doc 2>&1 | tee -a "$log"
# One closing line over every test binary and the doc tests.
awk '/^test result:/ { p += $4; f += $6 } END { printf "total: %d passed, %d failed\n", p, f }' "$log"
