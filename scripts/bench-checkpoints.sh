#!/usr/bin/env bash
# Checkpoint benchmark (issue #28 item 8): the same Kafka-fed pipeline (clicks-obd-kafka's job:
# JSON impressions → the CTR model → a JSON-lines file) run with checkpoints in a local
# directory (`--checkpoint-dir`) and on S3 (`--checkpoint-url s3://…`, S3Proxy here), a
# checkpoint at every epoch, in interleaved rounds; writes the table to
# docs/benchmarks/checkpoints.md with the machine's cores, CPU and the date. Arguments: events
# (default 600000; a second table runs a tenth of them) and rounds (default 5). Run it on a quiet
# machine.
#
# The broker is scripts/kafka.sh's on RIFFLE_KAFKA_PORT (default 19092), the store
# RIFFLE_S3_BUCKET with the AWS_* variables, else scripts/s3.sh's (RIFFLE_S3_PORT); either is
# started here when it is not running, and stopped again at the end.
#
# BENCH_NOTE="…" adds a line under the header (e.g. that the machine was shared).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
events="${1:-600000}"
rounds="${2:-5}"
short=$((events / 10))
export RIFFLE_KAFKA_PORT="${RIFFLE_KAFKA_PORT:-19092}"
brokers="127.0.0.1:$RIFFLE_KAFKA_PORT"
[ -f models/obd_ctr.onnx ] || { echo "bench-checkpoints: models/obd_ctr.onnx is missing" >&2; exit 1; }

started=()
work=$(mktemp -d)
cleanup() {
  rm -rf "$work"
  for s in "${started[@]}"; do
    scripts/"$s".sh stop >/dev/null || echo "${0##*/}: could not stop $s (scripts/$s.sh stop)" >&2
  done
}
trap cleanup EXIT
if ! scripts/kafka.sh status >/dev/null 2>&1; then
  scripts/kafka.sh start >&2
  started+=(kafka)
fi
if [ -z "${RIFFLE_S3_BUCKET:-}" ]; then
  if ! scripts/s3.sh status >/dev/null 2>&1; then
    scripts/s3.sh start >&2
    started+=(s3)
  fi
  eval "$(scripts/s3.sh env)"
  # Where S3Proxy keeps the objects: the checkpoints' count and times are read there.
  cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
  export BENCH_S3_DATA="${RIFFLE_S3_DIR:-${RIFFLE_SERVICES_DIR:-$cache}/s3-${RIFFLE_S3_PORT:-19300}}/data/$RIFFLE_S3_BUCKET"
fi

cargo build --quiet --release --bin riffle
riffle="$(pwd)/${CARGO_TARGET_DIR:-target}/release/riffle"

# measure N: N events produced to a topic of their own, then the interleaved rounds; the
# table is appended to $table.
measure() {
  local n=$1 topic
  # The input: the bundled 300 impressions repeated, event ids renumbered, produced once.
  python3 - "$n" data/clickstream/obd-events.jsonl >"$work/events.jsonl" <<'PY'
import json, sys
n, path = int(sys.argv[1]), sys.argv[2]
base = [json.loads(l) for l in open(path) if l.strip()]
for i in range(n):
    e = dict(base[i % len(base)])
    e["event_id"] = i
    print(json.dumps(e, separators=(",", ":")))
PY
  topic="bench-checkpoints-$n-$(date +%s)-$$"
  "$riffle" produce --brokers "$brokers" --topic "$topic" --partitions 4 --jsonl "$work/events.jsonl" >&2
  rm -f "$work/events.jsonl"

  cat >"$work/pipeline.yaml" <<YAML
name: bench-checkpoints
source:
  kafka:
    brokers: "$brokers"
    topic: $topic
    format: json
    stop_at_end: true
    batch_size: 256
    schema:
      event_id: int64
      user_feat: float32[4]
      affinity: float32[80]
      position: int64
stages:
  - model:
      path: $(pwd)/models/obd_ctr.onnx
      inputs: { user_feat: user_feat, affinity: affinity, position: position }
      outputs: { p_click: p_click }
      keep_inputs: true
      batch: { max_size: 1024, max_delay_ms: 2 }
  - select: { columns: [event_id, position, p_click] }
sink:
  jsonl: { path: $work/out.jsonl }
dead_letter:
  jsonl: { path: $work/dead-letters.jsonl }
runtime:
  workers: 2
  checkpoint: { dir: $work/unused, interval_ms: 0, keep: 1000 }
YAML

  # The run's own line on its checkpoint writes (count, p50, p99) is logged at info.
  RIFFLE="$riffle" WORK="$work" ROUNDS="$rounds" EVENTS="$n" \
    RUST_LOG=warn,riffle_dataflow::runtime::worker=info \
    python3 - >>"$table" <<'PY'
import glob, hashlib, json, os, re, statistics, subprocess, sys

riffle, work = os.environ["RIFFLE"], os.environ["WORK"]
rounds, events = int(os.environ["ROUNDS"]), int(os.environ["EVENTS"])
bucket = os.environ["RIFFLE_S3_BUCKET"]
s3_data = os.environ.get("BENCH_S3_DATA")
tag = f"bench-checkpoints-{os.getpid()}"
out = os.path.join(work, "out.jsonl")
SUMMARY = re.compile(r"results: (\d+) in ([\d.]+) s = ([\d.]+) records/s")
WRITES = re.compile(r"checkpoint writes to \S+: (\d+), p50 ([\d.]+) ms, p99 ([\d.]+) ms")

def digest():
    """Sorted result lines, latency fields left out, each line's keys sorted."""
    lines = []
    with open(out) as f:
        for line in f:
            row = {k: v for k, v in json.loads(line).items() if "latency" not in k}
            lines.append(json.dumps(row, sort_keys=True, separators=(",", ":")))
    lines.sort()
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12], len(lines)

def checkpoints(folder):
    """The checkpoint files' modification times, in epoch order (None: not readable here)."""
    if folder is None or not os.path.isdir(folder):
        return None
    files = sorted(glob.glob(os.path.join(folder, "epoch-*.ckpt")))
    return [os.stat(f).st_mtime_ns / 1e6 for f in files]

def run(side, rnd):
    if os.path.exists(out):
        os.remove(out)
    prefix = f"{tag}/r{rnd}-{side}"
    if side == "dir":
        where = os.path.join(work, prefix)
        args = ["--checkpoint-dir", where]
    else:
        where = os.path.join(s3_data, prefix) if s3_data else None
        args = ["--checkpoint-url", f"s3://{bucket}/{prefix}"]
    p = subprocess.run([riffle, "run", os.path.join(work, "pipeline.yaml"), *args],
                       capture_output=True, text=True)
    text = p.stdout + p.stderr
    m = SUMMARY.search(text)
    if p.returncode != 0 or not m:
        sys.exit(f"bench-checkpoints: {side} round {rnd} failed ({p.returncode}):\n{text[-3000:]}")
    times = checkpoints(where)
    w = WRITES.search(text)
    if not w:
        sys.exit(f"bench-checkpoints: {side} round {rnd}: no checkpoint-writes line:\n{text[-3000:]}")
    result = dict(rate=float(m.group(3)), secs=float(m.group(2)), digest=digest(), times=times,
                  p50=float(w.group(2)), p99=float(w.group(3)))
    print(f"bench-checkpoints: round {rnd} {side}: {result['rate']:.0f} records/s, "
          f"{'?' if times is None else len(times)} checkpoints, digest {result['digest'][0]}",
          file=sys.stderr)
    return result

sides = {"dir": [], "url": []}
ratios = []
for rnd in range(1, rounds + 1):
    order = ["dir", "url"] if rnd % 2 == 1 else ["url", "dir"]
    got = {side: run(side, rnd) for side in order}
    for side in order:
        sides[side].append(got[side])
    ratios.append(got["url"]["rate"] / got["dir"]["rate"])

def spread(values, digits):
    v = sorted(values)
    return f"{statistics.median(v):.{digits}f} ({v[0]:.{digits}f}–{v[-1]:.{digits}f})"

def quantile(values, q):
    v = sorted(values)
    return v[round((len(v) - 1) * q)]

def cadence(runs):
    counts = [len(r["times"]) for r in runs if r["times"] is not None]
    gaps = [b - a for r in runs if r["times"] for a, b in zip(r["times"], r["times"][1:])]
    if not counts:
        return "not readable here", "-"
    gap = f"{quantile(gaps, 0.5):.1f} / {quantile(gaps, 0.99):.1f} ms" if gaps else "-"
    return spread(counts, 0), gap

def digests(runs):
    seen = sorted({r["digest"] for r in runs})
    text = " / ".join(f"`{h}` ({n} lines)" for h, n in seen)
    return ("varies: " if len(seen) > 1 else "") + text

equal = all(a["digest"] == b["digest"] for a, b in zip(sides["dir"], sides["url"]))
equal = equal and all(r["digest"][1] == events for r in sides["dir"])
median = statistics.median(ratios)
verdict = "outputs differ" if not equal else ("met" if median >= 0.95 else "below target")
print(f"| checkpoints: {events} events from Kafka (4 partitions), 2 workers, a checkpoint at "
      f"every epoch, median (min–max) of {rounds} rounds | records/s (run summary) | run s "
      f"| ratio to the directory | checkpoints written | interval between checkpoints p50 / p99 "
      f"| write latency p50 / p99 | output digest | target ≥ 0.95 |")
print("|---|---:|---:|---:|---:|---:|---|---|---|")
for side, label in (("dir", "local directory (`--checkpoint-dir`)"),
                    ("url", "S3 on S3Proxy (`--checkpoint-url s3://…`)")):
    runs = sides[side]
    count, gap = cadence(runs)
    ratio = "1" if side == "dir" else ("outputs differ" if not equal else spread(ratios, 2))
    print(f"| {label} | {spread([r['rate'] for r in runs], 0)} | "
          f"{spread([r['secs'] for r in runs], 2)} | {ratio} | {count} | {gap} | "
          f"{spread([r['p50'] for r in runs], 1)} / {spread([r['p99'] for r in runs], 1)} ms | "
          f"{digests(runs)} | {'' if side == 'dir' else verdict} |")
if s3_data:
    # The checkpoints this run left on S3Proxy (its folder is the bucket).
    import shutil
    shutil.rmtree(os.path.join(s3_data, tag), ignore_errors=True)
PY
}

table="$work/table.md"
: >"$table"
measure "$events"
# A short run: the object store's fixed costs per run (lease, listing, release) weigh more.
echo >>"$table"
measure "$short"

out=docs/benchmarks/checkpoints.md
description=$(cat <<TEXT
- The job: \`pipelines/clicks-obd-kafka.yaml\`'s (JSON impressions from a Kafka topic of 4
  partitions → the CTR model → \`event_id, position, p_click\` into a JSON-lines file), 2
  workers, \`runtime.checkpoint\` with \`interval_ms: 0\` (a checkpoint at every completed
  epoch the checkpointer can take) and \`keep: 1000\` (none pruned, so they can be counted). The
  input (the bundled 300 impressions repeated to $events events, ids renumbered; $short for
  the second table) is produced once with \`riffle produce\`; every run reads the whole topic from its start (static
  partitions, no consumer group) into a fresh checkpoint directory or prefix, so each does the
  same work. The broker (scripts/kafka.sh) and S3Proxy (scripts/s3.sh, over a local folder) run
  on the same machine.
- Rounds alternate which side goes first. records/s and run s are the run summary's (the
  runtime's run: from opening the checkpoint store, and on S3 taking its lease, to the last
  worker's end; starting the process and reading the pipeline file are not in it); the ratio is S3's over the directory's, per
  round. "met" needs the two sides' outputs equal (the digest of the sorted result lines,
  latency fields left out, the same in every round, with every event once) and a median
  ratio ≥ 0.95.
- The second table is the same with a tenth of the events: a short run, where what an object
  store costs once per run (taking the lease, listing the prefix for a checkpoint to resume
  from, releasing the lease: a few requests) weighs more against the work.
- Checkpoints written and the interval between them come from the checkpoint files' and
  objects' modification times (S3Proxy's folder). A directory's checkpoint is written on the
  worker's thread; an object store's on a thread of its own, one at a time, so while a PUT is in
  flight the epochs that complete are not checkpointed and the next checkpoint covers them:
  fewer checkpoints on S3 is the store's latency showing, not lost work.
- Write latency p50 / p99 is each run's own, from the line worker 0 logs when it ends
  (\`checkpoint writes to …: N, p50 …, p99 …\`: each successful write timed from its start to
  the file renamed or the object's put answered, pruning included), as the median (min–max)
  over rounds.
TEXT
)
bench_doc "$out" "Checkpoints" "scripts/bench-checkpoints.sh $events $rounds" "$description" "$table"
echo "bench-checkpoints: wrote $out"
cat "$table"
