"""Peer `plain`: the job as a straight Python loop in one process (NumPy, OpenCV, ONNX Runtime).

    python plain.py classify|detect|ctr [--threads 2]

One session with --threads intra-op threads (2: the peers' ONNX Runtime threads in all).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs as J  # noqa: E402


def run_images(job, sess):
    n, bs = J.JOBS[job]
    prep = J.prep_classify if job == "classify" else J.prep_detect
    infer = J.classify_batch if job == "classify" else J.detect_batch
    items = J.frame_items(job)
    results, lat = {}, []
    t0 = J.now()
    for s in range(0, n, bs):
        batch, t_in, xs = items[s:s + bs], [], []
        for _, path in batch:
            t_in.append(J.now())
            xs.append(prep(J.read_file(path)))
        for (idx, _), t, out in zip(batch, t_in, infer(sess, xs)):
            results[idx] = out
            lat.append(J.now() - t)
    return J.now() - t0, results, lat


def run_ctr(sess):
    n, bs = J.JOBS["ctr"]
    results, lat = {}, []
    t0 = J.now()
    users, items = J.load_events(n)  # reading the ratings is part of the job
    state = J.CandidateState()
    pending = []  # (event, user, candidates, t_in) waiting for a full model call
    for e in range(n):
        t = J.now()
        u = int(users[e])
        pending.append((e, u, state.event(u, int(items[e])), t))
        if len(pending) == bs or e == n - 1:
            tops = J.score_events(sess, [p[1] for p in pending], [p[2] for p in pending])
            for (idx, _, _, t_in), top in zip(pending, tops):
                results[idx] = top
                lat.append(J.now() - t_in)
            pending = []
    return J.now() - t0, results, lat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=sorted(J.JOBS))
    ap.add_argument("--threads", type=int, default=J.TOTAL_ORT_THREADS)
    a = ap.parse_args()
    sess = J.make_session(a.job, a.threads)
    secs, results, lat = run_ctr(sess) if a.job == "ctr" else run_images(a.job, sess)
    assert len(results) == J.JOBS[a.job][0], len(results)
    J.report("plain", a.job, len(results), secs, lat,
             f"ort_threads=1x{a.threads} check={J.check(a.job, results)}")


if __name__ == "__main__":
    main()
