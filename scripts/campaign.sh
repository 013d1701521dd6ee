#!/usr/bin/env bash
# A fault campaign (issue 50): clusters of three processes in network namespaces, input flowing
# the whole time, faults at seeded random moments, every sink read by an independent reader
# (scripts/campaign.py says what is done and checked; scripts/lib/fault_campaign/ does it).
#
#   scripts/campaign.sh                     # the short campaign: 20 faults (what .ci/run runs)
#   scripts/campaign.sh --faults 200        # the long one, by hand
#   scripts/campaign.sh --seed 42           # replay a campaign: the same faults at the same moments
#   scripts/campaign.sh --docs              # also write its table into docs/reliability.md
#   scripts/campaign.sh --sinks kafka,jsonl --kinds kill,pause   # a part of it
#   scripts/campaign.sh --gap 2,6 --rate 40  # seconds between faults (MIN,MAX), input a second
#
# Needs root (network namespaces: scripts/netns.sh check; a tmpfs for the checkpoint disk;
# iptables in the namespaces), Java for the broker and the object store, PostgreSQL and Redis
# (their scripts install them), psql, redis-cli, libfaketime, and the venv of scripts/setup.sh
# (kafka-python, DuckDB, boto3). The namespaces are the machine's: one campaign (or
# netns test) at a time, through the same lock as tests/netns.rs. RIFFLE_BIN picks a built
# binary (default: build target/release/riffle). Exits 1 when a fault did not land or any sink
# lost, duplicated or took back a record, did not catch up, or did not stop.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=$(( $(date +%s%N) % 1000000007 ))
faults=20
docs=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --docs) docs=1; shift ;;
    --rate|--kinds|--sinks|--catch-up|--gap) extra+=("$1" "$2"); shift 2 ;;
    *) echo "campaign: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "campaign: needs root (network namespaces)" >&2; exit 2; }
scripts/netns.sh check || { echo "campaign: network namespaces do not work here" >&2; exit 2; }
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
python="$cache/kafka-venv/bin/python"
[ -x "$python" ] || { echo "campaign: no kafka-python venv at $python (run scripts/setup.sh)" >&2; exit 2; }
RIFFLE_BIN_GIVEN=${RIFFLE_BIN:-}
if [ -z "${RIFFLE_BIN:-}" ]; then
  cargo build --quiet --release --bin riffle
  RIFFLE_BIN="${CARGO_TARGET_DIR:-target}/release/riffle"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/riffle-campaign.XXXXXX")
exec 9>"${TMPDIR:-/tmp}/riffle-netns.lock"
flock 9
# The services listen on the bridge, where every namespace reaches them; their state lives in
# this campaign's folder, on ports reserved for it.
export RIFFLE_SERVICES_DIR="$work/services"
mkdir -p "$RIFFLE_SERVICES_DIR"
chmod 711 "$work" "$RIFFLE_SERVICES_DIR"
port=$(python3 scripts/lib/ports.py reserve "$work" 6)
export RIFFLE_KAFKA_HOST=10.77.0.1 RIFFLE_KAFKA_PORT=$port
# A restarted broker registers again once its old session has ended: Kafka's default 9 s, not
# the tests' 30 s (scripts/kafka.sh), since the campaign never pauses the broker.
export RIFFLE_KAFKA_SESSION_MS=9000
export RIFFLE_PG_HOST=10.77.0.1 RIFFLE_PG_PORT=$((port + 3))
export RIFFLE_REDIS_HOST=10.77.0.1 RIFFLE_REDIS_PORT=$((port + 4))
export RIFFLE_S3_HOST=10.77.0.1 RIFFLE_S3_PORT=$((port + 5))
# The checkpoint disk: small, so that the nemesis can fill it.
ckpt_disk="$work/ckpt-disk"
mkdir -p "$ckpt_disk"
cleanup() {
  scripts/s3.sh stop >/dev/null 2>&1 || true
  scripts/kafka.sh stop >/dev/null 2>&1 || true
  scripts/postgres.sh stop >/dev/null 2>&1 || true
  scripts/redis.sh stop >/dev/null 2>&1 || true
  scripts/netns.sh down >/dev/null 2>&1 || true
  umount -l "$ckpt_disk" >/dev/null 2>&1 || true
  python3 scripts/lib/ports.py release "$work" >/dev/null 2>&1 || true
  if [ "${RIFFLE_CAMPAIGN_KEEP:-0}" = 1 ]; then
    echo "campaign: its files are kept in $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
# Where no tmpfs can be mounted the checkpoint disk is a plain folder, and the campaign leaves
# out the `disk` fault (it says so).
mount -t tmpfs -o size=32m campaign-ckpt "$ckpt_disk" ||
  echo "campaign: cannot mount a tmpfs here: no checkpoint disk to fill" >&2
scripts/netns.sh up
scripts/kafka.sh start >/dev/null
scripts/postgres.sh start >/dev/null
scripts/redis.sh start >/dev/null
scripts/s3.sh start >/dev/null
eval "$(scripts/postgres.sh env)"
eval "$(scripts/redis.sh env)"
eval "$(scripts/s3.sh env)"
table="$work/table.md"
status=0
"$python" scripts/campaign.py --riffle "$RIFFLE_BIN" --brokers "$RIFFLE_KAFKA_HOST:$port" \
  --work "$work/run" --ckpt-disk "$ckpt_disk" --seed "$seed" --faults "$faults" "${extra[@]}" >"$table" || status=$?
cat "$table"
if [ "$status" != 0 ]; then
  echo "campaign: FAILED (seed $seed); the processes' logs:" >&2
  for f in "$work"/run/*/*.log; do echo "== $f" >&2; tail -15 "$f" >&2; done
  RIFFLE_CAMPAIGN_KEEP=1
fi
# The table is written whatever the result: a campaign that found a fault is news too.
if [ "$docs" = 1 ]; then
  # The command that replays it heads the table: the seed, the options and a binary picked by hand.
  command="scripts/campaign.sh --faults $faults --seed $seed ${extra[*]:-}"
  [ -z "${RIFFLE_BIN_GIVEN:-}" ] || command="RIFFLE_BIN=$RIFFLE_BIN_GIVEN $command"
  python3 - "$table" "${command% }" <<'PY'
import pathlib, re, sys
table, command = open(sys.argv[1]).read().strip(), sys.argv[2]
doc = pathlib.Path("docs/reliability.md")
text = doc.read_text()
begin, end = "<!-- campaign:begin -->", "<!-- campaign:end -->"
block = f"{begin}\n`{command} --docs`:\n\n{table}\n{end}"
if begin in text:
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n## Fault campaign\n\n" + block + "\n"
doc.write_text(text)
PY
fi
exit "$status"
