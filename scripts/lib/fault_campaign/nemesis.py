"""The nemesis: each fault kind is a method that does the fault, proves it landed and says
which clusters it hits. Every random choice comes from the campaign's seeded generator, so a
seed replays the same faults (their moments shift by however long each fault took)."""
import os
import signal
import subprocess
import time
from pathlib import Path

from .cluster import PEER_TIMEOUT_MS, SLOTS, alive, children, proc_state
from .readers import log

ROOT = Path(__file__).resolve().parents[3]
BRIDGE = "10.77.0.1"


def script(name, *args, check=True):
    return subprocess.run([str(ROOT / "scripts" / name), *map(str, args)], check=check,
                          capture_output=True, text=True).stdout.strip()


def in_ns(ns, *cmd, env=None, timeout=10):
    return subprocess.run(["ip", "netns", "exec", f"rf-h{ns}", *cmd], capture_output=True,
                          text=True, env=env, timeout=timeout)


def link_down(ns):
    out = subprocess.run(["ip", "-o", "link", "show", f"rfv{ns}"], capture_output=True,
                         text=True).stdout
    return "state DOWN" in out or "NO-CARRIER" in out or ",UP" not in out


def connect(ns, address, port):
    """Tries a TCP connection from host `ns` for 2 s: True when it opened, False when refused,
    None when nothing answered (the packets were dropped)."""
    try:
        out = in_ns(ns, "timeout", "2", "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}",
                    timeout=5)
    except subprocess.TimeoutExpired:
        return None
    return None if out.returncode == 124 else out.returncode == 0


def reachable(ns, port):
    """Whether host `ns` can open a TCP connection to the bridge's `port`."""
    return connect(ns, BRIDGE, port) is True


def answers(ns, address, port=1):
    """Whether host `ns` hears back from `address` (a refused connection is an answer; a
    dropped packet is not)."""
    return connect(ns, address, port) is not None


class Nemesis:
    def __init__(self, rng, hosts, clusters, services, ckpt_disk, brokers):
        self.rng, self.hosts, self.clusters, self.brokers = rng, hosts, clusters, brokers
        self.services = services  # service name -> port on the bridge
        self.ckpt_disk = Path(ckpt_disk)

    def inject(self, kind):
        """Does one fault; returns (landed, detail, the names of the clusters it hits). After a
        service's restart, `serving` is the seconds until it served again and `ended` when the
        restart was done (else None: the fault ended when it returned)."""
        self.serving = self.ended = None
        return getattr(self, kind)()

    def using(self, service):
        return [c.name for c in self.clusters if service in c.output.uses]

    def on_slot(self, slot):
        return [c.name for c in self.clusters if c.on_slot(slot)]

    def _process(self):
        """A running riffle process of a random cluster: (cluster, member, label, pid)."""
        for _ in range(30):
            c = self.rng.choice(self.clusters)
            running = c.processes()
            if running:
                m, label, pid = self.rng.choice(running)
                return c, m, label, pid
            time.sleep(0.2)
        return None, None, None, None

    def _hold(self):
        return self.rng.uniform(2, 8)

    # -- processes ---------------------------------------------------------------------------

    def kill(self):
        """kill -9 of one process; landed: it was running, it died, and it was started again
        (by the member loop, or for a local cluster by Riffle's supervisor)."""
        c, m, label, pid = self._process()
        if c is None:
            return False, "no process running", []
        starts = m.starts
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False, f"{c.name} {label} had exited", []
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        died = not alive(pid)
        back = c.restarted(m, starts, pid)
        return died and back, f"{c.name} {label} (pid {pid}) died: {died}, restarted: {back}", \
            [c.name]

    def supervisor(self):
        """kill -9 of Riffle's supervisor (`--processes`); landed: it died of SIGKILL, its
        processes died with it within 5 s, and its member loop started it again."""
        local = [c for c in self.clusters if c.local]
        c = self.rng.choice(local)
        m = c.supervisor()
        for _ in range(50):
            if m.pid() and children(m.pid()):
                break
            time.sleep(0.2)
        proc, starts = m.proc, m.starts
        kids = children(proc.pid)
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False, "the supervisor had exited", []
        code = proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while any(alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphans = [k for k in kids if alive(k)]
        deadline = time.monotonic() + 10
        while m.starts == starts and time.monotonic() < deadline:
            time.sleep(0.1)
        landed = code == -signal.SIGKILL and bool(kids) and not orphans and m.starts > starts
        return landed, (f"{c.name} supervisor exit {code}, {len(kids)} processes, "
                        f"{len(orphans)} left after 5 s"), [c.name]

    def pause(self):
        """SIGSTOP of one process past the peer timeout, then SIGCONT; landed: the kernel
        showed it stopped."""
        c, m, label, pid = self._process()
        if c is None:
            return False, "no process running", []
        hold = PEER_TIMEOUT_MS / 1000 + self.rng.uniform(1, 4)
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False, f"{c.name} {label} had exited", []
        time.sleep(0.3)
        landed = proc_state(pid) == "T"
        time.sleep(hold)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        return landed, f"{c.name} {label} stopped {hold:.1f} s", [c.name]

    # -- hosts -------------------------------------------------------------------------------

    def partition(self):
        """A host's link cut (from the other hosts and every service), healed after a while;
        landed: the link was seen down."""
        slot = self.rng.randrange(SLOTS)
        ns, hold = self.hosts.ns(slot), self._hold()
        script("netns.sh", "cut", ns)
        time.sleep(0.3)
        landed = link_down(ns)
        time.sleep(hold)
        script("netns.sh", "heal", ns)
        return landed, f"host {slot} (rf-h{ns}) cut off for {hold:.1f} s", self.on_slot(slot)

    def split(self):
        """A partition between two hosts (each drops the other's packets), both still reaching
        every service, healed after a while; landed: each answered the other before and not
        during."""
        a, b = self.rng.sample(range(SLOTS), 2)
        na, nb, hold = self.hosts.ns(a), self.hosts.ns(b), self._hold()
        ip = {na: f"10.77.0.1{na}", nb: f"10.77.0.1{nb}"}
        before = answers(na, ip[nb]) and answers(nb, ip[na])
        for me, other in ((na, nb), (nb, na)):
            in_ns(me, "iptables", "-A", "OUTPUT", "-d", ip[other], "-j", "DROP")
        during = answers(na, ip[nb]) or answers(nb, ip[na])
        time.sleep(hold)
        for me, other in ((na, nb), (nb, na)):
            in_ns(me, "iptables", "-D", "OUTPUT", "-d", ip[other], "-j", "DROP")
        hit = [n for n in self.on_slot(a) if n in self.on_slot(b)]
        return before and not during, \
            f"hosts {a} and {b} (rf-h{na}, rf-h{nb}) cut from each other for {hold:.1f} s", hit

    def isolate(self):
        """One host cut from one service only (its packets to that port dropped), the rest of
        the network fine; landed: the host could reach the service before and not during."""
        slot = self.rng.randrange(SLOTS)
        service = self.rng.choice(sorted(self.services))
        ns, port, hold = self.hosts.ns(slot), self.services[service], self._hold()
        before = reachable(ns, port)
        rule = ["OUTPUT", "-p", "tcp", "-d", BRIDGE, "--dport", str(port), "-j", "DROP"]
        in_ns(ns, "iptables", "-A", *rule)
        during = reachable(ns, port)
        time.sleep(hold)
        in_ns(ns, "iptables", "-D", *rule)
        hit = [n for n in self.using(service) if n in self.on_slot(slot)]
        return before and not during, \
            f"host {slot} (rf-h{ns}) cut from {service} for {hold:.1f} s", hit

    def host(self):
        """A host lost with its disk: every process on it killed, its link down, its disk
        deleted; its processes come back on the spare host (another address: the clusters'
        hostfiles say so). Landed: processes were running there and none is left, the link
        was down, the disk is gone."""
        slot = self.rng.randrange(SLOTS)
        members = [m for c in self.clusters for m in c.on_slot(slot)]
        for m in members:
            m.held.set()
        old = self.hosts.ns(slot)
        pids = subprocess.run(["ip", "netns", "pids", f"rf-h{old}"], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        script("netns.sh", "cut", old)
        deadline = time.monotonic() + 10
        while any(alive(int(p)) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in pids if alive(int(p))]
        down = link_down(old)
        subprocess.run(["rm", "-rf", str(self.hosts.disk(old))], check=True)
        gone = not self.hosts.disk(old).exists()
        _, new = self.hosts.move(slot)
        for c in self.clusters:
            c.write_hostfile()
        for m in members:
            m.held.clear()
        # The lost host's namespace, repaired, is the next spare.
        script("netns.sh", "heal", old)
        landed = bool(pids) and not left and down and gone
        return landed, (f"host {slot} (rf-h{old}) lost with its disk: {len(pids)} processes "
                        f"killed, back on rf-h{new}"), self.on_slot(slot)

    def clock(self):
        """A host's clock stepped (forward or back, 30 s to 5 min), stepped back after a while
        as NTP would; landed: a process started there saw the stepped time."""
        slot = self.rng.randrange(SLOTS)
        ns = self.hosts.ns(slot)
        step = self.rng.choice([-1, 1]) * self.rng.randint(30, 300)
        hold = self._hold()
        self.hosts.clock_file(ns).write_text(f"{step:+d}s\n")
        time.sleep(1.2)  # the processes read the clock file at most a second old
        env = dict(os.environ, **self.hosts.env(ns))
        seen = in_ns(ns, "date", "+%s", env=env).stdout.strip()
        landed = seen.isdigit() and abs(int(seen) - time.time() - step) < 3
        time.sleep(hold)
        self.hosts.clock_file(ns).write_text("+0\n")
        return landed, f"host {slot} (rf-h{ns}) clock {step:+d} s for {hold:.1f} s", \
            self.on_slot(slot)

    def disk(self):
        """The checkpoint disk (a tmpfs every local-checkpoint cluster writes to) filled up,
        freed after a while; landed: it had no free block left."""
        fill = self.ckpt_disk / "fill"
        hold = self._hold()
        with open(fill, "wb") as f:
            block = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(block)
                    f.flush()
            except OSError:
                pass
        st = os.statvfs(self.ckpt_disk)
        landed = st.f_bavail == 0
        time.sleep(hold)
        fill.unlink()
        hit = [c.name for c in self.clusters if "url:" not in c.checkpoint]
        return landed, f"checkpoint disk full for {hold:.1f} s", hit

    # -- services ----------------------------------------------------------------------------

    def _restart(self, name, service):
        before = script(name, "pid", check=False)
        began = time.monotonic()
        script(name, "restart")
        self.ended = time.monotonic()  # the fault is over; the wait to serve is a stall
        after = script(name, "pid", check=False)
        back = self.serving = round(self._serving(service, began), 2)
        landed = bool(before) and bool(after) and before != after
        return landed, f"pid {before} → {after}, serving again after {back:.1f} s", \
            self.using(service)

    def _serving(self, service, since, limit=120):
        """Seconds from `since` until `service` answers a real request again (how much of a
        stall is the service's own restart)."""
        probe = getattr(self, f"_{service}_serves")
        deadline = time.monotonic() + limit
        last = None
        while time.monotonic() < deadline:
            try:
                if probe():
                    break
            except Exception as e:  # not serving yet; a probe that cannot work says so
                last = e
            time.sleep(0.2)
        else:
            log(f"{service} did not serve within {limit} s; the probe's last error: {last!r}")
        return time.monotonic() - since

    def _kafka_serves(self):
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(bootstrap_servers=self.brokers, request_timeout_ms=3000)
        try:
            parts = [TopicPartition("campaign-in", p)
                     for p in c.partitions_for_topic("campaign-in") or []]
            return bool(parts) and len(c.end_offsets(parts)) == len(parts)
        finally:
            c.close()

    def _s3_serves(self):
        out = subprocess.run([str(ROOT / "scripts/s3.sh"), "status"], capture_output=True)
        if out.returncode != 0:
            return False
        import boto3

        s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                          region_name="us-east-1")
        s3.list_objects_v2(Bucket=os.environ["RIFFLE_S3_BUCKET"], MaxKeys=1)
        return True

    def _postgres_serves(self):
        out = subprocess.run(["psql", "-X", "-At", os.environ["RIFFLE_PG_URL"], "-c",
                              "SELECT 1"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() == "1"

    def broker(self):
        """The broker killed (-9) and started again on its data; landed: a new pid."""
        return self._restart("kafka.sh", "kafka")

    def database(self):
        """PostgreSQL shut down at once (a crash) and started again; landed: a new pid."""
        return self._restart("postgres.sh", "postgres")

    def store(self):
        """The object store killed (-9) and started again on its data; landed: a new pid."""
        return self._restart("s3.sh", "s3")
