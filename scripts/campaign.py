#!/usr/bin/env python3
"""A fault campaign (issue 50): a long run of multi-process clusters in network namespaces, with
input flowing the whole time, a nemesis injecting faults at seeded random moments, and an
independent checker reading every sink. scripts/campaign.sh sets up the namespaces, the
services and the binary and runs this; run it through that script.

Five clusters, one per sink, share the hosts (scripts/lib/fault_campaign/cluster.py): Kafka
written in transactions, PostgreSQL, Redis and Parquet on S3 as three processes one per host
(the Parquet one with its checkpoints on S3 too, sharing no disk), and JSON lines as `riffle run
--processes 3` under Riffle's own supervisor. A producer writes records `{id, value}` to the
input topic for the whole run; at the end it stops, the checker waits for every sink to hold
every input record, the clusters get SIGTERM, and the checker compares each sink with the input
topic read back with `read_committed`: lost (in the input, not in the sink), duplicated (more
than once), retracted (seen by a reader while running, gone later).

Faults (scripts/lib/fault_campaign/nemesis.py; each proven to have landed): `kill` (-9 of a
process), `supervisor` (-9 of Riffle's supervisor), `pause` (SIGSTOP past the peer timeout),
`partition` (a host's link cut), `split` (two hosts cut from each other), `isolate` (a host cut
from one service: Kafka, S3 or PostgreSQL), `host` (a host lost with its disk, its processes
back on a spare host), `clock` (a host's clock stepped), `disk` (the checkpoint disk full),
`broker`, `store`, `database` (the service killed and started again on its data).

Readers (scripts/lib/fault_campaign/readers.py): kafka-python with `read_committed`; the file as a
`tail -f` reader sees it; psql (rows per id: a duplicate is a second row); redis-cli's SCAN;
boto3 + DuckDB for the Parquet files.

Output stall: for each sink a fault hits, the time from the fault's start until the sink shows
output it had not shown when the fault was over. The table goes to stdout (markdown) and the
record of every fault to WORK/faults.jsonl.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))

from fault_campaign.cluster import FAKETIME, SLOTS, Cluster, Hosts, LocalCluster  # noqa: E402
from fault_campaign.nemesis import Nemesis  # noqa: E402
from fault_campaign.readers import (JsonlOutput, KafkaOutput, ParquetOutput,  # noqa: E402
                                    PostgresOutput, Producer, RedisOutput, log, read_ids)
from fault_campaign.report import table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KINDS = "kill,supervisor,pause,partition,split,isolate,host,clock,disk,broker,store,database"
SINKS = "kafka,jsonl,postgres,redis,parquet"


def first_growth(output, since, before):
    """When `output` first showed more than `before` records after `since` (None: not yet)."""
    with output.lock:
        changes = list(output.changes)
    return next((t for t, n in changes if t > since and n > before), None)


def size_at(output, when):
    """How much `output` showed at `when` (its readers' change log)."""
    with output.lock:
        changes = list(output.changes)
    return next((n for t, n in reversed(changes) if t <= when), 0)


def missing(expected, counts):
    return sum(1 for i in expected if i not in counts)


def missing_tools(ckpt_disk):
    """The fault kinds this machine cannot inject, and why."""
    missing = {}
    if not Path(FAKETIME).exists():
        missing["clock"] = f"no libfaketime ({FAKETIME}: apt-get install faketime)"
    if not os.path.ismount(ckpt_disk):
        missing["disk"] = "no tmpfs could be mounted for the checkpoint disk"
    probe = subprocess.run(["ip", "netns", "exec", "rf-h0", "iptables", "-S", "OUTPUT"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        why = f"iptables does not work in a namespace: {probe.stderr.strip()[:200]}"
        missing["split"] = missing["isolate"] = why
    return missing


def make_clusters(args, work, hosts, topic):
    env = os.environ
    outputs = {
        "kafka": lambda: KafkaOutput(args.brokers, "campaign-out"),
        "jsonl": lambda: JsonlOutput(work / "jsonl" / "out.jsonl"),
        "postgres": lambda: PostgresOutput(env["RIFFLE_PG_URL"], "campaign_rows"),
        "redis": lambda: RedisOutput(env["RIFFLE_REDIS_HOST"], env["RIFFLE_REDIS_PORT"],
                                     env["RIFFLE_REDIS_PASSWORD"]),
        "parquet": lambda: ParquetOutput(env["AWS_ENDPOINT_URL"], env["RIFFLE_S3_BUCKET"],
                                         "campaign-parquet", env["AWS_ACCESS_KEY_ID"],
                                         env["AWS_SECRET_ACCESS_KEY"], work / "parquet-reader"),
    }
    clusters = []
    for k, name in enumerate(args.sinks.split(",")):
        output = outputs[name]()
        if name == "parquet":
            # Nothing on a local disk: checkpoints on the object store, beside the results.
            checkpoint = (f'url: "s3://{env["RIFFLE_S3_BUCKET"]}/campaign-checkpoints", '
                          f"lease_s: 10")
        else:
            checkpoint = f'dir: "{Path(args.ckpt_disk) / name}"'
        kind = LocalCluster if name == "jsonl" else Cluster
        clusters.append(kind(name, output, Path(args.riffle).resolve(), args.brokers, topic,
                             work, 7800 + 10 * k, hosts, checkpoint))
    return clusters


def stalls(clusters, hit, at, done):
    """Each hit sink's stall: from the fault's start `at` until it shows output it had not
    shown when the fault was over (`done`). None: no new output within 60 s."""
    after = {c.name: size_at(c.output, done) for c in clusters}
    hit_clusters = [c for c in clusters if c.name in hit]
    limit = time.monotonic() + 60
    while time.monotonic() < limit and not all(
            first_growth(c.output, done, after[c.name]) for c in hit_clusters):
        time.sleep(0.1)
    out = {}
    for c in hit_clusters:
        grew = first_growth(c.output, done, after[c.name])
        out[c.name] = round(grew - at, 2) if grew else None
    return out


def run_faults(args, rng, nemesis, clusters, work):
    records = []
    with open(work / "faults.jsonl", "w") as faults_file:
        for n in range(args.faults):
            time.sleep(rng.uniform(*args.gap))
            kind = rng.choice(nemesis.kinds)
            at = time.monotonic()
            landed, detail, hit = nemesis.inject(kind)
            record = {"n": n, "kind": kind, "landed": landed, "detail": detail,
                      "at": round(at, 3), "hit": hit, "serving": nemesis.serving,
                      "stall": stalls(clusters, hit, at, nemesis.ended or time.monotonic())}
            log(f"fault {n}: {kind} {'landed' if landed else 'DID NOT LAND'}: {detail}; "
                f"stall {record['stall']}")
            records.append(record)
            faults_file.write(json.dumps(record) + "\n")
            faults_file.flush()
    return records


def restarts(c):
    n = sum(m.starts - 1 for m in c.members)
    if c.local:  # and the cluster restarts Riffle's supervisor did itself
        n += Path(c.members[0].logfile).read_text(errors="replace").count(
            "restarting the cluster")
    return n


def check(clusters, expected, caught_up, exited):
    results = {}
    for c in clusters:
        final = c.output.final()
        results[c.name] = dict(
            kind=c.output.kind + (" (riffle's supervisor)" if c.local else ""),
            expected=len(expected), got=sum(final.values()), lost=missing(expected, final),
            duplicated=sum(n - 1 for n in final.values() if n > 1),
            unexpected=sum(1 for i in final if i not in expected),
            retracted=c.output.retracted(), caught_up=caught_up.get(c.name),
            exited=exited[c.name], restarts=restarts(c))
    return results


def problems_of(records, results):
    problems = [f"fault {f['n']} ({f['kind']}) did not land" for f in records if not f["landed"]]
    for name, r in results.items():
        problems += [f"{name}: {r[k]} {k}" for k in ("lost", "duplicated", "unexpected",
                                                      "retracted") if r[k]]
        if not r["caught_up"]:
            problems.append(f"{name}: did not catch up with the input")
        if not r["exited"]:
            problems.append(f"{name}: a process did not stop on SIGTERM (hang)")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--riffle", required=True)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--ckpt-disk", required=True, help="a small tmpfs for the checkpoints")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--gap", default="4,10", help="seconds between faults: MIN,MAX, drawn "
                    "uniformly")
    ap.add_argument("--rate", type=int, default=40, help="input records a second")
    ap.add_argument("--kinds", default=KINDS)
    ap.add_argument("--sinks", default=SINKS)
    ap.add_argument("--catch-up", type=float, default=180.0)
    args = ap.parse_args()
    args.gap = tuple(float(x) for x in args.gap.split(","))
    rng = random.Random(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    topic = "campaign-in"
    subprocess.run([str(ROOT / "scripts/kafka.sh"), "topic", topic, "4"], check=True,
                   stdout=subprocess.DEVNULL)
    sinks = args.sinks.split(",")
    kinds = args.kinds.split(",")
    needs = {"database": "postgres", "store": "parquet", "supervisor": "jsonl"}
    kinds = [k for k in kinds if needs.get(k, sinks[0]) in sinks]
    left_out = {}
    for kind, why in missing_tools(args.ckpt_disk).items():
        if kind in kinds:
            kinds.remove(kind)
            left_out[kind] = why
            log(f"{kind} faults left out: {why}")
    hosts = Hosts(work, clocks="clock" in kinds)
    clusters = make_clusters(args, work, hosts, topic)
    services = {"kafka": int(os.environ["RIFFLE_KAFKA_PORT"])}
    if "parquet" in sinks:
        services["s3"] = int(os.environ["RIFFLE_S3_PORT"])
    if "postgres" in sinks:
        services["postgres"] = int(os.environ["RIFFLE_PG_PORT"])
    producer = Producer(args.brokers, topic, args.rate)
    producer.start()
    for c in clusters:
        c.start()
    started = time.monotonic()
    log(f"seed {args.seed}: {len(clusters)} clusters × {SLOTS} processes, input "
        f"{args.rate}/s, {args.faults} faults of {','.join(kinds)}")
    # Let every cluster form and write its first output before the first fault.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(c.output.seen() for c in clusters):
        time.sleep(0.5)

    nemesis = Nemesis(rng, hosts, clusters, services, args.ckpt_disk, args.brokers)
    nemesis.kinds = kinds
    records = run_faults(args, rng, nemesis, clusters, work)

    producer.stop.set()
    producer.join(timeout=180)
    log(f"input stopped after {producer.sent} records; waiting for the sinks to catch up")
    expected = read_ids(args.brokers, topic, timeout=120)
    deadline = time.monotonic() + args.catch_up
    caught_up = {}
    while time.monotonic() < deadline:
        caught_up = {c.name: missing(expected, c.output.seen()) == 0 for c in clusters}
        if all(caught_up.values()):
            break
        time.sleep(1)
    exited = {c.name: c.stop(timeout=60) for c in clusters}
    results = check(clusters, expected, caught_up, exited)
    summary = {"seed": args.seed, "rate": args.rate, "input": len(expected), "left_out": left_out,
               "sent": producer.sent, "minutes": (time.monotonic() - started) / 60,
               "faults": records, "sinks": results}
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    problems = problems_of(records, results)
    print(table(summary))
    print()
    print("Result: clean." if not problems else "Result: FAILED: " + "; ".join(problems) + ".")
    sys.exit(0 if not problems else 1)


if __name__ == "__main__":
    main()
