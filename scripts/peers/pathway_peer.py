"""Peers `pathway-t1`, `pathway-t2` (pathway==0.33.0, static mode): the jobs as a Pathway
pipeline.

    PATHWAY_THREADS=1 python pathway_peer.py classify|detect|ctr      # or PATHWAY_THREADS=2

Image jobs: a CSV of (idx, path) rows read by pw.io.csv.read, one UDF (max_batch_size = the
job's batch) that reads, decodes and runs the model on its batch, pw.io.subscribe as the sink.
ctr: the ratings CSV read by pw.io.csv.read; a sorted_tuple reducer gathers (timestamp, user,
item) in time order, a UDF scans it for each event's candidates (the state is sequential), the
rows are flattened and a batched UDF (10 events a call) scores them and takes the top-10.

Timing: the wall time of pw.run(), engine start and teardown included (the UDFs' first call to
last output is printed as udf_span_s). No per-item latency: in static mode every row is read
before any is processed, so it would only measure the run's length. A session per Pathway
thread, with 2 // PATHWAY_THREADS intra-op threads (PEER_ORT_THREADS overrides).
"""
import collections
import os
import sys

import numpy as np
import pathway as pw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs as J  # noqa: E402

THREADS = int(os.environ.get("PATHWAY_THREADS", "1"))
ORT_THREADS = int(os.environ.get("PEER_ORT_THREADS", max(1, J.TOTAL_ORT_THREADS // THREADS)))

_sessions = []
_thread_session = J.session_per_thread(_sessions)
_calls = collections.Counter()  # model-call size -> how many
_t = {"first_call": None, "last_out": None}


def _session():
    if _t["first_call"] is None:
        _t["first_call"] = J.now()
    return _thread_session()


class FrameRow(pw.Schema):
    idx: int
    path: str


class RatingRow(pw.Schema):  # data/ml-100k/ratings-20k.csv's header
    user_id: int
    item_id: int
    rating: int
    timestamp: int


def image_pipeline(job):
    # Pathway reads its input from a connector: the job's items as a CSV of paths.
    paths = os.path.join(J.SCRATCH, f"pathway_{job}_{os.getpid()}.csv")
    with open(paths, "w") as f:
        f.write("idx,path\n")
        f.writelines(f"{idx},{path}\n" for idx, path in J.frame_items(job))
    prep = J.prep_classify if job == "classify" else J.prep_detect
    infer = J.classify_batch if job == "classify" else J.detect_batch

    def run(paths):
        _calls[len(paths)] += 1
        return infer(_session(), [prep(J.read_file(p)) for p in paths])

    # The UDF's return type must be declared: a class id, or the person boxes as tuples.
    if job == "classify":
        @pw.udf(max_batch_size=J.JOBS[job][1], deterministic=True)
        def model(paths: list[str]) -> list[int]:
            return run(paths)
    else:
        @pw.udf(max_batch_size=J.JOBS[job][1], deterministic=True)
        def model(paths: list[str]) -> list[tuple]:
            return [tuple(map(tuple, boxes)) for boxes in run(paths)]

    rows = pw.io.csv.read(paths, schema=FrameRow, mode="static")
    return rows.select(key=pw.this.idx, out=model(pw.this.path)), paths


def ctr_pipeline():
    n, bs = J.JOBS["ctr"]

    @pw.udf(deterministic=True)
    def candidates(events: tuple) -> tuple:
        # events: ((timestamp, user, item), ...) sorted, i.e. in the job's order
        state = J.CandidateState()
        return tuple((e, u, state.event(u, i)) for e, (_, u, i) in enumerate(events[:n]))

    @pw.udf(max_batch_size=bs, deterministic=True)
    def score(users: list[int], cands: list[np.ndarray]) -> list[np.ndarray]:
        _calls[len(users)] += 1
        return J.score_events(_session(), users, [np.asarray(c, np.int64) for c in cands])

    rows = pw.io.csv.read(J.RATINGS, schema=RatingRow, mode="static")
    events = rows.reduce(evs=pw.reducers.sorted_tuple(
        pw.make_tuple(pw.this.timestamp, pw.this.user_id, pw.this.item_id)))
    cands = events.select(c=candidates(pw.this.evs)).flatten(pw.this.c)
    cands = cands.select(e=pw.this.c[0], u=pw.this.c[1], cands=pw.this.c[2])
    return cands.select(key=pw.this.e, out=score(pw.this.u, pw.this.cands)), None


def main():
    job = sys.argv[1] if len(sys.argv) == 2 else None
    if job not in J.JOBS:
        sys.exit(__doc__)
    os.makedirs(J.SCRATCH, exist_ok=True)
    _sessions.extend(J.make_session(job, ORT_THREADS) for _ in range(THREADS))
    table, scratch = ctr_pipeline() if job == "ctr" else image_pipeline(job)
    results = {}

    def on_change(key, row, time, is_addition):
        if is_addition:
            out = row["out"]
            # Back to what jobs.check digests: boxes as tuples, ctr's top-10 as an array.
            if job == "detect":
                out = [tuple(box) for box in out]
            elif job == "ctr":
                out = np.asarray(out, np.int64)
            results[row["key"]] = out
            _t["last_out"] = J.now()

    pw.io.subscribe(table, on_change=on_change)
    t0 = J.now()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    t1 = J.now()
    if scratch:
        os.remove(scratch)
    if not results:
        print(f"FAILED pathway-t{THREADS} {job}: no results", flush=True)
        sys.exit(1)
    sizes = ",".join(f"{k}x{v}" for k, v in sorted(_calls.items()))
    J.report(f"pathway-t{THREADS}", job, len(results), t1 - t0, None,
             f"udf_span_s={_t['last_out'] - _t['first_call']:.3f} "
             f"before_first_call_s={_t['first_call'] - t0:.3f} "
             f"after_last_out_s={t1 - _t['last_out']:.3f} ort_threads={THREADS}x{ORT_THREADS} "
             f"model_calls(size x count)={sizes} check={J.check(job, results)}")


if __name__ == "__main__":
    main()
