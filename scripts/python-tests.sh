#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest): builds the wheel (maturin, the dev profile
# and target directory the Rust tests use, so nothing is built twice in release), installs it
# into a fresh venv as a user would (`pip install riffle-*.whl`: pyarrow and onnxruntime come
# as its dependencies) and runs pytest there. The last line is pytest's summary.
#
# Arguments go to pytest (e.g. `-k stream`). Needs python3 with venv and pip, and
# scripts/setup.sh's data and models.
set -euo pipefail
cd "$(dirname "$0")/.."
MATURIN_VERSION=1.16.0
target="${CARGO_TARGET_DIR:-target}"
tools="$target/python-tools"
if ! "$tools/bin/maturin" --version 2>/dev/null | grep -q "$MATURIN_VERSION"; then
  python3 -m venv "$tools"
  PIP_ROOT_USER_ACTION=ignore "$tools/bin/pip" install --quiet "maturin==$MATURIN_VERSION"
fi
rm -rf "$target/wheels"
# auditwheel skip: a wheel for this machine (it links this machine's FFmpeg), not manylinux.
"$tools/bin/maturin" build --quiet --profile dev --auditwheel skip \
  --manifest-path python/Cargo.toml --out "$target/wheels"
venv="$target/python-venv"
rm -rf "$venv"
python3 -m venv "$venv"
PIP_ROOT_USER_ACTION=ignore "$venv/bin/pip" install --quiet "$target"/wheels/riffle-*.whl pytest pandas
# Outside the source tree: the installed package is the one tested.
"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir python/tests python/tests "$@"
