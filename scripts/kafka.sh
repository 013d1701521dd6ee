#!/usr/bin/env bash
# A real Apache Kafka broker on 127.0.0.1 for tests and demos: one KRaft node (broker and
# controller in one JVM), run from the release jars that Maven fetches from Maven Central.
#
#   scripts/kafka.sh install   # fetch the jars once into the cache (needs java ≥ 17 and mvn)
#   scripts/kafka.sh start     # install if missing, start a fresh broker (idempotent)
#   scripts/kafka.sh stop      # stop it; nothing is left running
#   scripts/kafka.sh restart   # kill -9 and start again on the same data (a broker crash)
#   scripts/kafka.sh status
#   scripts/kafka.sh pid       # the broker JVM's own pid (tests pause it to simulate an outage)
#   scripts/kafka.sh env       # `export` lines for clients: plain and SASL_SSL addresses, CA, user
#   scripts/kafka.sh topic NAME [PARTITIONS]
#
# Listeners, on ${RIFFLE_KAFKA_HOST:-127.0.0.1}:
#   PLAINTEXT  ${RIFFLE_KAFKA_PORT:-9092}                        what the tests use
#   SASL_SSL   ${RIFFLE_KAFKA_SSL_PORT:-PORT+1}                  SCRAM-SHA-512 or PLAIN, user riffle,
#              password ${RIFFLE_KAFKA_PASSWORD:-riffle-secret}, server certificate from $state/ca.pem
#   CONTROLLER ${RIFFLE_KAFKA_CONTROLLER_PORT:-PORT+2}           KRaft's own, not for clients
# State (data, logs, certificates, pid) in ${RIFFLE_KAFKA_DIR:-$RIFFLE_SERVICES_DIR/kafka-PORT},
# where RIFFLE_SERVICES_DIR is a test run's own folder (scripts/services.sh), else $cache; the
# data is wiped on every start (not on restart). `stop` stops only the broker started there.
set -euo pipefail

KAFKA_VERSION=4.4.0
# The maven-dependency-plugin named in full, so a fresh machine gets this one, not "latest".
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
HEAP=768m

here="$(cd "$(dirname "$0")" && pwd)"
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
home="$cache/tools/kafka-$KAFKA_VERSION"
lib="$home/lib"
# Maven's repository of our own, inside the cache: no dependence on ~/.m2 or its state.
m2="$cache/tools/maven-repository"
port="${RIFFLE_KAFKA_PORT:-9092}"
host="${RIFFLE_KAFKA_HOST:-127.0.0.1}"
ssl_port="${RIFFLE_KAFKA_SSL_PORT:-$((port + 1))}"
controller_port="${RIFFLE_KAFKA_CONTROLLER_PORT:-$((port + 2))}"
user=riffle
password="${RIFFLE_KAFKA_PASSWORD:-riffle-secret}"
state="${RIFFLE_KAFKA_DIR:-${RIFFLE_SERVICES_DIR:-$cache}/kafka-$port}"
. "$(dirname "$0")/lib/service.sh"
log="$state/broker.log"

die() { echo "kafka: $*" >&2; exit 1; }

need_java() {
  command -v java >/dev/null || die "java (17 or newer) is needed: apt-get install openjdk-17-jre-headless"
  local v
  v=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
  [ "${v%%.*}" -ge 17 ] 2>/dev/null || die "Kafka $KAFKA_VERSION needs java 17 or newer, found '${v:-?}'"
}

# The jars in place were fetched with this pom (a changed pom fetches them again).
installed() {
  [ "$(cat "$home/complete" 2>/dev/null)" = "$(sha256sum <"$here/kafka/pom.xml")" ]
}

# One Maven install at a time (scripts/lib/service.sh).
install() { maven_install; }

fetch() {
  need_java
  command -v mvn >/dev/null || die "mvn is needed to fetch Kafka: apt-get install maven"
  echo "kafka: fetching Apache Kafka $KAFKA_VERSION jars from Maven Central into $lib"
  mkdir -p "$home" "$m2"
  rm -rf "$home/lib.part"
  # Maven's own output goes to a file and is shown only when it fails.
  if ! mvn -B -q -Dstyle.color=never -f "$here/kafka/pom.xml" -Dmaven.repo.local="$m2" \
      -Dkafka.version="$KAFKA_VERSION" "$DEPENDENCY_PLUGIN:copy-dependencies" \
      -DoutputDirectory="$home/lib.part" >"$home/mvn.log" 2>&1; then
    # Maven colours even with -B; strip that from the one line shown.
    sed -i 's/\x1b\[[0-9;]*m//g' "$home/mvn.log"
    if grep -qiE 'could not transfer|unknown ?host|connect(ion)? (refused|timed out)|network is unreachable' "$home/mvn.log"; then
      grep -m1 -oiE '(could not transfer|transfer failed).*' "$home/mvn.log" >&2 || true
      die "cannot reach Maven Central to fetch Kafka $KAFKA_VERSION (offline, or a proxy/mirror is needed in ~/.m2/settings.xml); Maven's log: $home/mvn.log"
    fi
    tail -n 30 "$home/mvn.log" >&2
    die "mvn failed to fetch Kafka $KAFKA_VERSION; full log: $home/mvn.log"
  fi
  # Moved into place whole, so an interrupted install is never taken for a complete one.
  rm -rf "$lib"
  mv "$home/lib.part" "$lib"
  sha256sum <"$here/kafka/pom.xml" >"$home/complete"
  echo "kafka: Kafka $KAFKA_VERSION installed ($(find "$lib" -name '*.jar' | wc -l) jars, $(du -sh "$lib" | cut -f1))"
}

# Runs one of Kafka's command-line tools (a main class) with the jars; logs WARN to stderr.
tool() {
  java -Xmx256m -XX:TieredStopAtLevel=1 -cp "$lib/*" \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
    -Driffle.log.level=WARN -Driffle.log.target=SYSTEM_ERR "$@"
}

# The pid file names a live broker started on this state (not a stranger that got the pid
# later, nor another run's broker): it runs in $state on $state's config.
running() {
  runs_here "$state/server.properties"
}


# A throwaway CA and a broker certificate signed by it, for the SASL_SSL listener. The broker
# reads a PKCS12 keystore; clients verify with $state/ca.pem (librdkafka) or the PKCS12
# truststore (Java clients). New on every start: nothing here outlives a test run.
make_certificates() {
  command -v openssl >/dev/null || die "openssl is needed to make the broker's certificate"
  local tls="$state/tls" san="IP:127.0.0.1,DNS:localhost"
  if [[ "$host" =~ ^[0-9.]+$ ]]; then
    [ "$host" = 127.0.0.1 ] || san="$san,IP:$host"
  elif [ "$host" != localhost ]; then
    san="$san,DNS:$host"
  fi
  rm -rf "$tls" "$state/ca.pem"
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=Riffle test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$host" \
    -keyout "$tls/broker.key" -out "$tls/broker.csr" 2>/dev/null
  openssl x509 -req -in "$tls/broker.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
    -CAcreateserial -days 30 -out "$tls/broker.pem" \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san") 2>/dev/null
  openssl pkcs12 -export -name broker -in "$tls/broker.pem" -inkey "$tls/broker.key" \
    -certfile "$tls/ca.pem" -out "$tls/broker.p12" -passout pass:riffle-test
  # OpenSSL 3.0 cannot mark a certificate as trusted for Java; keytool can.
  keytool -importcert -noprompt -alias riffle-ca -file "$tls/ca.pem" -storetype PKCS12 \
    -keystore "$tls/truststore.p12" -storepass riffle-test >/dev/null 2>&1
  cp "$tls/ca.pem" "$state/ca.pem"
}

write_config() {
  cat >"$state/server.properties" <<EOF
# Written by scripts/kafka.sh on each start: a one-node test broker.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$host:$controller_port
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://$host:$port,SASL_SSL://$host:$ssl_port,CONTROLLER://$host:$controller_port
advertised.listeners=PLAINTEXT://$host:$port,SASL_SSL://$host:$ssl_port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$state/data

# SASL_SSL: SCRAM users live in the cluster metadata (added at format time); PLAIN's in JAAS.
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$user="$password";
ssl.keystore.type=PKCS12
ssl.keystore.location=$state/tls/broker.p12
ssl.keystore.password=riffle-test
ssl.truststore.type=PKCS12
ssl.truststore.location=$state/tls/truststore.p12
ssl.truststore.password=riffle-test
ssl.client.auth=none

# One node: every internal topic with one replica, and few partitions so that the first
# consumer group and the first transaction do not wait for 50 partitions to be created.
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Tests pause the JVM (SIGSTOP) for 10 s. The 9 s default did not fence the broker when tried
# here, but a session longer than the pause rules it out. A broker killed and restarted cannot
# register again before its old session ends, so the fault campaign, which never pauses it,
# asks for a short one (RIFFLE_KAFKA_SESSION_MS).
broker.session.timeout.ms=${RIFFLE_KAFKA_SESSION_MS:-30000}
EOF
}

start() {
  install
  if running; then echo "kafka: already running on $host:$port (log $log)"; return; fi
  need_java
  [[ "$password" != *[\"\\]* ]] || die "RIFFLE_KAFKA_PASSWORD must not contain \" or \\"
  # A port already taken (another broker, another test run) would only show as a bind error
  # deep in the broker's log.
  local p
  for p in "$port" "$ssl_port" "$controller_port"; do
    ! (exec 3<>"/dev/tcp/$host/$p") 2>/dev/null ||
      die "$host:$p is already in use by another process (choose another RIFFLE_KAFKA_PORT)"
  done
  mkdir -p "$state"
  rm -rf "$state/data" "$state/pid"
  make_certificates
  write_config
  # A cluster id is 16 random bytes in URL-safe base64 (what `kafka-storage random-uuid` prints).
  # One id in 64 starts with `-`, which the storage tool takes for a flag; Kafka's own
  # Uuid.randomUuid() draws again in that case, and so does this.
  local cluster_id=-
  while [ "${cluster_id#-}" != "$cluster_id" ]; do
    cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
  done
  tool kafka.tools.StorageTool format --config "$state/server.properties" \
    --cluster-id "$cluster_id" \
    --add-scram "SCRAM-SHA-512=[name=$user,password=\"$password\"]" >"$state/format.log" 2>&1 ||
    { cat "$state/format.log" >&2; die "formatting $state/data failed"; }
  launch
}

# Runs the JVM on the state in $state and waits until it answers.
launch() {
  # exec: the recorded pid is the JVM's own, so `pid` and `stop` reach the broker itself.
  (cd "$state" && exec nohup java -Xms256m -Xmx"$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
      -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
      -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -cp "$lib/*" \
      kafka.Kafka "$state/server.properties" </dev/null >"$log" 2>&1) &
  echo $! >"$state/pid"
  # Ready once it answers a metadata request (an open port alone is not enough: the listener
  # binds before the broker has caught up with the metadata log).
  for _ in $(seq 1 600); do
    if ready; then
      echo "kafka: Apache Kafka $KAFKA_VERSION on $host:$port (PLAINTEXT), $host:$ssl_port" \
        "(SASL_SSL, user $user, CA $state/ca.pem), pid $(cat "$state/pid"), log $log"
      return
    fi
    launched || { tail -n 40 "$log" >&2; die "the broker exited (log $log)"; }
    sleep 0.2
  done
  tail -n 40 "$log" >&2
  stop >/dev/null
  die "the broker did not answer on $host:$port within 120 s (log $log)"
}

# A crash and a restart: kill -9, then the same broker on the same data (KRaft recovers its
# logs; committed data and open transactions survive, as on a real host). Tests use it.
restart() {
  running || die "no broker is running on $host:$port (scripts/kafka.sh start)"
  local pid
  pid=$(cat "$state/pid")
  kill -CONT "$pid" 2>/dev/null || true
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$state/pid"
  echo "kafka: killed pid $pid; restarting on the same data"
  launch
}

ready() {
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null || return 1
  if command -v kcat >/dev/null; then
    timeout 10 kcat -b "$host:$port" -L -m 5 >/dev/null 2>&1
  else
    grep -q 'Kafka Server started' "$log"
  fi
}

stop() {
  if ! running; then rm -f "$state/pid"; return; fi
  local pid
  pid=$(cat "$state/pid")
  # CONT first: a broker a test left paused cannot act on TERM.
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "kafka: the broker did not stop within 30 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$state/pid"
  echo "kafka: stopped"
}

env_lines() {
  printf 'export RIFFLE_KAFKA_BROKERS=%q\n' "$host:$port"
  printf 'export RIFFLE_KAFKA_SSL_BROKERS=%q\n' "$host:$ssl_port"
  printf 'export RIFFLE_KAFKA_CA=%q\n' "$state/ca.pem"
  printf 'export RIFFLE_KAFKA_USER=%q\n' "$user"
  printf 'export RIFFLE_KAFKA_PASSWORD=%q\n' "$password"
}

case "${1:-}" in
  install)
    if installed; then echo "kafka: Apache Kafka $KAFKA_VERSION present at $home"; else install; fi ;;
  start) start ;;
  stop) stop ;;
  restart) restart ;;
  status) if running; then echo "running on $host:$port (pid $(cat "$state/pid"))"; else echo "not running"; exit 1; fi ;;
  pid) running && cat "$state/pid" ;;
  env) env_lines ;;
  topic)
    [ -n "${2:-}" ] || die "usage: $0 topic NAME [PARTITIONS]"
    install
    tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$host:$port" --create \
      --if-not-exists --topic "$2" --partitions "${3:-4}" --replication-factor 1 ;;
  *) echo "usage: $0 install|start|stop|restart|status|pid|env|topic NAME [PARTITIONS]" >&2; exit 2 ;;
esac
