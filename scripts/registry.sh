#!/usr/bin/env bash
# A real schema registry on 127.0.0.1 for tests and demos: Apicurio Registry 2.4.2.Final (one
# JVM, in-memory storage) serving the Confluent-compatible API at /apis/ccompat/v7. Maven
# fetches it from Maven Central and re-runs Quarkus' build step over it once (scripts/registry/,
# docs/schema-registry-service.md says why this version and what differs from Confluent's).
#
#   scripts/registry.sh install   # fetch and build once into the cache (needs java ≥ 17 and mvn)
#   scripts/registry.sh start     # install if missing, start a fresh, empty registry (idempotent)
#   scripts/registry.sh stop      # stop it; nothing is left running (its schemas are gone)
#   scripts/registry.sh restart   # kill -9 and start again (empty: the storage is in memory)
#   scripts/registry.sh status
#   scripts/registry.sh pid       # the registry JVM's own pid (tests pause it to simulate an outage)
#   scripts/registry.sh env       # `export` lines: plain and TLS URLs, CA, user, password, python
#   scripts/registry.sh clients   # venv with confluent-kafka's serializers; prints its python
#
# Listeners, on ${RIFFLE_REGISTRY_HOST:-127.0.0.1}:
#   HTTP   ${RIFFLE_REGISTRY_PORT:-19381}           no auth: what most tests use
#   HTTPS  ${RIFFLE_REGISTRY_TLS_PORT:-PORT+1}      HTTP basic auth, user ${RIFFLE_REGISTRY_USER:-riffle},
#          password ${RIFFLE_REGISTRY_PASSWORD:-riffle-registry-secret}; server certificate signed by
#          the CA in $state/ca.pem (new on every start). RIFFLE_REGISTRY_AUTH_ON=all asks for the
#          password on plain HTTP too.
# Global compatibility is BACKWARD after start (Confluent's default), set through the API.
# State (log, pid, certificates) in ${RIFFLE_REGISTRY_DIR:-$RIFFLE_SERVICES_DIR/registry-PORT},
# where RIFFLE_SERVICES_DIR is a test run's own folder (scripts/services.sh), else $cache;
# `stop` stops only the registry started there. The clients' venv in $cache/registry-clients.
set -euo pipefail

APICURIO_VERSION=2.4.2.Final
HEAP=256m

here="$(cd "$(dirname "$0")" && pwd)"
project="$here/registry"
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
home="$cache/tools/apicurio-registry-$APICURIO_VERSION"
app="$home/quarkus-app"
# Maven's repository of our own, inside the cache: no dependence on ~/.m2 or its state.
m2="$cache/tools/maven-repository"
venv="$cache/registry-clients"
port="${RIFFLE_REGISTRY_PORT:-19381}"
host="${RIFFLE_REGISTRY_HOST:-127.0.0.1}"
tls_port="${RIFFLE_REGISTRY_TLS_PORT:-$((port + 1))}"
user="${RIFFLE_REGISTRY_USER:-riffle}"
password="${RIFFLE_REGISTRY_PASSWORD:-riffle-registry-secret}"
auth_on="${RIFFLE_REGISTRY_AUTH_ON:-https}"
state="${RIFFLE_REGISTRY_DIR:-${RIFFLE_SERVICES_DIR:-$cache}/registry-$port}"
. "$(dirname "$0")/lib/service.sh"
log="$state/registry.log"
api=/apis/ccompat/v7

die() { echo "registry: $*" >&2; exit 1; }

need_java() {
  command -v java >/dev/null || die "java (17 or newer) is needed: apt-get install openjdk-17-jre-headless"
  local v
  v=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
  [ "${v%%.*}" -ge 17 ] 2>/dev/null || die "this registry build needs java 17 or newer, found '${v:-?}'"
}

# What the build in place was made from (a changed pom or source builds it again).
fingerprint() {
  (cd "$project" && find pom.xml src -type f | LC_ALL=C sort | xargs sha256sum) | sha256sum
}

installed() {
  [ -s "$app/quarkus-run.jar" ] && [ "$(cat "$home/complete" 2>/dev/null)" = "$(fingerprint)" ]
}

# One Maven install at a time (scripts/lib/service.sh).
install() { maven_install; }

fetch() {
  need_java
  command -v mvn >/dev/null || die "mvn is needed to fetch the registry: apt-get install maven"
  echo "registry: fetching Apicurio Registry $APICURIO_VERSION from Maven Central and building it into $app"
  mkdir -p "$home" "$m2"
  # Built in the cache, not in the source tree (no target/ under scripts/).
  rm -rf "$home/build"
  mkdir -p "$home/build"
  cp -r "$project/pom.xml" "$project/src" "$home/build/"
  # Maven's own output goes to a file and is shown only when it fails.
  if ! mvn -B -Dstyle.color=never -f "$home/build/pom.xml" -Dmaven.repo.local="$m2" \
      -Dquarkus.package.type=fast-jar package >"$home/mvn.log" 2>&1; then
    # Maven colours even with -B; strip that from the lines shown.
    sed -i 's/\x1b\[[0-9;]*m//g' "$home/mvn.log"
    # Apicurio's POMs name Confluent's repository too: a missing artifact reports that host as
    # unknown as well, so only failures to reach Central itself mean "offline".
    if grep -qiE 'from/to central .*(unknown ?host|connect(ion)? (refused|timed out)|network is unreachable)' "$home/mvn.log"; then
      grep -m1 -oiE '(could not transfer|transfer failed).*' "$home/mvn.log" >&2 || true
      die "cannot reach Maven Central to fetch Apicurio Registry (offline, or a proxy/mirror is needed in ~/.m2/settings.xml); Maven's log: $home/mvn.log"
    fi
    grep -E '^\[ERROR\]' "$home/mvn.log" | head -n 20 >&2 || tail -n 30 "$home/mvn.log" >&2
    die "mvn failed to build Apicurio Registry $APICURIO_VERSION; full log: $home/mvn.log"
  fi
  # Moved into place whole, so an interrupted install is never taken for a complete one.
  rm -rf "$app"
  mv "$home/build/target/quarkus-app" "$app"
  rm -rf "$home/build"
  fingerprint >"$home/complete"
  echo "registry: Apicurio Registry $APICURIO_VERSION installed ($(du -sh "$app" | cut -f1))"
}

# The pid file names a live registry started on this state (not a stranger that got the pid
# later, nor another run's registry): it runs in $state with $state's certificate.
running() {
  runs_here "$app/quarkus-run.jar" &&
    runs_here "$state/tls/server.pem"
}


# One HTTP/1.0 request on the plain listener (bash only: no curl needed). Prints the status
# code, then the body. http METHOD PATH [JSON-BODY]
http() {
  local method=$1 path=$2 body=${3:-} auth=""
  if [ "$auth_on" = all ]; then
    auth="Authorization: Basic $(printf '%s:%s' "$user" "$password" | base64 -w0)"$'\r\n'
  fi
  {
    exec 3<>"/dev/tcp/$host/$port" || return 1
    printf '%s %s HTTP/1.0\r\nHost: %s:%s\r\n%sContent-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: %s\r\n\r\n%s' \
      "$method" "$path" "$host" "$port" "$auth" "${#body}" "$body" >&3
    timeout 10 cat <&3
  } 2>/dev/null | tr -d '\r' | awk 'NR == 1 { print $2; next } body { print } /^$/ { body = 1 }'
}

ready() {
  [ "$(http GET "$api/subjects" | head -n 1)" = 200 ]
}

# A throwaway CA and a server certificate signed by it (for $host, 127.0.0.1 and localhost),
# new on every start. Clients verify with $state/ca.pem.
make_certificates() {
  command -v openssl >/dev/null || die "openssl is needed to make the registry's certificate"
  local tls="$state/tls" san="IP:127.0.0.1,DNS:localhost"
  if [[ "$host" =~ ^[0-9.]+$ ]]; then
    [ "$host" = 127.0.0.1 ] || san="$san,IP:$host"
  elif [ "$host" != localhost ]; then
    san="$san,DNS:$host"
  fi
  rm -rf "$tls" "$state/ca.pem"
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=Riffle registry test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$host" \
    -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
    -CAcreateserial -days 30 -out "$tls/server.pem" \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san") 2>/dev/null
  cp "$tls/ca.pem" "$state/ca.pem"
}

start() {
  install
  if running; then echo "registry: already running on http://$host:$port$api (log $log)"; return; fi
  [[ "$auth_on" = https || "$auth_on" = all ]] || die "RIFFLE_REGISTRY_AUTH_ON must be https or all, not '$auth_on'"
  mkdir -p "$state"
  rm -f "$state/pid"
  make_certificates
  launch
}

# Runs the JVM and waits until it answers, then sets Confluent's default compatibility.
launch() {
  need_java
  # A port already taken would only show as a bind error deep in the registry's log.
  local p
  for p in "$port" "$tls_port"; do
    ! (exec 3<>"/dev/tcp/$host/$p") 2>/dev/null ||
      die "$host:$p is already in use by another process (choose another RIFFLE_REGISTRY_PORT)"
  done
  # exec: the recorded pid is the JVM's own, so `pid` and `stop` reach the registry itself.
  # Ids are content ids, shared across subjects (legacy-id-mode off, Apicurio's default).
  # Apicurio's use-canonical-hash mode stays off: it sorts Avro fields. Schemas are normalized
  # instead by scripts/registry's ConfluentSchemas filter.
  (cd "$state" && exec nohup java -Xms32m -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
      -Dquarkus.http.host="$host" -Dquarkus.http.port="$port" -Dquarkus.http.ssl-port="$tls_port" \
      -Dquarkus.http.ssl.certificate.files="$state/tls/server.pem" \
      -Dquarkus.http.ssl.certificate.key-files="$state/tls/server.key" \
      -Driffle.registry.user="$user" -Driffle.registry.password="$password" \
      -Driffle.registry.auth-on="$auth_on" \
      -jar "$app/quarkus-run.jar" </dev/null >"$log" 2>&1) &
  echo $! >"$state/pid"
  for _ in $(seq 1 600); do
    if ready; then
      local answer
      answer=$(http PUT "$api/config" '{"compatibility":"BACKWARD"}')
      [ "$(head -n 1 <<<"$answer")" = 200 ] || { stop >/dev/null; die "setting the global compatibility failed: $answer"; }
      echo "registry: Apicurio Registry $APICURIO_VERSION on http://$host:$port$api and" \
        "https://$host:$tls_port$api (user $user, CA $state/ca.pem), pid $(cat "$state/pid"), log $log"
      return
    fi
    launched || { tail -n 40 "$log" >&2; die "the registry exited (log $log)"; }
    sleep 0.1
  done
  tail -n 40 "$log" >&2
  stop >/dev/null
  die "the registry did not answer on $host:$port within 60 s (log $log)"
}

# A crash and a restart: kill -9, then a new registry on the same ports (empty: in memory).
restart() {
  running || die "no registry is running on $host:$port (scripts/registry.sh start)"
  local pid
  pid=$(cat "$state/pid")
  kill -CONT "$pid" 2>/dev/null || true
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$state/pid"
  echo "registry: killed pid $pid; restarting (empty)"
  launch
}

stop() {
  if ! running; then rm -f "$state/pid"; return; fi
  local pid
  pid=$(cat "$state/pid")
  # CONT first: a registry a test left paused cannot act on TERM.
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "registry: the registry did not stop within 10 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$state/pid"
  echo "registry: stopped"
}

# The clients' venv was made from these requirements with this python.
clients_installed() {
  [ -x "$venv/bin/python" ] &&
    [ "$(cat "$venv/complete" 2>/dev/null)" = "$(sha256sum <"$project/requirements.txt") $(python3 -V 2>&1)" ]
}

clients() {
  # Two runs at once share the venv: one installs it, the other waits and finds it made.
  mkdir -p "$cache"
  exec 8>>"$cache/registry-clients.lock"
  flock 8
  if ! clients_installed; then
    command -v python3 >/dev/null || die "python3 is needed for the registry clients"
    echo "registry: installing the clients ($project/requirements.txt) into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 || die "python3 -m venv failed (apt-get install python3-venv)"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$project/requirements.txt" >&2 ||
      { rm -rf "$venv"; die "pip install -r $project/requirements.txt failed"; }
    # Fails here, not in a test, when a wheel is broken.
    "$venv/bin/python" -c 'import confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.protobuf, fastavro, grpc_tools.protoc' ||
      { rm -rf "$venv"; die "the clients installed but do not import"; }
    echo "$(sha256sum <"$project/requirements.txt") $(python3 -V 2>&1)" >"$venv/complete"
  fi
  exec 8>&-
  echo "$venv/bin/python"
}

env_lines() {
  printf 'export RIFFLE_REGISTRY_URL=%q\n' "http://$host:$port$api"
  printf 'export RIFFLE_REGISTRY_TLS_URL=%q\n' "https://$host:$tls_port$api"
  printf 'export RIFFLE_REGISTRY_CA=%q\n' "$state/ca.pem"
  printf 'export RIFFLE_REGISTRY_USER=%q\n' "$user"
  printf 'export RIFFLE_REGISTRY_PASSWORD=%q\n' "$password"
  if clients_installed; then
    printf 'export RIFFLE_REGISTRY_PYTHON=%q\n' "$venv/bin/python"
  fi
}

case "${1:-}" in
  install)
    if installed; then echo "registry: Apicurio Registry $APICURIO_VERSION present at $app"; else install; fi ;;
  start) start ;;
  stop) stop ;;
  restart) restart ;;
  status) if running; then echo "running on http://$host:$port$api (pid $(cat "$state/pid"))"; else echo "not running"; exit 1; fi ;;
  pid) running && cat "$state/pid" ;;
  env) env_lines ;;
  clients) clients ;;
  *) echo "usage: $0 install|start|stop|restart|status|pid|env|clients" >&2; exit 2 ;;
esac
