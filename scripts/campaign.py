#!/usr/bin/env python3
"""A fault campaign (issue 50): a long run of multi-process clusters in network namespaces, with
input flowing the whole time, a nemesis injecting faults at seeded random moments, and an
independent checker reading every sink. scripts/campaign.sh sets up the namespaces, the broker
and the binary and runs this; run it through that script.

Each cluster is one pipeline (Kafka source → `select` → its sink: a Kafka topic written in
transactions, a JSON-lines file, a PostgreSQL table, Redis keys) run as three processes, one
per "host" (namespaces rf-h0..rf-h2 of scripts/netns.sh), each kept running by a supervisor loop
of this script (what systemd or Kubernetes does for a real host). The clusters share the hosts,
so a partition or a paused host hits all of them. A producer writes records `{id, value}` to the
input topic for the whole run; at the end it stops, the checker waits for every sink to hold
every input record, the clusters get SIGTERM, and the checker compares each sink with the input
topic read back with `read_committed`: lost (in the input, not in the sink), duplicated (more
than once), retracted (seen by a reader while running, gone later).

Faults (the nemesis draws a kind and a moment from the seed; each is proven to have landed):
- `kill`: kill -9 of one process of one cluster (landed: it was running and died of SIGKILL;
  its supervisor starts it again);
- `pause`: SIGSTOP of one process past the peer timeout, then SIGCONT (landed: the kernel showed
  it stopped);
- `partition`: a host's link cut (from the other hosts and from the broker), healed after a
  while (landed: the link was seen down);
- `broker`: the broker killed (-9) and started again on the same data (landed: a new pid);
- `database`: PostgreSQL shut down at once (a crash) and started again on its data (landed: a
  new postmaster pid).

Readers: kafka-python with `read_committed`; the file as a `tail -f` reader sees it; psql
(rows per id: a duplicate is a second row); redis-cli's SCAN (keys are idempotent, so only
loss and keys that disappear can show).

Output stall: for each sink a fault hits (a killed or paused process's cluster; every cluster
for a partition or the broker; PostgreSQL's for the database), the time from the fault's start
until the sink shows output it had not shown when the fault was over. The table goes to stdout
(markdown) and the record of every fault to OUT/faults.jsonl.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOSTS = 3
PEER_TIMEOUT_MS = 3000
CHECKPOINT_MS = 500


def log(msg):
    print(f"campaign {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Input: a producer writing ids for the whole run


class Producer(threading.Thread):
    """Writes `{id, value}` records, keyed by id, at `rate` a second until stopped."""

    def __init__(self, brokers, topic, rate):
        super().__init__(daemon=True)
        from kafka import KafkaProducer

        self.producer = KafkaProducer(bootstrap_servers=brokers, acks="all", linger_ms=5,
                                      retries=2147483647, max_in_flight_requests_per_connection=1)
        self.topic, self.rate = topic, rate
        self.sent = 0
        self.errors = 0
        self.stop = threading.Event()

    def run(self):
        start = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while self.sent < due and not self.stop.is_set():
                i = self.sent
                value = json.dumps({"id": i, "value": i % 97 + 0.5}).encode()
                try:
                    self.producer.send(self.topic, key=str(i).encode(), value=value)
                    self.sent += 1
                except Exception as e:  # the broker is down: try again after a while
                    self.errors += 1
                    log(f"producer: {e}")
                    time.sleep(0.5)
            time.sleep(0.02)
        self.producer.flush(timeout=120)
        self.producer.close(timeout=30)


def read_ids(brokers, topic, timeout=30.0):
    """Every id of `topic` as a read_committed consumer reads it, with its count."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=brokers, isolation_level="read_committed",
                             enable_auto_commit=False, consumer_timeout_ms=2000)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    ends = consumer.end_offsets(parts)
    counts = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            for m in batch:
                i = json.loads(m.value)["id"]
                counts[i] = counts.get(i, 0) + 1
        if all(consumer.position(p) >= ends[p] for p in parts):
            break
    consumer.close()
    return counts


# ---------------------------------------------------------------------------------------------
# Sinks, each with an independent reader


class Reader:
    """What every sink's reader shares: a thread following the sink while the run goes on, the
    times its count changed (for the stalls) and what it saw taken back."""

    def __init__(self):
        self.changes = []  # (when, count) at each change of the reader's count
        self.retractions = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)

    def start(self):
        self.thread.start()

    def retracted(self):
        with self.lock:
            return self.retractions

    def _noted(self, old, new):
        """Under the lock: the count went from `old` to `new`."""
        if new != old:
            self.changes.append((time.monotonic(), new))

    def _poll(self, read, take, every=0.5):
        """Calls `take(read())` every `every` seconds until stopped (a `None`: not readable now)."""
        while not self.stop.is_set():
            value = read()
            if value is not None:
                with self.lock:
                    take(value)
            time.sleep(every)


class KafkaOutput(Reader):
    """A results topic, read continuously by a read_committed consumer (kafka-python)."""

    kind = "kafka"

    def __init__(self, brokers, topic):
        super().__init__()
        self.brokers, self.topic = brokers, topic
        self.counts = {}

    def sink_yaml(self, name):
        return (f'{{ kafka: {{ brokers: "{self.brokers}", topic: {self.topic}, partitions: 2, '
                f'key: id, exactly_once: transactions, transactional_id: riffle-{name} }} }}')

    def _follow(self):
        from kafka import KafkaConsumer

        while not self.stop.is_set():
            try:
                consumer = KafkaConsumer(self.topic, bootstrap_servers=self.brokers,
                                         isolation_level="read_committed", group_id=None,
                                         auto_offset_reset="earliest", enable_auto_commit=False)
                counts = {}
                while not self.stop.is_set():
                    for batch in consumer.poll(timeout_ms=300).values():
                        for m in batch:
                            i = json.loads(m.value)["id"]
                            counts[i] = counts.get(i, 0) + 1
                    with self.lock:
                        self._noted(len(self.counts), len(counts))
                        self.counts = dict(counts)
                consumer.close()
            except Exception as e:  # the broker restarting: read again from the start
                log(f"kafka reader: {e}")
                time.sleep(1)

    def seen(self):
        with self.lock:
            return dict(self.counts)

    def size(self):
        with self.lock:
            return len(self.counts)

    # read_committed shows only committed transactions: nothing can be taken back.

    def final(self):
        self.stop.set()
        return read_ids(self.brokers, self.topic, timeout=60)


class JsonlOutput(Reader):
    """A JSON-lines file on the hosts' shared disk, read as a tail -f reader would."""

    kind = "jsonl"

    def __init__(self, path):
        super().__init__()
        self.path = Path(path)
        self.lines = []  # every complete line a reader has seen, in order

    def sink_yaml(self, name):
        return f'{{ jsonl: {{ path: "{self.path}" }} }}'

    def _read(self):
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return text.split("\n")[:-1]  # the last piece is an unfinished line (or empty)

    def _follow(self):
        while not self.stop.is_set():
            now = self._read()
            with self.lock:
                # A line a reader saw that is no longer there (or no longer the same) was
                # visible output later taken back.
                common = min(len(now), len(self.lines))
                changed = next((k for k in range(common) if now[k] != self.lines[k]), None)
                if changed is not None or len(now) < len(self.lines):
                    gone = len(self.lines) - (changed if changed is not None else len(now))
                    self.retractions += gone
                    log(f"jsonl reader: {gone} lines seen earlier are gone from {self.path.name}")
                self._noted(len(self.lines), len(now))
                self.lines = now
            time.sleep(0.2)

    def seen(self):
        with self.lock:
            lines = list(self.lines)
        counts = {}
        for line in lines:
            i = json.loads(line)["id"]
            counts[i] = counts.get(i, 0) + 1
        return counts

    def size(self):
        with self.lock:
            return len(self.lines)

    def final(self):
        self.stop.set()
        self.thread.join(timeout=5)
        counts = {}
        for line in self._read():
            i = json.loads(line)["id"]
            counts[i] = counts.get(i, 0) + 1
        return counts


class PostgresOutput(Reader):
    """A PostgreSQL table (plain inserts, no key: a row written twice shows twice), read with
    psql."""

    kind = "postgres"

    def __init__(self, url, table):
        super().__init__()
        self.url, self.table = url, table
        self.counts, self.rows, self.peak = {}, 0, 0

    def sink_yaml(self, name):
        return f'{{ postgres: {{ url: "{self.url}", table: {self.table} }} }}'

    def _query(self):
        """Each id's rows, or None while the server or the table is not there."""
        out = subprocess.run(["psql", "-X", "-At", self.url, "-c",
                              f"SELECT id, count(*) FROM {self.table} GROUP BY id"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        counts = {}
        for line in out.stdout.split():
            i, n = line.split("|")
            counts[int(i)] = int(n)
        return counts

    def _follow(self):
        self._poll(self._query, self._take)

    def _take(self, counts):
        rows = sum(counts.values())
        if rows < self.peak:
            self.retractions += self.peak - rows
            log(f"postgres reader: {self.peak - rows} rows seen earlier are gone")
        self._noted(self.rows, rows)
        self.counts, self.rows, self.peak = counts, rows, max(self.peak, rows)

    def seen(self):
        with self.lock:
            return dict(self.counts)

    def size(self):
        with self.lock:
            return self.rows

    def final(self):
        self.stop.set()
        self.thread.join(timeout=10)
        return self._query() or {}


class RedisOutput(Reader):
    """Keys `campaign:<id>` in Redis, read with redis-cli. Writes are idempotent (a key written
    twice is one key), so the reader checks that nothing is lost and no key disappears."""

    kind = "redis"

    def __init__(self, host, port, password):
        super().__init__()
        self.cli = ["redis-cli", "-h", host, "-p", str(port), "--no-auth-warning", "-a", password]
        self.url = f"redis://:{password}@{host}:{port}/0"
        self.keys = set()

    def sink_yaml(self, name):
        return f'{{ redis: {{ url: "{self.url}", key: "campaign:{{id}}", value: json }} }}'

    def _scan(self):
        out = subprocess.run(self.cli + ["--scan", "--pattern", "campaign:*"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        return {int(k.split(":", 1)[1]) for k in out.stdout.split()}

    def _follow(self):
        self._poll(self._scan, self._take)

    def _take(self, keys):
        gone = len(self.keys - keys)
        if gone:
            self.retractions += gone
            log(f"redis reader: {gone} keys seen earlier are gone")
        self._noted(len(self.keys), len(keys))
        self.keys = keys

    def seen(self):
        with self.lock:
            return {k: 1 for k in self.keys}

    def size(self):
        with self.lock:
            return len(self.keys)

    def final(self):
        self.stop.set()
        self.thread.join(timeout=10)
        return {k: 1 for k in (self._scan() or set())}


# ---------------------------------------------------------------------------------------------
# Clusters and their supervisors


class Member(threading.Thread):
    """One process of a cluster on its host, started again whenever it exits, until the end."""

    def __init__(self, riffle, cluster, host, pipeline, hostfile, logfile):
        super().__init__(daemon=True)
        self.riffle, self.cluster, self.host = riffle, cluster, host
        self.pipeline, self.hostfile, self.logfile = pipeline, hostfile, logfile
        self.proc = None
        self.starts = 0
        self.codes = []
        self.stopping = threading.Event()

    def run(self):
        with open(self.logfile, "ab") as out:
            while not self.stopping.is_set():
                cmd = ["ip", "netns", "exec", f"rf-h{self.host}", str(self.riffle), "run", "-q",
                       str(self.pipeline), "--hostfile", str(self.hostfile),
                       "--process", str(self.host)]
                env = dict(os.environ, RUST_LOG="warn,riffle_dataflow=info", RUST_BACKTRACE="0")
                out.write(f"--- start {self.starts} at {time.time():.3f}\n".encode())
                out.flush()
                self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out, env=env,
                                             cwd=self.pipeline.parent)
                self.starts += 1
                code = self.proc.wait()
                self.codes.append(code)
                out.write(f"--- exit {code} at {time.time():.3f}\n".encode())
                out.flush()
                if self.stopping.is_set():
                    break
                time.sleep(0.3)

    def pid(self):
        p = self.proc
        return p.pid if p is not None and p.poll() is None else None


class Cluster:
    def __init__(self, name, output, riffle, brokers, topic, work, port):
        self.name, self.output = name, output
        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.hostfile = self.dir / "hosts.txt"
        self.hostfile.write_text("".join(f"10.77.0.1{h}:{port}\n" for h in range(HOSTS)))
        self.pipeline = self.dir / "pipeline.yaml"
        self.pipeline.write_text(
            f"name: campaign-{name}\n"
            f'source: {{ kafka: {{ brokers: "{brokers}", topic: {topic}, format: json, '
            f"batch_size: 16 }} }}\n"
            "stages:\n  - select: { columns: [id, value] }\n"
            f"sink: {output.sink_yaml(name)}\n"
            f'dead_letter: {{ jsonl: {{ path: "{self.dir / "dead-letters.jsonl"}" }} }}\n'
            f"runtime: {{ workers: 1, epoch_records: 16, peer_timeout_ms: {PEER_TIMEOUT_MS}, "
            f'checkpoint: {{ dir: "{self.dir / "ckpt"}", interval_ms: {CHECKPOINT_MS} }} }}\n')
        self.members = [Member(riffle, name, h, self.pipeline, self.hostfile,
                               self.dir / f"host{h}.log") for h in range(HOSTS)]

    def start(self):
        self.output.start()
        for m in self.members:
            m.start()

    def stop(self, timeout):
        """SIGTERM to every process (each finishes its open epochs); True when all exited."""
        for m in self.members:
            m.stopping.set()
            pid = m.pid()
            if pid:
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for m in self.members:
            m.join(max(0.1, deadline - time.monotonic()))
        hung = [m.host for m in self.members if m.is_alive()]
        for m in self.members:
            pid = m.pid()
            if pid:
                os.kill(pid, signal.SIGKILL)
        return not hung


# ---------------------------------------------------------------------------------------------
# The nemesis


def netns(*args):
    subprocess.run([str(ROOT / "scripts/netns.sh"), *map(str, args)], check=True,
                   stdout=subprocess.DEVNULL)


def link_down(host):
    out = subprocess.run(["ip", "-o", "link", "show", f"rfv{host}"], capture_output=True,
                         text=True).stdout
    return "state DOWN" in out or "NO-CARRIER" in out or ",UP" not in out


def proc_state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None


def broker_pid():
    out = subprocess.run([str(ROOT / "scripts/kafka.sh"), "pid"], capture_output=True, text=True)
    return out.stdout.strip() or None


class Nemesis:
    def __init__(self, rng, clusters, kinds):
        self.rng, self.clusters, self.kinds = rng, clusters, kinds

    def inject(self, kind):
        """Does one fault; returns (landed, detail, the clusters it hits)."""
        return getattr(self, kind)()

    def everyone(self):
        return [c.name for c in self.clusters]

    def _member(self):
        for _ in range(20):
            c = self.rng.choice(self.clusters)
            m = self.rng.choice(c.members)
            if m.pid():
                return c, m
            time.sleep(0.2)
        return None, None

    def kill(self):
        c, m = self._member()
        if m is None:
            return False, "no process running", []
        proc, starts = m.proc, m.starts
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False, "the process had exited", []
        code = proc.wait(timeout=10)
        landed = code == -signal.SIGKILL
        # Its supervisor starts it again; proven when a new start is seen.
        deadline = time.monotonic() + 10
        while m.starts == starts and time.monotonic() < deadline:
            time.sleep(0.1)
        return landed and m.starts > starts, f"{c.name} host {m.host} exit {code}", [c.name]

    def pause(self):
        c, m = self._member()
        if m is None:
            return False, "no process running", []
        pid = m.proc.pid
        hold = (PEER_TIMEOUT_MS / 1000) + self.rng.uniform(1, 4)
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False, "the process had exited", []
        time.sleep(0.3)
        landed = proc_state(pid) == "T"
        time.sleep(hold)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        return landed, f"{c.name} host {m.host} stopped {hold:.1f} s", [c.name]

    def partition(self):
        host = self.rng.randrange(HOSTS)
        hold = self.rng.uniform(2, 8)
        netns("cut", host)
        time.sleep(0.3)
        landed = link_down(host)
        time.sleep(hold)
        netns("heal", host)
        return landed, f"host {host} cut off for {hold:.1f} s (from its peers and the broker)", \
            self.everyone()

    def database(self):
        """PostgreSQL crashes (an immediate shutdown) and starts again on its data."""
        script = str(ROOT / "scripts/postgres.sh")
        before = subprocess.run([script, "pid"], capture_output=True, text=True).stdout.strip()
        subprocess.run([script, "restart"], check=True, stdout=subprocess.DEVNULL)
        after = subprocess.run([script, "pid"], capture_output=True, text=True).stdout.strip()
        return bool(before) and bool(after) and before != after, f"pid {before} → {after}", \
            ["postgres"]

    def broker(self):
        before = broker_pid()
        subprocess.run([str(ROOT / "scripts/kafka.sh"), "restart"], check=True,
                       stdout=subprocess.DEVNULL)
        after = broker_pid()
        return before is not None and after is not None and before != after, \
            f"pid {before} → {after}", self.everyone()


# ---------------------------------------------------------------------------------------------


def first_growth(output, since, before):
    """When `output` first showed more than `before` records after `since` (None: not yet)."""
    with output.lock:
        changes = list(output.changes)
    return next((t for t, n in changes if t > since and n > before), None)


def missing(expected, counts):
    return sum(1 for i in expected if i not in counts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--riffle", required=True)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--gap", type=float, nargs=2, default=(4.0, 10.0),
                    help="seconds between faults, drawn uniformly")
    ap.add_argument("--rate", type=int, default=40, help="input records a second")
    ap.add_argument("--kinds", default="kill,pause,partition,broker,database")
    ap.add_argument("--sinks", default="kafka,jsonl,postgres,redis")
    ap.add_argument("--catch-up", type=float, default=180.0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    riffle = Path(args.riffle).resolve()
    topic = "campaign-in"
    subprocess.run([str(ROOT / "scripts/kafka.sh"), "topic", topic, "4"], check=True,
                   stdout=subprocess.DEVNULL)

    makers = {
        "kafka": lambda: KafkaOutput(args.brokers, "campaign-out"),
        "jsonl": lambda: JsonlOutput(work / "jsonl" / "out.jsonl"),
        "postgres": lambda: PostgresOutput(os.environ["RIFFLE_PG_URL"], "campaign_rows"),
        "redis": lambda: RedisOutput(os.environ["RIFFLE_REDIS_HOST"],
                                     os.environ["RIFFLE_REDIS_PORT"],
                                     os.environ["RIFFLE_REDIS_PASSWORD"]),
    }
    makers_used = args.sinks.split(",")
    outputs = [(name, makers[name]()) for name in makers_used]
    clusters = [Cluster(name, out, riffle, args.brokers, topic, work, 7800 + 10 * k)
                for k, (name, out) in enumerate(outputs)]
    producer = Producer(args.brokers, topic, args.rate)
    producer.start()
    for c in clusters:
        c.start()
    log(f"seed {args.seed}: {len(clusters)} clusters × {HOSTS} processes, input "
        f"{args.rate}/s, {args.faults} faults")
    # Let every cluster form and write its first output before the first fault.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(c.output.seen() for c in clusters):
        time.sleep(0.5)

    # A database crash needs the database's sink in the campaign.
    kinds = [k for k in args.kinds.split(",") if k != "database" or "postgres" in makers_used]
    nemesis = Nemesis(rng, clusters, kinds)
    records = []
    faults_file = open(work / "faults.jsonl", "w")
    for n in range(args.faults):
        time.sleep(rng.uniform(*args.gap))
        kind = rng.choice(nemesis.kinds)
        at = time.monotonic()
        landed, detail, hit = nemesis.inject(kind)
        # The stall of each sink the fault hits: from the fault's start until the sink shows
        # output it had not shown when the fault was over (a pause or a cut counts whole; the
        # readers note when their counts change, so the wait for a reader's next poll is not
        # counted).
        done = time.monotonic()
        after = {c.name: c.output.size() for c in clusters}
        record = {"n": n, "kind": kind, "landed": landed, "detail": detail,
                  "at": round(at, 3), "hit": hit}
        hit_clusters = [c for c in clusters if c.name in hit]
        limit = time.monotonic() + 60
        while time.monotonic() < limit and not all(
                first_growth(c.output, done, after[c.name]) for c in hit_clusters):
            time.sleep(0.1)
        record["stall"] = {}
        for c in hit_clusters:
            grew = first_growth(c.output, done, after[c.name])
            record["stall"][c.name] = round(grew - at, 2) if grew else None
        log(f"fault {n}: {kind} {'landed' if landed else 'DID NOT LAND'}: {detail}; "
            f"stall {record['stall']}")
        records.append(record)
        faults_file.write(json.dumps(record) + "\n")
        faults_file.flush()

    producer.stop.set()
    producer.join(timeout=180)
    sent = producer.sent
    log(f"input stopped after {sent} records; waiting for the sinks to catch up")
    expected = read_ids(args.brokers, topic, timeout=120)
    deadline = time.monotonic() + args.catch_up
    caught_up = {}
    while time.monotonic() < deadline:
        caught_up = {c.name: missing(expected, c.output.seen()) == 0 for c in clusters}
        if all(caught_up.values()):
            break
        time.sleep(1)
    exited = {c.name: c.stop(timeout=60) for c in clusters}
    results = {}
    for c in clusters:
        final = c.output.final()
        lost = missing(expected, final)
        duplicated = sum(n - 1 for i, n in final.items() if n > 1)
        extra = sum(1 for i in final if i not in expected)
        results[c.name] = dict(kind=c.output.kind, expected=len(expected), got=sum(final.values()),
                               lost=lost, duplicated=duplicated, unexpected=extra,
                               retracted=c.output.retracted(), caught_up=caught_up.get(c.name),
                               exited=exited[c.name],
                               restarts=sum(m.starts - 1 for m in c.members))
    summary = {"seed": args.seed, "rate": args.rate, "input": len(expected), "sent": sent,
               "faults": records, "sinks": results}
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    problems = [f"fault {f['n']} ({f['kind']}) did not land" for f in records if not f["landed"]]
    for name, r in results.items():
        problems += [f"{name}: {r[k]} {k}" for k in ("lost", "duplicated", "unexpected",
                                                      "retracted") if r[k]]
        if not r["caught_up"]:
            problems.append(f"{name}: did not catch up with the input")
        if not r["exited"]:
            problems.append(f"{name}: a process did not stop on SIGTERM (hang)")
    print(table(summary))
    print()
    print("Result: clean." if not problems else "Result: FAILED: " + "; ".join(problems) + ".")
    sys.exit(0 if not problems else 1)


def spread(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "–"
    p99 = values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]
    return f"{statistics.median(values):.1f} / {p99:.1f} s"


def table(summary):
    lines = [f"Seed {summary['seed']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{os.cpu_count()} CPU cores: {len(summary['faults'])} faults, "
             f"{summary['input']} input records at {summary['rate']}/s.", "",
             "| fault | injected | landed | output stall p50 / p99 (sinks it hits) | no new output within 60 s |",
             "|---|---:|---:|---:|---:|"]
    kinds = sorted({f["kind"] for f in summary["faults"]})
    for k in kinds:
        fs = [f for f in summary["faults"] if f["kind"] == k]
        stalls = [s for f in fs for s in f["stall"].values()]
        lines.append(f"| {k} | {len(fs)} | {sum(f['landed'] for f in fs)} | {spread(stalls)} | "
                     f"{sum(1 for s in stalls if s is None)} |")
    lines += ["", "| sink | input | delivered | lost | duplicated | retracted | caught up | "
              "clean stop | restarts |", "|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for name, r in summary["sinks"].items():
        lines.append(f"| {r['kind']} | {r['expected']} | {r['got']} | {r['lost']} | "
                     f"{r['duplicated']} | {r['retracted']} | {'yes' if r['caught_up'] else 'NO'} "
                     f"| {'yes' if r['exited'] else 'NO (hang)'} | {r['restarts']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
