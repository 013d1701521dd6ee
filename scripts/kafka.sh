#!/usr/bin/env bash
# A real Kafka-protocol broker on 127.0.0.1 for tests and demos: tansu with sqlite storage
# (its in-memory storage is not Kafka-correct, so it is never used here).
#
#   scripts/kafka.sh install   # build tansu once into the tools cache (≈10–15 min on 2 cores)
#   scripts/kafka.sh start     # install if missing, start on ${RIFFLE_KAFKA_HOST:-127.0.0.1}:${RIFFLE_KAFKA_PORT:-9092}
#   scripts/kafka.sh stop
#   scripts/kafka.sh status
#   scripts/kafka.sh pid       # the broker's process id (tests pause it to simulate an outage)
#   scripts/kafka.sh topic NAME [PARTITIONS]
set -euo pipefail

TANSU_VERSION=0.6.0
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
tools="$cache/tools/tansu-$TANSU_VERSION"
tansu="$tools/bin/tansu"
port="${RIFFLE_KAFKA_PORT:-9092}"
host="${RIFFLE_KAFKA_HOST:-127.0.0.1}"
state="${RIFFLE_KAFKA_DIR:-$cache/kafka-$port}"
url="tcp://$host:$port"

install() {
  if [ -x "$tansu" ]; then return; fi
  echo "kafka: building tansu $TANSU_VERSION (sqlite storage) into $tools"
  cargo install --quiet --locked --root "$tools" --version "$TANSU_VERSION" tansu --features libsql
}

running() {
  [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null
}

start() {
  install
  if running; then echo "kafka: already running on $host:$port"; return; fi
  mkdir -p "$state"
  rm -f "$state/tansu.db" "$state/tansu.db-"*
  # exec: the recorded pid is the broker's own, so `stop` ends it.
  (cd "$state" && exec nohup "$tansu" broker \
      --listener-url "$url" --advertised-listener-url "$url" \
      --storage-engine "sqlite://tansu.db" >"$state/broker.log" 2>&1) &
  echo $! >"$state/pid"
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
      echo "kafka: tansu broker on $host:$port (log $state/broker.log)"
      return
    fi
    running || { cat "$state/broker.log" >&2; echo "kafka: broker exited" >&2; exit 1; }
    sleep 0.1
  done
  echo "kafka: broker did not open port $port" >&2
  exit 1
}

stop() {
  if running; then kill "$(cat "$state/pid")"; rm -f "$state/pid"; echo "kafka: stopped"; fi
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running on $host:$port"; else echo "not running"; exit 1; fi ;;
  pid) running && cat "$state/pid" ;;
  topic) "$tansu" topic create "$2" --partitions "${3:-4}" --broker "$url" ;;
  *) echo "usage: $0 install|start|stop|status|pid|topic NAME [PARTITIONS]" >&2; exit 2 ;;
esac
