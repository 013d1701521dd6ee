#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest): builds the wheel (scripts/wheel.sh: the dev
# profile and target directory the Rust tests use, so nothing is built twice in release), installs it
# into a fresh venv as a user would (`pip install riffle-*.whl`: pyarrow and onnxruntime come
# as its dependencies) and runs pytest there, then (as root) the wheel without the system's
# FFmpeg (scripts/tests/wheel-portable.sh).
#
# Arguments go to pytest (e.g. `-k stream`). Needs python3 with venv and pip, and
# scripts/setup.sh's data and models.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
# The wheel users get (FFmpeg inside, manylinux-tagged), in the dev profile.
scripts/wheel.sh --profile dev
venv="$target/python-venv"
rm -rf "$venv"
python3 -m venv "$venv"
PIP_ROOT_USER_ACTION=ignore "$venv/bin/pip" install --quiet "$target"/wheels/riffle-*.whl pytest pandas
# Outside the source tree: the installed package is the one tested.
"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir python/tests python/tests "$@"
# The same wheel where the system has no FFmpeg (a mount namespace: root only).
if [ "$(id -u)" = 0 ] && [ $# -eq 0 ]; then
  scripts/tests/wheel-portable.sh
else
  echo "python-tests: the wheel without the system's FFmpeg not run (needs root, and no pytest arguments)"
fi
