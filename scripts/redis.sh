#!/usr/bin/env bash
# A Redis server of our own on 127.0.0.1 for tests and demos: Debian's `redis-server`, with a
# password, no persistence and its state in a temporary directory.
#
#   scripts/redis.sh install   # apt-get install redis-server (and redis-cli) if missing
#   scripts/redis.sh start     # install if missing, start a fresh, empty server (idempotent)
#   scripts/redis.sh stop      # stop it; nothing is left running
#   scripts/redis.sh status
#   scripts/redis.sh pid       # the server's pid
#   scripts/redis.sh env       # `export` lines for clients: RIFFLE_REDIS_URL and its parts
#   scripts/redis.sh cli ARGS  # redis-cli against it, authenticated (`cli GET recs:42`)
#
# Port ${RIFFLE_REDIS_PORT:-19379} on ${RIFFLE_REDIS_HOST:-127.0.0.1}, password
# ${RIFFLE_REDIS_PASSWORD:-riffle-redis-secret} (`requirepass`), state (config, log, pid) in
# ${RIFFLE_REDIS_DIR:-$RIFFLE_SERVICES_DIR/redis-PORT}, where RIFFLE_SERVICES_DIR is a test run's
# own folder (scripts/services.sh), else in ${TMPDIR:-/tmp}/riffle-redis-PORT; wiped on every
# start, and `stop` stops only the server started there. Nothing is saved to disk: a stopped
# server's data is gone.
set -euo pipefail

port="${RIFFLE_REDIS_PORT:-19379}"
host="${RIFFLE_REDIS_HOST:-127.0.0.1}"
password="${RIFFLE_REDIS_PASSWORD:-riffle-redis-secret}"
if [ -n "${RIFFLE_SERVICES_DIR:-}" ]; then
  state="${RIFFLE_REDIS_DIR:-$RIFFLE_SERVICES_DIR/redis-$port}"
else
  state="${RIFFLE_REDIS_DIR:-${TMPDIR:-/tmp}/riffle-redis-$port}"
fi
. "$(dirname "$0")/lib/service.sh"
log="$state/redis.log"

die() { echo "redis: $*" >&2; exit 1; }

present() { command -v redis-server >/dev/null && command -v redis-cli >/dev/null; }

install() {
  if present; then return; fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "redis-server is missing and installing it needs root: apt-get install redis-server"
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null || die "redis-server is missing and there is no apt-get: install Redis (redis-server, redis-cli) yourself"
  echo "redis: installing redis-server (Debian package)"
  # The package's own service is not used (and cannot start without systemd): ours runs below.
  apt_install_once redis-server || die "apt-get install redis-server failed"
}

# The pid file names a live server started on this state (not a stranger that got the pid
# later, nor another run's server): a redis-server working in $state (its `dir`; Redis
# rewrites its command line, so the config's path is not there to check).
running() {
  runs_here "redis-server"
}


# redis-cli with the password from the environment (REDISCLI_AUTH), never on a command line.
cli() {
  REDISCLI_AUTH="$password" redis-cli -h "$host" -p "$port" "$@"
}

ready() {
  [ "$(cli PING 2>/dev/null)" = PONG ]
}

write_config() {
  # The password is in this file only (mode 600), not on the server's command line.
  (umask 077 && cat >"$state/redis.conf" <<EOF
# Written by scripts/redis.sh on each start: a test server, nothing persisted.
bind $host
port $port
protected-mode yes
daemonize no
dir $state
logfile $log
save ""
appendonly no
databases 64
requirepass $password
EOF
  )
}

start() {
  install
  if running; then echo "redis: already running on $host:$port (log $log)"; return; fi
  # The URL carries it unescaped.
  [[ "$password" =~ ^[A-Za-z0-9._~-]+$ ]] ||
    die "RIFFLE_REDIS_PASSWORD may hold only letters, digits and . _ ~ - (it goes into a URL)"
  # A port already taken would only show as a bind error in the server's log.
  ! (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null ||
    die "$host:$port is already in use by another process (choose another RIFFLE_REDIS_PORT)"
  rm -rf "$state"
  mkdir -p "$state"
  write_config
  # exec: the recorded pid is the server's own.
  (cd "$state" && exec nohup redis-server "$state/redis.conf" </dev/null >"$state/stdout.log" 2>&1) &
  echo $! >"$state/pid"
  for _ in $(seq 1 300); do
    if ready; then
      echo "redis: $(redis-server --version | cut -d' ' -f1-3) on $host:$port (password set)," \
        "pid $(cat "$state/pid"), log $log"
      return
    fi
    launched || { tail -n 20 "$log" "$state/stdout.log" >&2 2>/dev/null; die "the server exited (log $log)"; }
    sleep 0.1
  done
  tail -n 20 "$log" >&2 2>/dev/null || true
  stop >/dev/null
  die "the server did not answer on $host:$port within 30 s (log $log)"
}

stop() {
  if ! running; then rm -f "$state/pid"; return; fi
  local pid
  pid=$(cat "$state/pid")
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "redis: the server did not stop within 10 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$state/pid"
  echo "redis: stopped"
}

env_lines() {
  printf 'export RIFFLE_REDIS_URL=%q\n' "redis://:$password@$host:$port/0"
  printf 'export RIFFLE_REDIS_HOST=%q\n' "$host"
  printf 'export RIFFLE_REDIS_PORT=%q\n' "$port"
  printf 'export RIFFLE_REDIS_PASSWORD=%q\n' "$password"
}

case "${1:-}" in
  install) install; echo "redis: $(redis-server --version | cut -d' ' -f1-3) at $(command -v redis-server)" ;;
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running on $host:$port (pid $(cat "$state/pid"))"; else echo "not running"; exit 1; fi ;;
  pid) running && cat "$state/pid" ;;
  env) env_lines ;;
  cli) shift; running || die "not running on $host:$port (scripts/redis.sh start)"; cli "$@" ;;
  *) echo "usage: $0 install|start|stop|status|pid|env|cli ARGS..." >&2; exit 2 ;;
esac
