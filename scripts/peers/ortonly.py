"""Reference `ortonly` / `ortonly-s2`: the job's model calls alone, not a pipeline.

    python ortonly.py classify|detect|ctr [--sessions 1|2]

Every input is prepared first, off the clock (frames decoded, ctr's candidates made); then
only the same model calls, on the same batches, are timed. It is the compute limit a pipeline
on these cores can approach. --sessions 2: two Python threads, each with a session of 1
intra-op thread, take alternate batches (ONNX Runtime releases the GIL while it runs), so 2
ONNX Runtime threads either way.
"""
import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs as J  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=sorted(J.JOBS))
    ap.add_argument("--sessions", type=int, default=1)
    a = ap.parse_args()
    n, bs = J.JOBS[a.job]
    threads = max(1, J.TOTAL_ORT_THREADS // a.sessions)
    sessions = [J.make_session(a.job, threads) for _ in range(a.sessions)]
    if a.job == "ctr":
        users, items = J.load_events(n)
        state = J.CandidateState()
        cands = [state.event(int(u), int(i)) for u, i in zip(users, items)]
        users = users.tolist()

        def call(sess, s):
            return J.score_events(sess, users[s:s + bs], cands[s:s + bs])
    else:
        prep = J.prep_classify if a.job == "classify" else J.prep_detect
        infer = J.classify_batch if a.job == "classify" else J.detect_batch
        decoded = {p: prep(J.read_file(p)) for p in J.FRAMES}
        xs = [decoded[p] for _, p in J.frame_items(a.job)]

        def call(sess, s):
            return infer(sess, xs[s:s + bs])

    starts = list(range(0, n, bs))

    def lane(k):  # session k takes every a.sessions-th batch
        return {s + j: out for s in starts[k::a.sessions] for j, out in enumerate(call(sessions[k], s))}

    results = {}
    t0 = J.now()
    with ThreadPoolExecutor(a.sessions) as pool:
        for part in pool.map(lane, range(a.sessions)):
            results.update(part)
    secs = J.now() - t0
    name = "ortonly" if a.sessions == 1 else f"ortonly-s{a.sessions}"
    J.report(name, a.job, len(results), secs, None,
             f"ort_threads={a.sessions}x{threads} check={J.check(a.job, results)}")


if __name__ == "__main__":
    main()
