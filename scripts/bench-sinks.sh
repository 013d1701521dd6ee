#!/usr/bin/env bash
# Sink benchmark (issue #28 item 8): builds examples/bench_sinks.rs in release and runs it
# against PostgreSQL, Redis and S3 (S3Proxy), writing its table to docs/benchmarks/sinks.md with
# the machine's cores, CPU and the date. Arguments: rows per round (default 200000) and
# interleaved rounds (default 5). Run it on a quiet machine.
#
# A service named by its variable (RIFFLE_PG_URL, RIFFLE_REDIS_URL, RIFFLE_S3_BUCKET with the
# AWS_* variables) is used as it is; otherwise the local one of scripts/postgres.sh, redis.sh
# and s3.sh is used, started here if it is not running (and stopped again at the end; their
# ports follow RIFFLE_PG_PORT, RIFFLE_REDIS_PORT, RIFFLE_S3_PORT).
#
# BENCH_NOTE="…" adds a line under the header (e.g. that the machine was shared).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rows="${1:-200000}"
rounds="${2:-5}"

started=()
cleanup() {
  for s in "${started[@]}"; do
    scripts/"$s".sh stop >/dev/null || echo "${0##*/}: could not stop $s (scripts/$s.sh stop)" >&2
  done
}
trap cleanup EXIT

# use SERVICE VAR: the service's variables, starting it first when VAR is unset and it is down.
use() {
  local service=$1 var=$2
  if [ -n "${!var:-}" ]; then return; fi
  if ! scripts/"$service".sh status >/dev/null 2>&1; then
    scripts/"$service".sh start >&2
    started+=("$service")
  fi
  eval "$(scripts/"$service".sh env)"
}
use postgres RIFFLE_PG_URL
use redis RIFFLE_REDIS_URL
use s3 RIFFLE_S3_BUCKET

cargo build --quiet --release --example bench_sinks
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_sinks"
table=$(mktemp)
trap 'rm -f "$table"; cleanup' EXIT
status=0
RUST_LOG=error "$bin" --rows "$rows" --rounds "$rounds" >"$table" || status=$?
# Where PostgreSQL's gap comes from: the sink against its own statement form written by hand.
echo >>"$table"
RUST_LOG=error "$bin" --rows "$rows" --rounds "$rounds" --only postgres --postgres-plain unnest \
  >>"$table" || status=$?

pg_version=$(psql -X "$RIFFLE_PG_URL" -Atc 'SHOW server_version' 2>/dev/null || echo '?')
redis_version=$(REDISCLI_AUTH="${RIFFLE_REDIS_PASSWORD:-}" redis-cli --no-auth-warning \
  -h "${RIFFLE_REDIS_HOST:-127.0.0.1}" -p "${RIFFLE_REDIS_PORT:-19379}" INFO server 2>/dev/null |
  tr -d '\r' | sed -n 's/^redis_version://p')
s3proxy_version=$(sed -n 's/^S3PROXY_VERSION=//p' scripts/s3.sh)
out=docs/benchmarks/sinks.md
description=$(cat <<TEXT
Servers on the same machine: PostgreSQL ${pg_version%% *}, Redis ${redis_version:-?} (no
persistence), S3Proxy $s3proxy_version over a local folder (scripts/postgres.sh, redis.sh, s3.sh).

- The rows: deterministic synthetic clicks (\`id\`, \`user_id\`, \`item_id\`, \`ts\` timestamp,
  \`score\` float32, \`recs\` a list of 10 int64: nested, so jsonb in PostgreSQL, lists in
  Parquet, JSON arrays in Redis), in batches of 1,024 rows; the same batches for both sides.
- Riffle's sink is built as a pipeline builds it (the \`sink:\` block deserialized into
  \`SinkConfig\`, \`prepare\`, \`check_input\`, \`build\`), then timed from \`open\` through
  \`write_batch\` per batch, \`flush\` every 16 batches (an epoch completing, without
  checkpoints) to \`finish\`. The plain client's time includes its connection (and the
  table's creation), as the sink's \`open\` does.
- Plain clients, written as one would without Riffle: Parquet, \`ArrowWriter\` with the same
  compression (zstd, default level) into one file, or into memory and one PUT for S3 (through
  the \`object_store\` client, as the sink); PostgreSQL, the \`postgres\` crate's binary COPY
  (\`BinaryCopyInWriter\`) into a table of the same types and primary key, one COPY (one
  transaction) per 16 batches as the sink commits per flush; Redis, the \`redis\` crate, one
  \`SET click:<id>\` per row with the row as JSON (arrow-json, the sink's form, made in the
  timed section), pipelined in one \`MULTI\`/\`EXEC\` per 16 batches.
- Equal work: after each side, what landed is read back by an independent path and digested
  (Parquet: the files read with the \`parquet\` crate's Arrow reader, rows sorted by \`id\`, as
  JSON lines with the column types; PostgreSQL: the table's column types and key, then
  \`COPY (SELECT … ORDER BY id) TO STDOUT\`; Redis: \`DBSIZE\` and \`MGET\` of every key in
  order). "met" needs equal digests in every round and a median ratio ≥ 0.9; "outputs differ"
  replaces the ratio otherwise. Sides alternate which goes first; everything written is
  removed between sides. Rates are rows/s; the ratio is Riffle's over the plain client's,
  per round.
- The second table compares the sink with another plain client: one that sends
  \`INSERT … SELECT … FROM UNNEST(\$1::int8[], …, \$6::jsonb[]) ON CONFLICT (id) DO NOTHING\`
  by hand (one per batch, a transaction per 16 batches, arrays built straight from the Arrow
  buffers), the statement the sink used before it wrote with binary COPY. Its distance to
  COPY is that statement form's cost.
TEXT
)
bench_doc "$out" "Sinks" "scripts/bench-sinks.sh $rows $rounds" "$description" "$table"
echo "bench-sinks: wrote $out"
cat "$table"
exit "$status"
