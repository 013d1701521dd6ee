"""The campaign's hosts and clusters.

Hosts are network namespaces of scripts/netns.sh: three slots hold the clusters' processes
(process i of every cluster runs on slot i's host) and a fourth namespace is the spare that a
lost host's processes move to. Each host has a "disk" (a folder the processes run in, lost with
the host) and a clock of its own (libfaketime, stepped by the nemesis).

A cluster is one pipeline (Kafka source → `select` → its sink) run either as three processes,
one per host, each kept running by a supervisor loop of this script (what systemd or Kubernetes
does for a real host), or as `riffle run --processes 3` on one host: Riffle's own supervisor,
itself kept running by such a loop.
"""
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

SLOTS = 3
PEER_TIMEOUT_MS = 3000
CHECKPOINT_MS = 500
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


class Hosts:
    """Which namespace each slot's host is, each host's disk and clock."""

    def __init__(self, work, clocks):
        self.work = Path(work)
        self.slots = list(range(SLOTS))
        self.spare = SLOTS
        self.clocks = clocks
        self.lock = threading.Lock()
        for ns in range(SLOTS + 1):
            self.clock_file(ns).write_text("+0\n")

    def ns(self, slot):
        with self.lock:
            return self.slots[slot]

    def address(self, slot):
        return f"10.77.0.1{self.ns(slot)}"

    def disk(self, ns):
        return self.work / "disks" / f"rf-h{ns}"

    def clock_file(self, ns):
        return self.work / f"clock-rf-h{ns}"

    def env(self, ns):
        """The environment of a process on host `ns`: its clock, when clocks are stepped. The
        monotonic clock is left alone, as a real clock step leaves it."""
        if not self.clocks:
            return {}
        return {"LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": str(self.clock_file(ns)),
                "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_CACHE_DURATION": "1"}

    def move(self, slot):
        """Slot `slot`'s host is replaced by the spare; the old one becomes the spare."""
        with self.lock:
            old = self.slots[slot]
            self.slots[slot], self.spare = self.spare, old
            return old, self.slots[slot]


class Member(threading.Thread):
    """One riffle process (or local supervisor) of a cluster on a slot's host, started again
    whenever it exits, until the end. While `held` is set (its host is being replaced) it waits."""

    def __init__(self, riffle, cluster, slot, args, hosts, logfile):
        super().__init__(daemon=True)
        self.riffle, self.cluster, self.slot, self.args = riffle, cluster, slot, args
        self.hosts, self.logfile = hosts, logfile
        self.proc = None
        self.starts = 0
        self.codes = []
        self.stopping = threading.Event()
        self.held = threading.Event()

    def run(self):
        with open(self.logfile, "ab") as out:
            while not self.stopping.is_set():
                while self.held.is_set() and not self.stopping.is_set():
                    time.sleep(0.05)
                if self.stopping.is_set():
                    break
                ns = self.hosts.ns(self.slot)
                cwd = self.hosts.disk(ns) / self.cluster.name
                cwd.mkdir(parents=True, exist_ok=True)
                cmd = ["ip", "netns", "exec", f"rf-h{ns}", str(self.riffle), "run", "-q",
                       str(self.cluster.pipeline), *self.args]
                env = dict(os.environ, RUST_LOG="warn,riffle_dataflow=info", RUST_BACKTRACE="0",
                           **self.hosts.env(ns))
                out.write(f"--- start {self.starts} on rf-h{ns} at {time.time():.3f}\n".encode())
                out.flush()
                self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out, env=env,
                                             cwd=cwd)
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


def children(pid):
    """The pids `pid` started (its threads' children)."""
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    except OSError:
        pass
    return found


def proc_state(pid):
    """The kernel's one-letter state of `pid` (None: gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # gone (ProcessLookupError while it is being reaped)
        return None


def alive(pid):
    """Running (a zombie that its parent has not reaped yet is dead)."""
    return proc_state(pid) not in (None, "Z", "X")


class Cluster:
    """A pipeline run as SLOTS processes, one per host (`--hostfile`, `--process i`)."""

    local = False

    def __init__(self, name, output, riffle, brokers, topic, work, port, hosts, checkpoint):
        self.name, self.output, self.port, self.hosts = name, output, port, hosts
        self.checkpoint = checkpoint
        self.dir = Path(work) / name
        self.dir.mkdir(parents=True)
        self.hostfile = self.dir / "hosts.txt"
        self.write_hostfile()
        self.pipeline = self.dir / "pipeline.yaml"
        # A cluster whose checkpoints are on the object store shares no disk between its hosts:
        # its dead letters go to the host's own disk (the folder it runs in).
        dead = ("dead-letters.jsonl" if "url:" in checkpoint
                else str(self.dir / "dead-letters.jsonl"))
        self.pipeline.write_text(
            f"name: campaign-{name}\n"
            f'source: {{ kafka: {{ brokers: "{brokers}", topic: {topic}, format: json, '
            f"batch_size: 16 }} }}\n"
            "stages:\n  - select: { columns: [id, value] }\n"
            f"sink: {output.sink_yaml(name)}\n"
            f'dead_letter: {{ jsonl: {{ path: "{dead}" }} }}\n'
            f"runtime: {{ workers: 1, epoch_records: 16, peer_timeout_ms: {PEER_TIMEOUT_MS}, "
            f"checkpoint: {{ {checkpoint}, interval_ms: {CHECKPOINT_MS} }} }}\n")
        self.members = self.make_members(riffle)

    def make_members(self, riffle):
        return [Member(riffle, self, i, ["--hostfile", str(self.hostfile), "--process", str(i)],
                       self.hosts, self.dir / f"process{i}.log") for i in range(SLOTS)]

    def write_hostfile(self):
        text = "".join(f"{self.hosts.address(i)}:{self.port}\n" for i in range(SLOTS))
        tmp = self.hostfile.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.rename(self.hostfile)

    def start(self):
        self.output.start()
        for m in self.members:
            m.start()

    def on_slot(self, slot):
        return [m for m in self.members if m.slot == slot]

    def processes(self):
        """(member, label, pid) of each running riffle process."""
        return [(m, f"process {m.slot}", m.pid()) for m in self.members if m.pid()]

    def restarted(self, member, starts, pid, timeout=15):
        """Whether a process killed at `starts` starts of its member came back."""
        deadline = time.monotonic() + timeout
        while member.starts == starts and time.monotonic() < deadline:
            time.sleep(0.1)
        return member.starts > starts

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
        hung = [m.slot for m in self.members if m.is_alive()]
        for m in self.members:
            pid = m.pid()
            if pid:
                os.kill(pid, signal.SIGKILL)
        return not hung


class LocalCluster(Cluster):
    """A pipeline run as `riffle run --processes SLOTS` on slot 0's host: Riffle's supervisor,
    which restarts its processes itself, kept running by a member loop."""

    local = True

    def write_hostfile(self):
        pass

    def make_members(self, riffle):
        return [Member(riffle, self, 0, ["--processes", str(SLOTS)], self.hosts,
                       self.dir / "supervisor.log")]

    def supervisor(self):
        return self.members[0]

    def processes(self):
        m = self.supervisor()
        pid = m.pid()
        if not pid:
            return []
        return [(m, f"process {k} (under riffle's supervisor)", c)
                for k, c in enumerate(sorted(children(pid)))]

    def restarted(self, member, starts, pid, timeout=15):
        """Riffle's supervisor started the cluster again: a full set of new processes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sup = member.pid()
            now = [c for c in children(sup)] if sup else []
            if pid not in now and len(now) == SLOTS and all(alive(c) for c in now):
                return True
            time.sleep(0.1)
        return False
