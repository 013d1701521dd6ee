#!/usr/bin/env bash
# Two test runs' services at once on one machine, as two clones' scripts/test.sh start them
# (scripts/services.sh up, each with a folder of its own and ports picked for it): both sets
# start and answer (kcat, curl, psql, redis-cli), each with its own data; a `stop` given another
# run's pid stops nothing; stopping one set leaves the other answering; stopping both leaves
# nothing of theirs running. scripts/test.sh runs it (about a minute on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
# The ports and folders are picked here, as for a run with nothing set by hand.
for v in $(compgen -v | grep -E '^(RIFFLE_(KAFKA|S3|PG|REDIS|REGISTRY)_|RIFFLE_SERVICES_DIR$)'); do
  unset "$v"
done
top=$(mktemp -d "${TMPDIR:-/tmp}/riffle-services-twice.XXXXXX")
# PostgreSQL runs as `postgres` under root: it passes through this folder to its own.
chmod 711 "$top"
failed=0
cleanup() {
  scripts/services.sh down "$top/a" >/dev/null 2>&1 || true
  scripts/services.sh down "$top/b" >/dev/null 2>&1 || true
  rm -rf "$top"
}
trap cleanup EXIT
fail() { echo "services-twice: FAILED: $*" >&2; failed=1; }
started=$SECONDS

# Both at once (their JVMs start side by side, as two test runs' would).
scripts/services.sh up "$top/a" >"$top/a.log" 2>&1 &
up_a=$!
scripts/services.sh up "$top/b" >"$top/b.log" 2>&1 &
up_b=$!
ok=1
wait "$up_a" || { ok=0; echo "services-twice: set a did not start:" >&2; cat "$top/a.log" >&2; }
wait "$up_b" || { ok=0; echo "services-twice: set b did not start:" >&2; cat "$top/b.log" >&2; }
[ "$ok" = 1 ] || { echo "services-twice: FAILED" >&2; exit 1; }
echo "services-twice: both sets up in $((SECONDS - started)) s"

# A value from a set's env file.
var() { (. "$top/$1/env" && printenv "$2"); }

# answers SET: each of its five servers answers, and holds SET's own marker (written by `mark`),
# not the other set's. Prints what failed; fails if anything did.
answers() {
  (
    . "$top/$1/env"
    set +e
    bad=0
    # Kafka: metadata over PLAINTEXT, and the marker read back from a topic.
    timeout 30 kcat -b "$RIFFLE_KAFKA_BROKERS" -L -t marker >/dev/null 2>&1 ||
      { echo "  kafka on $RIFFLE_KAFKA_BROKERS does not answer"; bad=1; }
    got=$(timeout 30 kcat -b "$RIFFLE_KAFKA_BROKERS" -C -t marker -o beginning -e -q 2>/dev/null)
    [ "$got" = "$1" ] || { echo "  kafka's marker topic holds '$got', not '$1'"; bad=1; }
    # S3: a signed GET of the marker object (curl 7.88 signs a payload hash it does not send).
    got=$(curl -fsS --max-time 10 --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
      --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
      "$AWS_ENDPOINT_URL/$RIFFLE_S3_BUCKET/marker" 2>&1)
    [ "$got" = "$1" ] || { echo "  s3 at $AWS_ENDPOINT_URL: marker '$got', not '$1'"; bad=1; }
    # PostgreSQL: over TLS with its own CA, the marker row.
    got=$(PGCONNECT_TIMEOUT=10 psql -X -At "$RIFFLE_PG_URL?sslmode=verify-full&sslrootcert=$RIFFLE_PG_CA" \
      -c 'SELECT name FROM marker' 2>&1)
    [ "$got" = "$1" ] || { echo "  postgres at $RIFFLE_PG_URL: marker '$got', not '$1'"; bad=1; }
    # Redis: the marker key.
    got=$(REDISCLI_AUTH="$RIFFLE_REDIS_PASSWORD" timeout 10 redis-cli --no-auth-warning \
      -h "$RIFFLE_REDIS_HOST" -p "$RIFFLE_REDIS_PORT" GET marker 2>&1)
    [ "$got" = "$1" ] || { echo "  redis on $RIFFLE_REDIS_PORT: marker '$got', not '$1'"; bad=1; }
    # The registry: over HTTPS with its own CA and password, the one subject registered.
    got=$(curl -fsS --max-time 10 --cacert "$RIFFLE_REGISTRY_CA" \
      --user "$RIFFLE_REGISTRY_USER:$RIFFLE_REGISTRY_PASSWORD" "$RIFFLE_REGISTRY_TLS_URL/subjects" 2>&1)
    [ "$got" = "[\"marker-$1\"]" ] || { echo "  registry at $RIFFLE_REGISTRY_TLS_URL: subjects $got, not [\"marker-$1\"]"; bad=1; }
    exit "$bad"
  )
}

# mark SET: SET's name written into each of its servers.
mark() {
  (
    . "$top/$1/env"
    echo "$1" | kcat -b "$RIFFLE_KAFKA_BROKERS" -P -t marker
    printf '%s' "$1" >"$top/$1.marker"
    curl -fsS --max-time 10 --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
      --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
      -H "x-amz-content-sha256: $(sha256sum <"$top/$1.marker" | cut -c1-64)" \
      -T "$top/$1.marker" "$AWS_ENDPOINT_URL/$RIFFLE_S3_BUCKET/marker"
    psql -X -q -v ON_ERROR_STOP=1 "$RIFFLE_PG_URL" \
      -c "CREATE TABLE marker (name text); INSERT INTO marker VALUES ('$1')"
    REDISCLI_AUTH="$RIFFLE_REDIS_PASSWORD" redis-cli --no-auth-warning \
      -h "$RIFFLE_REDIS_HOST" -p "$RIFFLE_REDIS_PORT" SET marker "$1" >/dev/null
    curl -fsS --max-time 10 -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
      --data '{"schema": "{\"type\": \"string\"}"}' \
      "$RIFFLE_REGISTRY_URL/subjects/marker-$1/versions" >/dev/null
  )
}

# pids SET: its servers' pids, one a line (`?NAME` for one not running).
pids() {
  local s
  for s in kafka s3 postgres redis registry; do
    (. "$top/$1/env" && "scripts/$s.sh" pid) || echo "?$s"
  done
}

mark a
mark b
for s in a b; do
  if out=$(answers "$s"); then echo "services-twice: set $s answers, with its own data"; else fail "set $s:"$'\n'"$out"; fi
done
# Two sets on different ports, in different folders.
for v in RIFFLE_KAFKA_PORT RIFFLE_S3_PORT RIFFLE_PG_PORT RIFFLE_REDIS_PORT RIFFLE_REGISTRY_PORT; do
  [ "$(var a "$v")" != "$(var b "$v")" ] || fail "both sets have $v=$(var a "$v")"
done
echo "services-twice: ports a: kafka $(var a RIFFLE_KAFKA_PORT), s3 $(var a RIFFLE_S3_PORT)," \
  "postgres $(var a RIFFLE_PG_PORT), redis $(var a RIFFLE_REDIS_PORT), registry $(var a RIFFLE_REGISTRY_PORT);" \
  "b: kafka $(var b RIFFLE_KAFKA_PORT), s3 $(var b RIFFLE_S3_PORT), postgres $(var b RIFFLE_PG_PORT)," \
  "redis $(var b RIFFLE_REDIS_PORT), registry $(var b RIFFLE_REGISTRY_PORT)"
pids_a=$(pids a)
pids_b=$(pids b)
case "$pids_a $pids_b" in *'?'*) fail "a server is not running: a: $pids_a; b: $pids_b" ;; esac

# A pid file naming another run's server (a stale file, a reused pid): `stop` leaves it alone.
mkdir "$top/stranger"
for s in kafka s3 redis registry; do
  (. "$top/a/env" && "scripts/$s.sh" pid) >"$top/stranger/pid"
  upper=$(tr a-z A-Z <<<"$s")
  env "RIFFLE_${upper}_DIR=$top/stranger" "scripts/$s.sh" stop >/dev/null
done
[ "$(pids a)" = "$pids_a" ] || fail "a stop on another folder's pid file stopped set a's server"

# Set a stopped (as its test run ends): set b goes on answering.
scripts/services.sh down "$top/a" >"$top/a-down.log" 2>&1 || { cat "$top/a-down.log" >&2; fail "stopping set a"; }
for pid in $pids_a; do
  if kill -0 "$pid" 2>/dev/null; then fail "set a's pid $pid still runs after its stop"; fi
done
for v in RIFFLE_KAFKA_PORT RIFFLE_S3_PORT RIFFLE_PG_PORT RIFFLE_REDIS_PORT RIFFLE_REGISTRY_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$(var a "$v")") 2>/dev/null; then fail "set a's $v still answers"; fi
done
if out=$(answers b); then
  echo "services-twice: set a stopped; set b still answers"
else
  fail "set b after set a stopped:"$'\n'"$out"
fi
[ "$(pids b)" = "$pids_b" ] || fail "set b's servers changed when set a stopped: $pids_b, now $(pids b)"

scripts/services.sh down "$top/b" >"$top/b-down.log" 2>&1 || { cat "$top/b-down.log" >&2; fail "stopping set b"; }
# Nothing of theirs left: no process working in, or started on, either folder.
left=""
for p in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
  if [[ "$(readlink "$p/cwd" 2>/dev/null)" == "$top"/* || "$cmd" == *"$top/"* ]]; then
    left+=" ${p#/proc/}(${cmd:0:60})"
  fi
done
[ -z "$left" ] || fail "still running after both stopped:$left"
if [ "$failed" = 0 ]; then
  echo "services-twice: ok: both stopped, nothing of theirs running ($((SECONDS - started)) s)"
fi
exit "$failed"
