#!/usr/bin/env bash
# A PostgreSQL server of our own on 127.0.0.1 for tests and demos, run from Debian's
# `postgresql` package (installed with apt-get when missing) on a throwaway data directory.
#
#   scripts/postgres.sh install   # apt-get install postgresql when no server binaries are found
#   scripts/postgres.sh start     # install if missing, start a fresh server (idempotent)
#   scripts/postgres.sh stop      # stop it; nothing is left running
#   scripts/postgres.sh restart   # an immediate shutdown (a crash) and a start on the same data
#   scripts/postgres.sh status
#   scripts/postgres.sh pid       # the postmaster's pid
#   scripts/postgres.sh env       # `export RIFFLE_PG_URL=postgres://riffle:…@127.0.0.1:PORT/riffle`,
#                                 # RIFFLE_PG_CA, RIFFLE_PG_TLS_URL, RIFFLE_PG_CLIENT_CERT/_KEY (TLS)
#   scripts/postgres.sh psql [ARGS…]  # psql as the test user
#
# The server listens on ${RIFFLE_PG_HOST:-127.0.0.1}:${RIFFLE_PG_PORT:-19432} with password
# authentication (scram-sha-256) for user `riffle` (password ${RIFFLE_PG_PASSWORD:-riffle-secret})
# and database `riffle`; its Unix socket and data live in ${RIFFLE_PG_DIR:-$RIFFLE_SERVICES_DIR/postgres-PORT},
# where RIFFLE_SERVICES_DIR is a test run's own folder (scripts/services.sh), else in
# ${TMPDIR:-/tmp}/riffle-postgres-PORT: outside $HOME, as the server runs as the `postgres` user
# when this script runs as root (PostgreSQL refuses to run as root), and that user cannot enter
# /root. The data is wiped on every start (not on restart); `stop` stops only the server on it.
#
# TLS: every start makes a CA of its own and a server certificate it signs (for $host,
# 127.0.0.1 and localhost) under $state/tls, and turns `ssl` on. Connections with and without
# TLS are both accepted (user `riffle`), except for two users that show TLS was really used:
# `riffle_tls` (same password) is refused without TLS, and `riffle_cert` logs in only with the
# client certificate $state/tls/riffle_cert.crt (signed by the same CA). `riffle` is a member
# of both, so it reads what they write.
set -euo pipefail
# apt_install_once (its other helpers need $state, which the postgres functions set).
. "$(dirname "$0")/lib/service.sh"

port="${RIFFLE_PG_PORT:-19432}"
host="${RIFFLE_PG_HOST:-127.0.0.1}"
user=riffle
database=riffle
password="${RIFFLE_PG_PASSWORD:-riffle-secret}"
if [ -n "${RIFFLE_SERVICES_DIR:-}" ]; then
  state="${RIFFLE_PG_DIR:-$RIFFLE_SERVICES_DIR/postgres-$port}"
else
  state="${RIFFLE_PG_DIR:-${TMPDIR:-/tmp}/riffle-postgres-$port}"
fi
data="$state/data"
log="$state/server.log"
tls="$state/tls"

die() { echo "postgres: $*" >&2; exit 1; }

# The newest installed server's binaries (Debian keeps them out of PATH).
bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && [ -x "$d/postgres" ] && echo "$d"
}

install() {
  if bindir >/dev/null; then return; fi
  [ "$(id -u)" = 0 ] || die "no PostgreSQL server found under /usr/lib/postgresql: run as root (or apt-get install postgresql)"
  echo "postgres: installing Debian's postgresql package"
  present() { bindir >/dev/null; }
  apt_install_once --no-install-recommends postgresql
  bindir >/dev/null || die "apt-get installed postgresql but no server binaries are under /usr/lib/postgresql"
}

# Runs a server command as the user that owns the data: `postgres` when we are root.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "there is no 'postgres' user to run the server as (apt-get install postgresql creates it)"
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# A live postmaster on this data directory (pg_ctl signals the pid in postmaster.pid: checked
# here to be a postgres working in $data, not a stranger that got the pid later).
running() {
  local bin pid
  bin=$(bindir) || return 1
  [ -f "$data/postmaster.pid" ] || return 1
  pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null) || return 1
  [ "/proc/$pid/cwd" -ef "$data" ] || return 1
  as_owner "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1
}

# A superuser session over the Unix socket in $state (trust, local only).
admin() {
  as_owner "$(bindir)/psql" -X -q -v ON_ERROR_STOP=1 -h "$state" -p "$port" -U postgres -d postgres "$@"
}

start() {
  install
  if running; then
    echo "postgres: already running on $host:$port (log $log)"
    [ -f "$tls/ca.pem" ] ||
      echo "postgres: that server has no TLS (an older scripts/postgres.sh started it): stop and start it for TLS" >&2
    return
  fi
  # The password goes into a URL and a SQL literal unescaped.
  [[ "$password" =~ ^[A-Za-z0-9._~-]+$ ]] ||
    die "RIFFLE_PG_PASSWORD may only hold letters, digits and . _ ~ -"
  # A port already taken (another server, another test run) would only show deep in the log.
  ! (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null ||
    die "$host:$port is already in use by another process (choose another RIFFLE_PG_PORT)"
  local bin owner
  bin=$(bindir)
  owner=$(id -un)
  [ "$(id -u)" = 0 ] && owner=postgres
  rm -rf "$state"
  mkdir -p "$state"
  chown "$owner:" "$state"
  chmod 700 "$state"
  as_owner "$bin/initdb" -D "$data" -U postgres -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >"$state/initdb.log" 2>&1 ||
    { cat "$state/initdb.log" >&2; die "initdb failed in $data"; }
  certificates "$owner"
  # First match wins: these come before initdb's `host … scram-sha-256` lines.
  local hba
  hba=$(cat "$data/pg_hba.conf")
  cat >"$data/pg_hba.conf" <<EOF
# Written by scripts/postgres.sh: users that only TLS (or a client certificate) lets in.
hostnossl all riffle_tls all reject
hostssl all riffle_cert all cert
hostnossl all riffle_cert all reject
$hba
# Clients on the networks the server listens on (the campaign's namespaces reach it over a
# bridge: scripts/campaign.sh).
host all all samenet scram-sha-256
EOF
  cat >>"$data/postgresql.conf" <<EOF
# Written by scripts/postgres.sh: a test server.
listen_addresses = '$host'
port = $port
unix_socket_directories = '$state'
password_encryption = scram-sha-256
fsync = on
max_connections = 200
ssl = on
ssl_cert_file = '$tls/server.crt'
ssl_key_file = '$tls/server.key'
ssl_ca_file = '$tls/ca.pem'
EOF
  launch
  admin <<EOF
CREATE ROLE $user LOGIN PASSWORD '$password';
CREATE DATABASE $database OWNER $user;
CREATE ROLE riffle_tls LOGIN PASSWORD '$password';
CREATE ROLE riffle_cert LOGIN;
GRANT riffle_tls, riffle_cert TO $user;
\connect $database
GRANT USAGE, CREATE ON SCHEMA public TO riffle_tls, riffle_cert;
EOF
  echo "postgres: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on $host:$port" \
    "(user $user, database $database, scram-sha-256; TLS with CA $tls/ca.pem)," \
    "pid $(cat "$state/pid"), log $log"
}

# A CA, the server's certificate and key, and riffle_cert's client certificate, in $tls; the
# keys belong to the server's owner (PostgreSQL refuses a key others can read).
certificates() {
  local owner="$1" san="IP:127.0.0.1,DNS:localhost"
  command -v openssl >/dev/null || die "openssl is needed to make the test CA (apt-get install openssl)"
  if [ "$host" != 127.0.0.1 ] && [ "$host" != localhost ]; then
    if [[ "$host" =~ ^[0-9.]+$|: ]]; then san="$san,IP:$host"; else san="$san,DNS:$host"; fi
  fi
  mkdir -p "$tls"
  (
    cd "$tls"
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 3650 \
      -subj "/CN=riffle test CA $host:$port" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
      "$san" >server.ext
    openssl req -new "${ec[@]}" -keyout server.key -out server.csr -subj "/CN=$host"
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 3650 \
      -extfile server.ext -out server.crt
    printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' >client.ext
    openssl req -new "${ec[@]}" -keyout riffle_cert.key -out riffle_cert.csr \
      -subj "/CN=riffle_cert"
    openssl x509 -req -in riffle_cert.csr -CA ca.pem -CAkey ca.key -set_serial 3 -days 3650 \
      -extfile client.ext -out riffle_cert.crt
    rm -f ./*.csr ./*.ext
  ) >"$state/openssl.log" 2>&1 ||
    { cat "$state/openssl.log" >&2; die "openssl could not make the test certificates in $tls"; }
  chmod 600 "$tls"/*.key
  chown -R "$owner:" "$tls"
}

# Starts the server on the data in $data and waits until it accepts connections.
launch() {
  local bin
  bin=$(bindir)
  rm -f "$state/pid"
  # pg_ctl -w waits until the server accepts connections (or has exited).
  if ! as_owner "$bin/pg_ctl" start -D "$data" -l "$log" -w -t 60 >/dev/null 2>&1; then
    tail -n 40 "$log" >&2 || true
    die "the server did not start (log $log)"
  fi
  head -n 1 "$data/postmaster.pid" >"$state/pid"
  for _ in $(seq 1 100); do
    if "$bin/pg_isready" -q -h "$host" -p "$port"; then return; fi
    sleep 0.1
  done
  tail -n 40 "$log" >&2
  die "the server did not answer on $host:$port within 10 s (log $log)"
}

stop() {
  if ! running; then rm -f "$state/pid"; echo "postgres: not running"; return; fi
  as_owner "$(bindir)/pg_ctl" stop -D "$data" -m fast -w -t 30 >/dev/null ||
    die "the server did not stop (log $log)"
  rm -f "$state/pid"
  echo "postgres: stopped"
}

# A crash and a restart: an immediate shutdown skips the checkpoint, so the server recovers
# from its write-ahead log on the way up, as after a power cut.
restart() {
  running || die "no server is running on $host:$port (scripts/postgres.sh start)"
  as_owner "$(bindir)/pg_ctl" stop -D "$data" -m immediate -w >/dev/null
  echo "postgres: stopped immediately; restarting on the same data"
  launch
}

url() {
  echo "postgres://$user:$password@$host:$port/$database"
}

case "${1:-}" in
  install)
    if d=$(bindir); then echo "postgres: server binaries present in $d"; else install; fi ;;
  start) start ;;
  stop) stop ;;
  restart) restart ;;
  status) if running; then echo "running on $host:$port (pid $(cat "$state/pid"))"; else echo "not running"; exit 1; fi ;;
  pid) running && cat "$state/pid" ;;
  env)
    printf 'export RIFFLE_PG_URL=%q\n' "$(url)"
    # TLS: the CA that signed the server's certificate, a user refused without TLS, and the
    # client certificate of a user that logs in with it alone.
    printf 'export RIFFLE_PG_CA=%q\n' "$tls/ca.pem"
    printf 'export RIFFLE_PG_TLS_URL=%q\n' "postgres://riffle_tls:$password@$host:$port/$database"
    printf 'export RIFFLE_PG_CLIENT_CERT=%q\n' "$tls/riffle_cert.crt"
    printf 'export RIFFLE_PG_CLIENT_KEY=%q\n' "$tls/riffle_cert.key" ;;
  psql) shift; exec psql -X "$(url)" "$@" ;;
  *) echo "usage: $0 install|start|stop|restart|status|pid|env|psql [ARGS]" >&2; exit 2 ;;
esac
