#!/usr/bin/env bash
# Refreshes the README's picture of the live view (docs/images/live-view.png): runs the browser
# test (tests/ui.rs) in release, which saves its screenshot where RIFFLE_UI_SCREENSHOT says.
# Needs scripts/setup.sh's ONNX Runtime and Debian's chromium and chromium-driver.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs/images
RIFFLE_UI_SCREENSHOT="$PWD/docs/images/live-view.png" cargo test --release --test ui -- --nocapture
echo "ui-screenshot: wrote docs/images/live-view.png"
