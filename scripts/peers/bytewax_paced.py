"""Peer `bytewax-paced` (bytewax==0.21.1): the detect job fed by cameras replayed live.

The Python/Bytewax side of the paced-camera latency benchmark. Riffle runs the same job: the 250
bundled street frames are split into N cameras, each camera delivers its frames at F fps like a
live camera, and we measure per-frame latency from the moment the source hands a frame in (before
its file is read) to the moment its result reaches the sink.

    cd scripts/peers
    P=$(./setup.sh)         # the peers' venv (its python is the last line setup.sh prints)
    PACED_CAMERAS=2 PACED_FPS=25 $P -m bytewax.run "bytewax_paced:flow()" -w 2      # or -w 1
    # 2 processes x 1 worker (loopback only), then join their parts:
    A="127.0.0.1:21201;127.0.0.1:21202"
    PACED_CAMERAS=2 $P -m bytewax.run "bytewax_paced:flow()" -i 0 -a "$A" &
    PACED_CAMERAS=2 $P -m bytewax.run "bytewax_paced:flow()" -i 1 -a "$A"; wait
    $P bytewax_paced.py merge            # or: merge PART.pkl ...; prints the PEER line

Parameters (environment variables, because `bytewax.run` owns argv):
    PACED_CAMERAS  N cameras (default 2)
    PACED_FPS      F frames per second per camera (default 25)
    PACED_REPEAT   R: each camera plays its frame list R times (default 1)
    PACED_START    optional: the common start instant, Unix time in seconds (e.g. `date +%s` + 3)
    PACED_LEAD     single process only: seconds from the first partition build to the start
                   (default 0.25, so every worker has built its partition)
    PEER_ORT_THREADS, PEER_SCRATCH as for the other peers (bytewax_peer.py, jobs.py)

Job: `detect` from jobs.py, unchanged (read, decode, resize 300x300 RGB u8, SSDLite, person
boxes with score > 0.5), so the check digest is comparable with the other peers: with R=1 and N
every frame is covered (any N) and `check=` must be `person_frames=53,person_boxes=56`.

Cameras, as Riffle splits them (`cameras: N`): the frames in `C.frame_items('detect')` order,
frame f of n belongs to camera f * N // n, every frame kept. Camera c lives on worker c % total_workers: a partitioned `DynamicSource` whose partition on
worker w holds the cameras c with c % total_workers == w.

Pacing: camera c's k-th frame (k counted across the R repeats) is due at start + k / F. All
cameras share one start:
  * PACED_START if set (use it to agree the start across processes exactly);
  * else one process: the time the first partition is built + PACED_LEAD;
  * else several processes: each process takes time.time() at its first partition build,
    rounded up to the next whole second, plus 1 s. Bytewax builds the partitions right after
    the processes have connected, so they agree unless a second boundary falls between the
    builds (then they are 1 s apart: set PACED_START for exactness).
`next_batch` returns every frame that is due (possibly from several cameras of the partition)
and `next_awake` returns the due time of the next frame, so Bytewax parks the worker (timely
`activate_after`) instead of the source sleeping; the worker is free to decode/infer meanwhile.
A frame's input timestamp is taken when it is emitted (`C.now()`), not its due time; the
source's lateness (emit - due) is recorded too (`source_late_*`), and `due_p50/p99_ms` give the
latency counted from the due time (= what a live camera would see, including source lag).

Dataflow (as bytewax_peer.py): input -> `map` decode -> `flat_map_batch` inference on whatever
has arrived, chunked to the job's batch size (1 for detect) -> a collecting sink that records
`now - t_in` per frame. No exchange (each worker processes its own cameras), no stateful step.
Sessions are created and warmed (one inference each) in `flow()`, before the source starts;
each worker thread gets its own session with intra_op_num_threads = 2 // total workers.

Epochs: no recovery is configured, so `bytewax.run` uses its default 10 s epoch interval (set
by `-s/--snapshot-interval`). Nothing here is stateful, so epochs only matter as backpressure:
a source does not call `next_batch` while earlier epochs are still in flight. The output and
flat_map_batch act per arriving batch, not per epoch, so the default is kept.

At exit one line is printed (per process with several processes, the merge step prints it):
    PEER bytewax-paced-w{W} detect items=<n> seconds=<s> items_per_s=<x> p50_ms= p99_ms=
         max_ms= cameras= fps= source_late_p99_ms= ... check=<digest>
`seconds` is first emit -> last sink write. With R > 1 the digest is over the distinct frames
(every repeat of a frame must give the same result; `repeat_mismatch=` counts those that did not).
"""
import atexit
import collections
import glob
import math
import os
import pickle
import sys
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs as C  # noqa: E402

import numpy as np  # noqa: E402
import bytewax.operators as op  # noqa: E402
from bytewax.dataflow import Dataflow  # noqa: E402
from bytewax.inputs import DynamicSource, StatelessSourcePartition  # noqa: E402
from bytewax.outputs import DynamicSink, StatelessSinkPartition  # noqa: E402

JOB = "detect"


_TOPOLOGY = C.BytewaxTopology(sys.argv)
WORKERS = _TOPOLOGY.workers
PROCESSES = _TOPOLOGY.processes
PROCESS_ID = _TOPOLOGY.process_id
TOTAL_WORKERS = _TOPOLOGY.total_workers
ORT_THREADS = _TOPOLOGY.ort_threads
NAME = _TOPOLOGY.name("bytewax-paced")

CAMERAS = int(os.environ.get("PACED_CAMERAS", "2"))
FPS = float(os.environ.get("PACED_FPS", "25"))
REPEAT = int(os.environ.get("PACED_REPEAT", "1"))
LEAD = float(os.environ.get("PACED_LEAD", "0.25"))
SCRATCH = C.SCRATCH
assert CAMERAS >= 1 and FPS > 0 and REPEAT >= 1, (CAMERAS, FPS, REPEAT)

_lock = threading.Lock()
_by_thread = {}  # thread id -> session (threading.local is reset on Bytewax's Rust-made threads)
_sessions = []  # created up front (before the clock), handed out one per worker thread
_start = {}  # "wall": Unix time, "perf": the same instant on C.now()'s clock
_t = {"first_in": None, "last_out": None, "flow_ready": None}
_results = {}  # frame index -> person boxes
_mismatch = [0]  # repeats of a frame whose result differed from the first one
_lat = []  # sink - emit, per frame (s)
_lat_due = []  # sink - due, per frame (s)
_late = []  # emit - due, per frame (s)
_calls = collections.Counter()  # model-call size -> count


def cameras(job=JOB, n_cams=CAMERAS):
    """camera -> its frames [(index, path)], split as Riffle splits them."""
    items = C.frame_items(job)
    cams = collections.defaultdict(list)
    for idx, path in items:
        # Riffle's `cameras: N`: file i of n goes to camera i * N // n (every file kept).
        cams[idx * n_cams // len(items)].append((idx, path))
    return cams


def expected_items():
    return sum(len(v) for v in cameras().values()) * REPEAT


def _common_start():
    """The shared start instant (see the module docstring); fixed by the first caller."""
    with _lock:
        if not _start:
            wall_now, perf_now = time.time(), C.now()
            if os.environ.get("PACED_START"):
                wall = float(os.environ["PACED_START"])
            elif PROCESSES == 1:
                wall = wall_now + LEAD
            else:
                wall = math.ceil(wall_now) + 1.0
            _start["wall"] = wall
            _start["perf"] = perf_now + (wall - wall_now)
        return _start["wall"], _start["perf"]


def _session():
    tid = threading.get_ident()
    s = _by_thread.get(tid)
    if s is None:
        with _lock:
            s = _by_thread[tid] = _sessions.pop()
    return s


class _PacedPart(StatelessSourcePartition):
    """This worker's cameras, each emitting frame k at start + k / FPS."""

    def __init__(self, worker_index, worker_count):
        cams = cameras()
        mine = [c for c in sorted(cams) if c % worker_count == worker_index]
        sched = []  # (due offset s, camera, k, index, path)
        for c in mine:
            frames = cams[c] * REPEAT
            sched.extend((k / FPS, c, k, idx, path) for k, (idx, path) in enumerate(frames))
        sched.sort(key=lambda e: (e[0], e[1], e[2]))
        self.sched = sched
        self.pos = 0
        self.wall0, self.perf0 = _common_start()

    def next_batch(self):
        if self.pos >= len(self.sched):
            raise StopIteration()
        t = C.now()
        lim = t - self.perf0
        out, late = [], []
        while self.pos < len(self.sched) and self.sched[self.pos][0] <= lim:
            off, c, k, idx, path = self.sched[self.pos]
            due = self.perf0 + off
            out.append(((c, k), idx, path, t, due))
            late.append(t - due)
            self.pos += 1
        if out:
            with _lock:
                if _t["first_in"] is None:
                    _t["first_in"] = t
                _late.extend(late)
        return out

    def next_awake(self):
        if self.pos >= len(self.sched):
            return None  # next_batch is called at once and ends the partition
        return datetime.fromtimestamp(self.wall0 + self.sched[self.pos][0], tz=timezone.utc)


class PacedCameras(DynamicSource):
    def build(self, step_id, worker_index, worker_count):
        return _PacedPart(worker_index, worker_count)


class _SinkPart(StatelessSinkPartition):
    def write_batch(self, items):
        t = C.now()
        with _lock:
            for _key, idx, out, t_in, due in items:
                prev = _results.setdefault(idx, out)
                if prev is not out and prev != out:
                    _mismatch[0] += 1
                _lat.append(t - t_in)
                _lat_due.append(t - due)
            _t["last_out"] = t


class CollectSink(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _SinkPart()


def _decode(it):
    key, idx, path, t_in, due = it
    return key, idx, C.prep_detect(C.read_file(path)), t_in, due


def _infer(batch):  # batch: whatever has arrived, [(key, idx, u8[300,300,3], t_in, due)]
    sess = _session()
    bs = C.JOBS[JOB][1]
    out = []
    for s in range(0, len(batch), bs):
        ch = batch[s:s + bs]
        _calls[len(ch)] += 1
        res = C.detect_batch(sess, [x for _, _, x, _, _ in ch])
        out.extend((key, idx, r, t_in, due) for (key, idx, _, t_in, due), r in zip(ch, res))
    return out


def flow():
    for _ in range(WORKERS):  # this process's workers; warmed up before the source starts
        _sessions.append(C.make_session(JOB, ORT_THREADS))
    atexit.register(_report)
    f = Dataflow("peer_paced_detect")
    src = op.input("cameras", f, PacedCameras())
    dec = op.map("decode", src, _decode)
    res = op.flat_map_batch("infer", dec, _infer)
    op.output("sink", res, CollectSink())
    _t["flow_ready"] = C.now()
    return f


def _part():
    return {"name": NAME, "workers": WORKERS, "processes": PROCESSES, "total_workers": TOTAL_WORKERS,
            "ort_threads": ORT_THREADS, "cameras": CAMERAS, "fps": FPS, "repeat": REPEAT,
            "expected": expected_items(), "start_wall": _start.get("wall"),
            "first_in": _t["first_in"], "last_out": _t["last_out"], "results": _results,
            "mismatch": _mismatch[0], "lat": _lat, "lat_due": _lat_due, "late": _late, "calls": _calls}


def _report():
    part = _part()
    if PROCESSES > 1:  # each process holds its workers' cameras: `merge` joins the parts
        os.makedirs(SCRATCH, exist_ok=True)
        path = os.path.join(SCRATCH, f"bytewax_paced_part{PROCESS_ID}.pkl")
        with open(path, "wb") as fh:
            pickle.dump(part, fh)
        print(f"PART {NAME} {JOB} process={PROCESS_ID} items={len(_lat)} -> {path}", flush=True)
        return
    report_parts([part])


def _ms(xs, q):
    return float(np.percentile(np.asarray(xs) * 1000.0, q)) if len(xs) else float("nan")


def report_parts(parts):
    p0 = parts[0]
    name, cams, fps, rep = p0["name"], p0["cameras"], p0["fps"], p0["repeat"]
    results, lat, lat_due, late, calls, mismatch = {}, [], [], [], collections.Counter(), 0
    for p in parts:
        for idx, out in p["results"].items():
            if idx in results and results[idx] != out:
                mismatch += 1
            results.setdefault(idx, out)
        lat += p["lat"]
        lat_due += p["lat_due"]
        late += p["late"]
        calls.update(p["calls"])
        mismatch += p["mismatch"]
    starts = [p["first_in"] for p in parts if p["first_in"] is not None]
    ends = [p["last_out"] for p in parts if p["last_out"] is not None]
    if not lat or not starts or not ends:
        print(f"FAILED {name} {JOB}: no results", flush=True)
        return None
    starts_wall = {p["start_wall"] for p in parts}
    cs = ",".join(f"{k}x{v}" for k, v in sorted(calls.items()))
    extra = (f"max_ms={_ms(lat, 100):.2f} cameras={cams} fps={fps:g} "
             f"source_late_p99_ms={_ms(late, 99):.2f} source_late_max_ms={_ms(late, 100):.2f} "
             f"due_p50_ms={_ms(lat_due, 50):.2f} due_p99_ms={_ms(lat_due, 99):.2f} repeat={rep} "
             f"ort_threads={p0['total_workers']}x{p0['ort_threads']} model_calls(size x count)={cs}")
    if len(starts_wall) > 1:
        extra += f" start_skew_ms={1000 * (max(starts_wall) - min(starts_wall)):.1f}"
    if len(lat) != p0["expected"]:
        extra += f" expected={p0['expected']}"
    if mismatch:
        extra += f" repeat_mismatch={mismatch}"
    extra += f" check={C.check(JOB, results)}"
    return C.report(name, JOB, len(lat), max(ends) - min(starts), lat, extra)


def merge(paths):
    """Joins the parts written by the processes of a multi-process run; prints the PEER line."""
    if not paths:
        paths = sorted(glob.glob(os.path.join(SCRATCH, "bytewax_paced_part*.pkl")))
    if not paths:
        sys.exit(f"merge: no parts in {SCRATCH}")
    parts = []
    for p in paths:
        with open(p, "rb") as fh:
            parts.append(pickle.load(fh))
    if len(parts) != parts[0]["processes"]:
        sys.exit(f"merge: {len(parts)} parts for a {parts[0]['processes']}-process run")
    line = report_parts(parts)
    for p in paths:
        os.remove(p)
    return line


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "merge":
        merge(sys.argv[2:])
    else:
        sys.exit(__doc__)
