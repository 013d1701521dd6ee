"""The campaign's input and its independent readers: a producer writing ids for the whole run,
and one reader per sink kind, each following its sink while the run goes on (the times its count
changed, for the stalls, and what it saw taken back) and reading it whole at the end."""
import json
import subprocess
import threading
import time
from pathlib import Path


def log(msg):
    import sys

    print(f"campaign {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)


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
    uses = ("kafka",)

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
                # Reconnecting at most a second apart: the reader's own backoff after a broker
                # restart must not count as the pipeline's stall.
                consumer = KafkaConsumer(self.topic, bootstrap_servers=self.brokers,
                                         isolation_level="read_committed", group_id=None,
                                         auto_offset_reset="earliest", enable_auto_commit=False,
                                         reconnect_backoff_max_ms=1000)
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
    uses = ("kafka",)

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
    uses = ("kafka", "postgres")

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
    uses = ("kafka", "redis")

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


class ParquetOutput(Reader):
    """Parquet files under an S3 prefix (the object store of scripts/s3.sh), listed with boto3
    and read with DuckDB. Published files are final: a file that disappears, or a row in one,
    was visible output taken back."""

    kind = "parquet on S3"
    uses = ("kafka", "s3")

    def __init__(self, endpoint, bucket, prefix, key_id, secret, scratch):
        super().__init__()
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix, self.endpoint = bucket, prefix, endpoint
        self.s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id,
                               aws_secret_access_key=secret, region_name="us-east-1",
                               config=Config(s3={"addressing_style": "path"}, connect_timeout=2,
                                             read_timeout=5, retries={"max_attempts": 1}))
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.files = {}  # published key -> {id: rows}
        self.rows = 0

    def sink_yaml(self, name):
        return (f'{{ parquet: {{ url: "s3://{self.bucket}/{self.prefix}", '
                f'endpoint: "{self.endpoint}", roll: {{ seconds: 1 }} }} }}')

    def _published(self):
        """The published files' keys (staged ones live under `_staging/`), or None while the
        store cannot be read."""
        keys = set()
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + "/")
            for page in pages:
                for o in page.get("Contents", []):
                    k = o["Key"]
                    if k.endswith(".parquet") and "/_staging/" not in k:
                        keys.add(k)
        except Exception:
            return None
        return keys

    def _ids(self, key):
        import duckdb

        local = self.scratch / "file.parquet"
        self.s3.download_file(self.bucket, key, str(local))
        counts = {}
        for (i,) in duckdb.sql(f"SELECT id FROM read_parquet('{local}')").fetchall():
            counts[i] = counts.get(i, 0) + 1
        return counts

    def _refresh(self):
        keys = self._published()
        if keys is None:
            return
        fresh = {}
        for k in sorted(keys - set(self.files)):
            try:
                fresh[k] = self._ids(k)
            except Exception as e:  # the store went away mid-read: next time
                log(f"parquet reader: {k}: {e}")
                return
        with self.lock:
            gone = set(self.files) - keys
            if gone:
                lost_rows = sum(sum(self.files[k].values()) for k in gone)
                self.retractions += lost_rows
                log(f"parquet reader: {len(gone)} files ({lost_rows} rows) seen earlier are gone")
                for k in gone:
                    del self.files[k]
            self.files.update(fresh)
            rows = sum(sum(c.values()) for c in self.files.values())
            self._noted(self.rows, rows)
            self.rows = rows

    def _follow(self):
        while not self.stop.is_set():
            self._refresh()
            time.sleep(0.5)

    def seen(self):
        with self.lock:
            files = list(self.files.values())
        counts = {}
        for c in files:
            for i, n in c.items():
                counts[i] = counts.get(i, 0) + n
        return counts

    def size(self):
        with self.lock:
            return self.rows

    def final(self):
        self.stop.set()
        self.thread.join(timeout=30)
        self._refresh()
        return self.seen()
