"""Peers `bytewax-w1`, `bytewax-w2`, `bytewax-p2w1` (bytewax==0.21.1): the jobs as a Bytewax
dataflow. Run from this directory (bytewax.run imports the module from the working directory):

    python -m bytewax.run "bytewax_peer:flow('classify')" -w 1          # or -w 2; detect; ctr
    # 2 processes x 1 worker over loopback (no GIL shared), then join their parts:
    A="127.0.0.1:21101;127.0.0.1:21102"
    python -m bytewax.run "bytewax_peer:flow('detect')" -i 0 -a "$A" &
    python -m bytewax.run "bytewax_peer:flow('detect')" -i 1 -a "$A"; wait
    python bytewax_peer.py merge detect                                # prints the PEER line

Image jobs: a partitioned source (worker w of n emits the batches b with b % n == w, as
cameras shared out over workers) -> `map` decode -> `flat_map_batch` running the model on up to
the job's batch. ctr: one source partition -> key_on("all") -> `stateful_map` making each
event's candidates (they depend on every earlier event, so this state lives on one worker) ->
`redistribute` (with several workers) -> `flat_map_batch` scoring, 10 events a call.

ONNX Runtime: a session per worker thread with 2 // (all workers) intra-op threads
(PEER_ORT_THREADS overrides), made and warmed in flow(), before the source starts. The PEER
line is printed when the process exits; with several processes each writes its part to
PEER_SCRATCH and `merge` joins them.
"""
import atexit
import collections
import glob
import os
import pickle
import sys
import threading

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs as J  # noqa: E402


_TOPOLOGY = J.BytewaxTopology(sys.argv)
WORKERS = _TOPOLOGY.workers
PROCESSES = _TOPOLOGY.processes
PROCESS_ID = _TOPOLOGY.process_id
TOTAL_WORKERS = _TOPOLOGY.total_workers
ORT_THREADS = _TOPOLOGY.ort_threads
NAME = _TOPOLOGY.name("bytewax")

_sessions = []
_session = J.session_per_thread(_sessions)
_lock = threading.Lock()
_t = {"first_in": None, "last_out": None}
_results, _lat = {}, []
_calls = collections.Counter()  # model-call size -> how many


def _stamp_in():
    t = J.now()
    with _lock:
        if _t["first_in"] is None:
            _t["first_in"] = t
    return t


# ------------------------------------------------------------------------------ sources, sink


class _Frames(StatelessSourcePartition):
    """This worker's share of the job's batches, one batch per next_batch."""

    def __init__(self, job, worker, workers):
        n, bs = J.JOBS[job]
        items = J.frame_items(job)
        self.batches = [items[s:s + bs] for s in range(0, n, bs)][worker::workers]

    def next_batch(self):
        if not self.batches:
            raise StopIteration()
        t = _stamp_in()
        return [(idx, path, t) for idx, path in self.batches.pop(0)]


class FrameSource(DynamicSource):
    def __init__(self, job):
        self.job = job

    def build(self, step_id, worker_index, worker_count):
        return _Frames(self.job, worker_index, worker_count)


class _Events(StatelessSourcePartition):
    """Worker 0 reads the ratings (on the clock, as every peer) and emits them in order, one
    model call's worth (10 events) per next_batch; the other workers emit nothing."""

    def __init__(self, worker):
        self.active = worker == 0
        self.events = None

    def next_batch(self):
        if not self.active:
            raise StopIteration()
        if self.events is None:
            _stamp_in()
            users, items = J.load_events()
            self.events = collections.deque(zip(range(len(users)), users.tolist(), items.tolist()))
        if not self.events:
            raise StopIteration()
        t = J.now()
        n = min(J.JOBS["ctr"][1], len(self.events))
        return [self.events.popleft() + (t,) for _ in range(n)]


class EventSource(DynamicSource):
    def build(self, step_id, worker_index, worker_count):
        return _Events(worker_index)


class _Collect(StatelessSinkPartition):
    def write_batch(self, items):
        t = J.now()
        with _lock:
            for idx, out, t_in in items:
                _results[idx] = out
                _lat.append(t - t_in)
            _t["last_out"] = t


class CollectSink(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _Collect()


# ------------------------------------------------------------------------------ steps
def _chunks(xs, n):
    return (xs[s:s + n] for s in range(0, len(xs), n))


def _image_model(job):
    bs = J.JOBS[job][1]
    infer = J.classify_batch if job == "classify" else J.detect_batch

    def run(batch):  # whatever has arrived: [(idx, tensor, t_in)], in model batches
        sess, out = _session(), []
        for ch in _chunks(batch, bs):
            _calls[len(ch)] += 1
            out.extend((idx, r, t) for (idx, _, t), r in zip(ch, infer(sess, [x for _, x, _ in ch])))
        return out

    return run


def _candidates(state, event):
    e, u, i, t = event
    state = state or J.CandidateState()
    return state, (e, u, state.event(u, i), t)


def _score(batch):  # [(event, user, candidates, t_in)], 10 events a model call
    sess, out = _session(), []
    for ch in _chunks(batch, J.JOBS["ctr"][1]):
        _calls[len(ch)] += 1
        tops = J.score_events(sess, [u for _, u, _, _ in ch], [c for _, _, c, _ in ch])
        out.extend((e, top, t) for (e, _, _, t), top in zip(ch, tops))
    return out


def flow(job):
    assert job in J.JOBS, job
    _sessions.extend(J.make_session(job, ORT_THREADS) for _ in range(WORKERS))
    atexit.register(_finish, job)
    f = Dataflow(f"peer_{job}")
    if job == "ctr":
        events = op.input("events", f, EventSource())
        keyed = op.key_on("all", events, lambda _: "all")
        cands = op.key_rm("unkey", op.stateful_map("candidates", keyed, _candidates))
        if TOTAL_WORKERS > 1:
            cands = op.redistribute("spread", cands)
        res = op.flat_map_batch("score", cands, _score)
    else:
        prep = J.prep_classify if job == "classify" else J.prep_detect
        frames = op.input("frames", f, FrameSource(job))
        decoded = op.map("decode", frames, lambda it: (it[0], prep(J.read_file(it[1])), it[2]))
        res = op.flat_map_batch("infer", decoded, _image_model(job))
    op.output("sink", res, CollectSink())
    _t["flow_ready"] = J.now()
    return f


# ------------------------------------------------------------------------------ report
def _part_path(job, process):
    return os.path.join(J.SCRATCH, f"bytewax_{job}_part{process}.pkl")


def _finish(job):
    part = {"name": NAME, "processes": PROCESSES, "workers": TOTAL_WORKERS, "ort": ORT_THREADS,
            "first_in": _t["first_in"], "last_out": _t["last_out"], "flow_ready": _t["flow_ready"],
            "exit": J.now(), "results": _results, "lat": _lat, "calls": _calls}
    if PROCESSES == 1:
        report(job, [part])
        return
    # Each process holds its workers' share of the outputs: `merge` joins them.
    os.makedirs(J.SCRATCH, exist_ok=True)
    with open(_part_path(job, PROCESS_ID), "wb") as f:
        pickle.dump(part, f)
    print(f"PART {NAME} {job} process={PROCESS_ID} items={len(_results)}", flush=True)


def report(job, parts):
    """One PEER line over the parts (one per process). perf_counter is CLOCK_MONOTONIC, one
    clock for every process on the machine, so the span is the first input to the last output
    in any process."""
    p0 = parts[0]
    results, lat, calls = {}, [], collections.Counter()
    for p in parts:
        results.update(p["results"])
        lat += p["lat"]
        calls.update(p["calls"])
    starts = [p["first_in"] for p in parts if p["first_in"] is not None]
    ends = [p["last_out"] for p in parts if p["last_out"] is not None]
    if not results or not starts:
        print(f"FAILED {p0['name']} {job}: no results", flush=True)
        return
    wall = max(p["exit"] for p in parts) - min(p["flow_ready"] for p in parts)  # for reference
    sizes = ",".join(f"{k}x{v}" for k, v in sorted(calls.items()))
    J.report(p0["name"], job, len(results), max(ends) - min(starts), lat,
             f"run_wall_s={wall:.3f} ort_threads={p0['workers']}x{p0['ort']} "
             f"model_calls(size x count)={sizes} check={J.check(job, results)}")


def merge(job):
    paths = sorted(glob.glob(_part_path(job, "*")))
    if not paths:
        sys.exit(f"merge: no {job} parts in {J.SCRATCH}")
    parts = []
    for path in paths:
        with open(path, "rb") as f:
            parts.append(pickle.load(f))
        os.remove(path)
    if len(parts) != parts[0]["processes"]:
        sys.exit(f"merge: {len(parts)} parts of a {parts[0]['processes']}-process run")
    report(job, parts)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "merge":
        merge(sys.argv[2])
    else:
        sys.exit(__doc__)
