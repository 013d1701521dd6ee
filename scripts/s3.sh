#!/usr/bin/env bash
# A real S3-compatible server on 127.0.0.1 for tests and demos: S3Proxy (one JVM) over a
# local folder, taking only signed requests (AWS signature v2 or v4), fetched once from Maven
# Central. It keeps conditional writes honest: `If-None-Match: *` on an existing key is
# refused with 412, which checkpoints on object stores rely on.
#
#   scripts/s3.sh install   # fetch the jar once into the cache (needs java ≥ 17, and mvn or curl)
#   scripts/s3.sh start     # install if missing, start on fresh (empty) data (idempotent)
#   scripts/s3.sh resume    # start again on the data a `stop` left (a store back after an outage)
#   scripts/s3.sh stop      # stop it; nothing is left running, the data stays
#   scripts/s3.sh restart   # kill -9 and start again on the same data (a server crash)
#   scripts/s3.sh status
#   scripts/s3.sh pid       # the server JVM's own pid (tests pause it to simulate a hung store)
#   scripts/s3.sh env       # `export` lines for clients: endpoint, credentials, region, bucket
#   scripts/s3.sh bucket NAME   # another (empty) bucket
#
# Address http://${RIFFLE_S3_HOST:-127.0.0.1}:${RIFFLE_S3_PORT:-19300}, access key
# ${RIFFLE_S3_ACCESS_KEY:-riffle}, secret ${RIFFLE_S3_SECRET:-riffle-s3-secret}, bucket
# ${RIFFLE_S3_BUCKET:-riffle-test} (made on every start). State (data, log, config, pid) in
# ${RIFFLE_S3_DIR:-$RIFFLE_SERVICES_DIR/s3-PORT}, where RIFFLE_SERVICES_DIR is a test run's own
# folder (scripts/services.sh), else $cache; a bucket is a folder under $state/data. `stop`
# stops only the server started there.
set -euo pipefail

S3PROXY_VERSION=4.1.0
ARTIFACT="org.gaul:s3proxy:$S3PROXY_VERSION:jar:jar-with-dependencies"
# The maven-dependency-plugin named in full, so a fresh machine gets this one, not "latest".
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
CENTRAL=https://repo1.maven.org/maven2
HEAP=256m

cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
home="$cache/tools/s3proxy-$S3PROXY_VERSION"
jar="$home/s3proxy.jar"
# Maven's repository of our own, inside the cache: no dependence on ~/.m2 or its state.
m2="$cache/tools/maven-repository"
port="${RIFFLE_S3_PORT:-19300}"
host="${RIFFLE_S3_HOST:-127.0.0.1}"
access_key="${RIFFLE_S3_ACCESS_KEY:-riffle}"
secret="${RIFFLE_S3_SECRET:-riffle-s3-secret}"
bucket="${RIFFLE_S3_BUCKET:-riffle-test}"
state="${RIFFLE_S3_DIR:-${RIFFLE_SERVICES_DIR:-$cache}/s3-$port}"
. "$(dirname "$0")/lib/service.sh"
log="$state/s3proxy.log"

die() { echo "s3: $*" >&2; exit 1; }

need_java() {
  command -v java >/dev/null || die "java (17 or newer) is needed: apt-get install openjdk-17-jre-headless"
  local v
  v=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
  [ "${v%%.*}" -ge 17 ] 2>/dev/null || die "S3Proxy $S3PROXY_VERSION needs java 17 or newer, found '${v:-?}'"
}

installed() { [ -s "$jar" ] && [ -f "$home/complete" ]; }

# One Maven install at a time (scripts/lib/service.sh).
install() { maven_install; }

fetch() {
  need_java
  mkdir -p "$home" "$m2"
  rm -rf "$home/part"
  mkdir "$home/part"
  echo "s3: fetching S3Proxy $S3PROXY_VERSION from Maven Central into $home"
  if command -v mvn >/dev/null; then
    # Maven checks the download against Central's checksum; its output goes to a file.
    if ! mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$m2" "$DEPENDENCY_PLUGIN:copy" \
        -Dartifact="$ARTIFACT" -DoutputDirectory="$home/part" -Dmdep.stripVersion=true \
        >"$home/mvn.log" 2>&1; then
      sed -i 's/\x1b\[[0-9;]*m//g' "$home/mvn.log"
      tail -n 20 "$home/mvn.log" >&2
      die "mvn failed to fetch $ARTIFACT (offline, or a mirror is needed in ~/.m2/settings.xml); full log: $home/mvn.log"
    fi
    mv "$home/part/s3proxy-jar-with-dependencies.jar" "$home/part/s3proxy.jar"
  else
    command -v curl >/dev/null || die "mvn or curl is needed to fetch S3Proxy: apt-get install maven"
    local url="$CENTRAL/org/gaul/s3proxy/$S3PROXY_VERSION/s3proxy-$S3PROXY_VERSION-jar-with-dependencies.jar"
    curl -fsSL --retry 3 -o "$home/part/s3proxy.jar" "$url" || die "cannot download $url"
    local want got
    want=$(curl -fsSL --retry 3 "$url.sha1" | cut -c1-40) || die "cannot download $url.sha1"
    got=$(sha1sum "$home/part/s3proxy.jar" | cut -c1-40)
    [ "$want" = "$got" ] || die "$url: checksum $got, Maven Central says $want"
  fi
  # Moved into place whole, so an interrupted install is never taken for a complete one.
  mv -f "$home/part/s3proxy.jar" "$jar"
  rm -rf "$home/part"
  touch "$home/complete"
  echo "s3: S3Proxy $S3PROXY_VERSION installed ($(du -sh "$jar" | cut -f1))"
}

# The pid file names a live server started on this state (not a stranger that got the pid
# later, nor another run's server): it runs in $state on $state's config.
running() {
  runs_here "$state/s3proxy.conf"
}


# Answers HTTP at all (an unsigned request gets a 403 or a listing; either means it serves).
ready() {
  local status
  status=$({ exec 3<>"/dev/tcp/$host/$port" &&
    printf 'HEAD /%s HTTP/1.0\r\nHost: %s:%s\r\n\r\n' "$bucket" "$host" "$port" >&3 &&
    timeout 5 head -n 1 <&3; } 2>/dev/null) || return 1
  [[ "$status" == HTTP/1.?\ [0-9]* ]]
}

write_config() {
  cat >"$state/s3proxy.conf" <<EOF
# Written by scripts/s3.sh on each start: a test S3 server over local folders.
s3proxy.endpoint=http://$host:$port
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$access_key
s3proxy.credential=$secret
jclouds.provider=filesystem
jclouds.filesystem.basedir=$state/data
EOF
}

start() {
  install
  if running; then echo "s3: already running on http://$host:$port (log $log)"; return; fi
  mkdir -p "$state"
  rm -rf "$state/data" "$state/pid"
  launch
}

# Runs the JVM on the data in $state and waits until it answers.
launch() {
  need_java
  # A port already taken would only show as a bind error deep in the server's log.
  ! (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null ||
    die "$host:$port is already in use by another process (choose another RIFFLE_S3_PORT)"
  mkdir -p "$state/data/$bucket"
  write_config
  # exec: the recorded pid is the JVM's own, so `pid` and `stop` reach the server itself.
  (cd "$state" && exec nohup java -Xms64m -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
      -jar "$jar" --properties "$state/s3proxy.conf" </dev/null >"$log" 2>&1) &
  echo $! >"$state/pid"
  for _ in $(seq 1 600); do
    if ready; then
      echo "s3: S3Proxy $S3PROXY_VERSION on http://$host:$port (bucket $bucket, access key" \
        "$access_key), pid $(cat "$state/pid"), data $state/data, log $log"
      return
    fi
    launched || { tail -n 40 "$log" >&2; die "the server exited (log $log)"; }
    sleep 0.1
  done
  tail -n 40 "$log" >&2
  stop >/dev/null
  die "the server did not answer on $host:$port within 60 s (log $log)"
}

resume() {
  install
  if running; then echo "s3: already running on http://$host:$port (log $log)"; return; fi
  rm -f "$state/pid"
  launch
}

# A crash and a restart: kill -9, then the same server on the same data.
restart() {
  running || die "no server is running on $host:$port (scripts/s3.sh start)"
  local pid
  pid=$(cat "$state/pid")
  kill -CONT "$pid" 2>/dev/null || true
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$state/pid"
  echo "s3: killed pid $pid; restarting on the same data"
  launch
}

stop() {
  if ! running; then rm -f "$state/pid"; return; fi
  local pid
  pid=$(cat "$state/pid")
  # CONT first: a server a test left paused cannot act on TERM.
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "s3: the server did not stop within 10 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$state/pid"
  echo "s3: stopped"
}

env_lines() {
  printf 'export AWS_ENDPOINT_URL=%q\n' "http://$host:$port"
  printf 'export AWS_ACCESS_KEY_ID=%q\n' "$access_key"
  printf 'export AWS_SECRET_ACCESS_KEY=%q\n' "$secret"
  printf 'export AWS_REGION=us-east-1\n'
  printf 'export AWS_ALLOW_HTTP=true\n'
  printf 'export RIFFLE_S3_BUCKET=%q\n' "$bucket"
}

case "${1:-}" in
  install)
    if installed; then echo "s3: S3Proxy $S3PROXY_VERSION present at $jar"; else install; fi ;;
  start) start ;;
  resume) resume ;;
  stop) stop ;;
  restart) restart ;;
  status) if running; then echo "running on http://$host:$port (pid $(cat "$state/pid"))"; else echo "not running"; exit 1; fi ;;
  pid) running && cat "$state/pid" ;;
  env) env_lines ;;
  bucket)
    [[ "${2:-}" =~ ^[a-z0-9][a-z0-9.-]{2,62}$ ]] || die "usage: $0 bucket NAME (3-63 of a-z 0-9 . -)"
    mkdir -p "$state/data/$2" ;;
  *) echo "usage: $0 install|start|resume|stop|restart|status|pid|env|bucket NAME" >&2; exit 2 ;;
esac
