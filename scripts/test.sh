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
# Multi-host test (tests/netns.rs) in network namespaces, where the kernel allows them.
if [ -z "${RIFFLE_NETNS:-}" ]; then
  if ! command -v ip >/dev/null; then
    apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null || true
  fi
  if scripts/netns.sh check; then
    export RIFFLE_NETNS=1
  else
    export RIFFLE_NETNS=0
    echo "test: network namespaces are unavailable here (needs root and 'ip netns'): tests/netns.rs opts out (RIFFLE_NETNS=0)"
  fi
fi
# The disk-full test (tests/supervisor.rs) mounts a small tmpfs, which needs root.
if [ -z "${RIFFLE_TMPFS:-}" ]; then
  probe=$(mktemp -d)
  if mount -t tmpfs -o size=64k tmpfs "$probe" 2>/dev/null; then
    umount "$probe"
    export RIFFLE_TMPFS=1
  else
    export RIFFLE_TMPFS=0
    echo "test: cannot mount a tmpfs here (needs root): the disk-full test opts out (RIFFLE_TMPFS=0)"
  fi
  rmdir "$probe"
fi
# NVRTC (no GPU needed) so that the tests compile every CUDA kernel here too.
LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH RIFFLE_EXPECT_NVRTC=1
# The kernel emulator's AddressSanitizer/UBSan (g++'s libasan and libubsan) must work here.
export RIFFLE_EXPECT_SANITIZERS=1
cargo fmt --all -- --check
# No module import circles in any crate (docs/architecture.md).
python3 scripts/module-cycles.py
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

# A broker of our own on test ports (PLAINTEXT 19092, SASL_SSL 19093, KRaft controller 19094),
# so a demo broker on 9092 is left alone.
export RIFFLE_KAFKA_PORT="${RIFFLE_KAFKA_PORT:-19092}"
export RIFFLE_KAFKA_BROKERS="127.0.0.1:$RIFFLE_KAFKA_PORT"
# Each fuzz target (fuzz/tests/targets.rs) runs its corpus, then random inputs this long.
export RIFFLE_FUZZ_SECONDS="${RIFFLE_FUZZ_SECONDS:-60}"
# The sinks' and checkpoints' services, each on test ports of its own: an S3 server (s3proxy,
# signed requests), PostgreSQL and Redis.
export RIFFLE_S3_PORT="${RIFFLE_S3_PORT:-19300}"
export RIFFLE_PG_PORT="${RIFFLE_PG_PORT:-19432}"
export RIFFLE_REDIS_PORT="${RIFFLE_REDIS_PORT:-19379}"
# A schema registry (Apicurio Registry, Confluent-compatible API) on 19381 (HTTP) and 19382 (HTTPS).
export RIFFLE_REGISTRY_PORT="${RIFFLE_REGISTRY_PORT:-19381}"
log=$(mktemp)
trap 'scripts/kafka.sh stop; scripts/s3.sh stop; scripts/postgres.sh stop; scripts/redis.sh stop; scripts/registry.sh stop; rm -f "$log"' EXIT
scripts/kafka.sh start
# The SASL_SSL address, its CA file and the SCRAM user, for the tests that authenticate.
eval "$(scripts/kafka.sh env)"
RIFFLE_KAFKA_PID=$(scripts/kafka.sh pid)
export RIFFLE_KAFKA_PID
scripts/s3.sh start
eval "$(scripts/s3.sh env)"
scripts/postgres.sh start
eval "$(scripts/postgres.sh env)"
scripts/redis.sh start
eval "$(scripts/redis.sh env)"
scripts/registry.sh start
# confluent-kafka's own serializers, the other side of the schema-registry tests.
scripts/registry.sh clients >/dev/null
eval "$(scripts/registry.sh env)"

# Tests that need what this machine lacks are filtered out by name, and said so here (never
# reported as passing).
skip=()
if [ "$RIFFLE_NETNS" != 1 ]; then
  skip+=(--skip a_host_cut_off_mid_run --skip the_host_of_process_0_lost)
  echo "test: skipping tests/netns.rs (no network namespaces here)"
fi

cargo test --workspace --all-targets -- "${skip[@]}" 2>&1 | tee "$log"
cargo test --workspace --doc 2>&1 | tee -a "$log"
# One closing line over every test binary and the doc tests.
awk '/^test result:/ { p += $4; f += $6 } END { printf "total: %d passed, %d failed\n", p, f }' "$log"
