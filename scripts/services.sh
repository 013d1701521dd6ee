#!/usr/bin/env bash
# One test run's services: a Kafka broker, an S3 server, PostgreSQL, Redis and a schema
# registry (scripts/kafka.sh, s3.sh, postgres.sh, redis.sh, registry.sh), all with their state
# under the run's own folder and on ports reserved for it, so that two runs on one machine (two
# clones' scripts/test.sh) neither collide on a port nor stop each other's servers.
#
#   scripts/services.sh up DIR     # start all five; writes DIR/env (`export` lines for clients)
#   scripts/services.sh down DIR   # stop the servers started in DIR, and nothing else
#
# Ports: a block of 8 free ones reserved for DIR (scripts/lib/ports.py): Kafka P (PLAINTEXT),
# P+1 (SASL_SSL), P+2 (controller); S3 P+3; PostgreSQL P+4; Redis P+5; registry P+6 (HTTP),
# P+7 (HTTPS). A port set by the caller (RIFFLE_KAFKA_PORT, _S3_PORT, _PG_PORT, _REDIS_PORT,
# _REGISTRY_PORT) wins. DIR/env also sets RIFFLE_SERVICES_DIR=DIR and the ports, so that a
# script run later with that environment (a test's `scripts/kafka.sh restart`) finds the same
# server. The clients' venv of `scripts/registry.sh clients`, when made before `up`, is named
# there too (RIFFLE_REGISTRY_PYTHON).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
services=(kafka s3 postgres redis registry)

die() { echo "services: $*" >&2; exit 1; }

up() {
  local dir=$1 base s
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ ! -e "$dir/ports.env" ] || die "$dir already holds a run's services (scripts/services.sh down $dir first)"
  # PostgreSQL runs as `postgres` under root: it must be able to pass through DIR to its own.
  chmod 711 "$dir"
  if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
    runuser -u postgres -- test -x "$dir" ||
      die "the postgres user cannot enter $dir (a folder above it is private: chmod 711 it)"
  fi
  base=$(python3 "$here/lib/ports.py" reserve "$dir" 8)
  export RIFFLE_SERVICES_DIR="$dir"
  export RIFFLE_KAFKA_PORT="${RIFFLE_KAFKA_PORT:-$base}"
  export RIFFLE_S3_PORT="${RIFFLE_S3_PORT:-$((base + 3))}"
  export RIFFLE_PG_PORT="${RIFFLE_PG_PORT:-$((base + 4))}"
  export RIFFLE_REDIS_PORT="${RIFFLE_REDIS_PORT:-$((base + 5))}"
  export RIFFLE_REGISTRY_PORT="${RIFFLE_REGISTRY_PORT:-$((base + 6))}"
  # What `down` needs to find each server again, whatever its caller's environment then.
  {
    local v
    for v in RIFFLE_SERVICES_DIR RIFFLE_KAFKA_PORT RIFFLE_KAFKA_SSL_PORT RIFFLE_KAFKA_CONTROLLER_PORT \
        RIFFLE_KAFKA_DIR RIFFLE_S3_PORT RIFFLE_S3_DIR RIFFLE_PG_PORT RIFFLE_PG_DIR \
        RIFFLE_REDIS_PORT RIFFLE_REDIS_DIR RIFFLE_REGISTRY_PORT RIFFLE_REGISTRY_TLS_PORT \
        RIFFLE_REGISTRY_DIR; do
      if [ -n "${!v:-}" ]; then printf 'export %s=%q\n' "$v" "${!v}"; fi
    done
  } >"$dir/ports.env"
  # A server that fails to start leaves none of this run's running.
  trap 'down "$dir" >/dev/null 2>&1 || true' ERR
  cp "$dir/ports.env" "$dir/env.part"
  for s in "${services[@]}"; do
    "$here/$s.sh" start
    "$here/$s.sh" env >>"$dir/env.part"
  done
  trap - ERR
  printf 'export RIFFLE_KAFKA_BROKERS=%q\n' "127.0.0.1:$RIFFLE_KAFKA_PORT" >>"$dir/env.part"
  printf 'export RIFFLE_KAFKA_PID=%q\n' "$("$here/kafka.sh" pid)" >>"$dir/env.part"
  mv "$dir/env.part" "$dir/env"
}

down() {
  local dir=$1 s failed=0
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/ports.env" ] || return 0
  # Only what this run started: each script stops the server whose pid file is in its state
  # under DIR (and checks that it still is that server).
  (
    set +e
    # shellcheck disable=SC1091
    . "$dir/ports.env"
    for s in "${services[@]}"; do
      "$here/$s.sh" stop || failed=1
    done
    exit "$failed"
  ) || failed=1
  if [ "$failed" = 0 ]; then
    python3 "$here/lib/ports.py" release "$dir"
  else
    echo "services: some of $dir's servers did not stop (its ports stay reserved)" >&2
  fi
  return "$failed"
}

case "${1:-}" in
  up) [ -n "${2:-}" ] || die "usage: $0 up DIR"; up "$2" ;;
  down) [ -n "${2:-}" ] || die "usage: $0 down DIR"; down "$2" ;;
  *) echo "usage: $0 up DIR | down DIR" >&2; exit 2 ;;
esac
