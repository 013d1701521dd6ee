#!/usr/bin/env bash
# The whole test suite on a fresh machine: fetch what is missing (ONNX Runtime, data, kcat, a
# Kafka broker, an S3 server, PostgreSQL, Redis), start those services, then lint and test.
# Every service is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v kcat >/dev/null; then
  echo "test: installing kcat (Debian package), an independent Kafka client for interop tests"
  apt-get update -qq && apt-get install -y -qq kcat >/dev/null
fi
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  echo "test: installing chromium and chromium-driver (Debian packages) for the live view's browser test (tests/ui.rs)"
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# Tests that need what only some machines have are `#[ignore = "needs CAPABILITY: why"]`, so a
# plain `cargo test` (a developer without root) lists them as ignored, with why, never as ok.
# Here every capability is probed and the tests needing it run (`--ignored`) where it works; one
# left out where its capability works fails this script (CI runs as root: nothing is skipped).
#   netns: network namespaces, root and `ip netns` (tests/netns.rs, many hosts);
#   tmpfs: mounting a tmpfs, root (tests/supervisor.rs, the disk-full test);
#   python: pyarrow for `python:` stages run by the CLI's embedded interpreter, which takes
#     packages from VIRTUAL_ENV (tests/python_stage.rs): a venv of its own is made here;
#   cv2: OpenCV's Python, which the `resize` stage is compared with on random sizes
#     (operators/src/vision/resize/two_tap.rs): RIFFLE_CV2_PYTHON, by default setup.sh's YOLO
#     venv (the OpenCV the golden files were made with).
# RIFFLE_NETNS=0 / RIFFLE_TMPFS=0 / RIFFLE_PYTHON=0 / RIFFLE_CV2=0 leave those tests out: a
# failure where they could run.
declare -A capable=([netns]=0 [tmpfs]=0 [python]=0 [cv2]=0)
if ! command -v ip >/dev/null; then
  apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null || true
fi
if scripts/netns.sh check; then capable[netns]=1; fi
probe=$(mktemp -d)
if mount -t tmpfs -o size=64k tmpfs "$probe" 2>/dev/null; then
  umount "$probe"
  capable[tmpfs]=1
fi
rmdir "$probe"
VIRTUAL_ENV="$PWD/target/python-stages"
export VIRTUAL_ENV
if [ ! -x "$VIRTUAL_ENV/bin/python" ]; then python3 -m venv "$VIRTUAL_ENV"; fi
PIP_ROOT_USER_ACTION=ignore "$VIRTUAL_ENV/bin/pip" install --quiet "pyarrow>=14" || true
if "$VIRTUAL_ENV/bin/python" -c 'import pyarrow'; then capable[python]=1; fi
RIFFLE_CV2_PYTHON="${RIFFLE_CV2_PYTHON:-${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}/yolo-venv/bin/python}"
export RIFFLE_CV2_PYTHON
if "$RIFFLE_CV2_PYTHON" -c 'import cv2' 2>/dev/null; then capable[cv2]=1; fi
declare -A wanted=([netns]="${RIFFLE_NETNS:-1}" [tmpfs]="${RIFFLE_TMPFS:-1}" [python]="${RIFFLE_PYTHON:-1}"
  [cv2]="${RIFFLE_CV2:-1}")
for c in "${!capable[@]}"; do
  if [ "${capable[$c]}" != 1 ]; then
    echo "test: no $c here: the tests that need it are left out (listed at the end)"
  fi
done
# NVRTC (no GPU needed) so that the tests compile every CUDA kernel here too.
LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH RIFFLE_EXPECT_NVRTC=1
# The kernel emulator's AddressSanitizer/UBSan (g++'s libasan and libubsan) must work here.
export RIFFLE_EXPECT_SANITIZERS=1
cargo fmt --all -- --check
# No module import circles in any crate (docs/architecture.md).
python3 scripts/module-cycles.py
# docs/architecture.md's crate table names every crate of the workspace.
python3 scripts/tests/architecture-crates.py
# No function over 80 lines and no file over 600 production lines where kinds are added.
python3 scripts/tests/code-size.py
cargo clippy --workspace --all-targets -- -D warnings
# The README's first run builds riffle without its optional connectors (scripts/run.sh): that
# build stays clean too.
cargo clippy --bin riffle --no-default-features -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

# Each fuzz target (fuzz/tests/targets.rs) runs its corpus, then random inputs this long.
export RIFFLE_FUZZ_SECONDS="${RIFFLE_FUZZ_SECONDS:-60}"
# Two runs' services side by side (two clones on one machine) neither collide nor stop each
# other's: a check of scripts/services.sh, about a minute.
scripts/tests/services-twice.sh
# This run's services (scripts/services.sh): a Kafka broker (PLAINTEXT, SASL_SSL and KRaft
# controller ports), an S3 server (s3proxy, signed requests), PostgreSQL, Redis and a schema
# registry (Apicurio Registry, Confluent-compatible API, HTTP and HTTPS), on free ports reserved
# for this run (a demo broker on 9092, a server started by hand, another run's are left alone)
# with their state in a folder of this run's, removed on exit; stopped on exit, and only they.
# A port set here (RIFFLE_KAFKA_PORT, _S3_PORT, _PG_PORT, _REDIS_PORT, _REGISTRY_PORT) wins.
run=$(mktemp -d "${TMPDIR:-/tmp}/riffle-test.XXXXXX")
log=$(mktemp)
# A folder whose servers did not all stop is kept (their pid files are in it).
trap 'scripts/services.sh down "$run" && rm -rf "$run"; rm -f "$log"' EXIT
# confluent-kafka's own serializers, the other side of the schema-registry tests (before the
# services, so that their env names the clients' python).
scripts/registry.sh clients >/dev/null
scripts/services.sh up "$run"
# Addresses, CAs and users for the tests (the SASL_SSL broker's, the TLS servers'), the
# broker's pid (tests pause it), RIFFLE_SERVICES_DIR and the ports (a test's
# `scripts/kafka.sh restart` reaches this run's broker).
# shellcheck disable=SC1091
. "$run/env"

cargo test --workspace --all-targets 2>&1 | tee "$log"
# The ignored tests (libtest: `test NAME ... ignored, REASON`), as NAME<TAB>REASON; then those
# needing a capability that works here run.
ignored=$(sed -nE 's/^test (.+) \.\.\. ignored(, (.*))?$/\1\t\3/p' "$log" | sort -u)
ran=()
opted_out=()
unknown=()
while IFS=$'\t' read -r name reason; do
  [ -n "$name" ] || continue
  case "$reason" in
    needs\ *:*) ;;
    *) continue ;;
  esac
  c=${reason#needs }
  c=${c%%:*}
  if [ -z "${capable[$c]+set}" ]; then
    unknown+=("$name ($reason)")
  elif [ "${capable[$c]}" = 1 ] && [ "${wanted[$c]}" = 1 ]; then
    ran+=("$name")
  elif [ "${capable[$c]}" = 1 ]; then
    opted_out+=("$name ($c works here)")
  fi
done <<<"$ignored"
if [ ${#ran[@]} -gt 0 ]; then
  echo "test: running the ${#ran[@]} ignored test(s) whose capability works here"
  cargo test --workspace --all-targets -- --ignored --exact "${ran[@]}" 2>&1 | tee -a "$log"
fi
cargo test --workspace --doc 2>&1 | tee -a "$log"
# The Python package, installed from its wheel into a fresh venv (pytest's summary is counted).
scripts/python-tests.sh 2>&1 | tee -a "$log"
# What did not run, and why: never counted as passing.
not_run=$(printf '%s\n' "$ignored" | awk -F'\t' -v ran="$(printf '%s\n' "${ran[@]}")" '
  BEGIN { n = split(ran, r, "\n"); for (i = 1; i <= n; i++) if (r[i] != "") done[r[i]] = 1 }
  $1 != "" && !($1 in done) { printf "  %s: %s\n", $1, ($2 == "" ? "(no reason given)" : $2) }')
# One closing line over every test binary and the doc tests.
awk -v left="$(printf '%s' "$not_run" | grep -c . || true)" '/^test result:/ { p += $4; f += $6 }
  /^[0-9]+ (passed|failed).* in [0-9.]+s/ {
    for (i = 1; i < NF; i++) { if ($(i + 1) ~ /^passed/) p += $i; if ($(i + 1) ~ /^failed/) f += $i }
  }
  END { printf "total: %d passed, %d failed, %d not run (ignored)\n", p, f, left }' "$log"
if [ -n "$not_run" ]; then
  echo "test: not run here, and why:"
  printf '%s\n' "$not_run"
fi
if [ ${#unknown[@]} -gt 0 ]; then
  echo "test: FAILED: ignored for a capability scripts/test.sh does not probe (add a probe above):"
  printf '  %s\n' "${unknown[@]}"
  exit 1
fi
if [ ${#opted_out[@]} -gt 0 ]; then
  echo "test: FAILED: left out on a machine that can run them (RIFFLE_NETNS, _TMPFS, _PYTHON or _CV2=0?):"
  printf '  %s\n' "${opted_out[@]}"
  exit 1
fi
