"""The three benchmark jobs (classify, detect, ctr), shared by every Python peer.

The peers differ only in how they orchestrate the work; the work itself (read, decode, resize,
normalise, model call, post-processing) is the functions here, so every peer does the same job
and prints the same `check=` digest, which Riffle's examples/bench_job.rs prints too.

Inputs come from the repository: the frames in data/frames/bikes/, the models in models/, and
the first 20,000 MovieLens-100k ratings in data/ml-100k/ratings-20k.csv (scripts/ml-100k.sh
writes it; Riffle's ctr reads the same file).

Timing, for every peer: the clock starts after imports, model load and one warm-up run per ONNX
Runtime session, before the first item is read, and stops when the last result reaches the sink.
An item's latency runs from the moment the source hands it in (before its file is read or its
event parsed) to its sink write.
"""
import glob
import hashlib
import os
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "models")
FRAMES = sorted(glob.glob(os.path.join(ROOT, "data", "frames", "bikes", "*.jpg")))
RATINGS = os.path.join(ROOT, "data", "ml-100k", "ratings-20k.csv")
# Files a run's processes hand each other (Bytewax's parts, Pathway's input CSV);
# scripts/peers/bench.sh gives each run a fresh one.
SCRATCH = os.environ.get("PEER_SCRATCH") or os.path.join(tempfile.gettempdir(), "riffle-peers")

# job -> (items, model batch)
#   classify: 1000 images (the 250 frames 4 times), MobileNetV2 on 8 at a time
#   detect:   the 250 frames, SSDLite one at a time (it takes a dynamic batch, but batches of
#             8 were no faster on 2 cores)
#   ctr:      20,000 rating events, the NCF model on 10 events' candidates (<= 1,000 rows) a call
JOBS = {"classify": (1000, 8), "detect": (250, 1), "ctr": (20000, 10)}
MODEL = {"classify": "mobilenet_v2_imagenet", "detect": "ssdlite_person", "ctr": "ml100k_ncf_ctr"}
# ONNX Runtime threads in all, whatever the peer: one session with 2, or one per worker with 1.
TOTAL_ORT_THREADS = 2

now = time.perf_counter

try:
    import cv2

    # Decoding stays on its worker's thread: the 2 cores are for ONNX Runtime and the pipeline.
    cv2.setNumThreads(1)
except ImportError:  # ctr needs no OpenCV
    cv2 = None


def make_session(job, threads):
    """A CPU session for the job's model, warmed up by one run (before any clock starts)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    path = os.path.join(MODELS, MODEL[job] + ".onnx")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    if job == "classify":
        sess.run(None, {"input": np.zeros((JOBS[job][1], 3, 224, 224), np.float32)})
    elif job == "detect":
        sess.run(None, {"image_tensor:0": np.zeros((1, 300, 300, 3), np.uint8)})
    else:
        ones = np.ones(1000, np.int64)
        sess.run(None, {"user_id": ones, "item_id": ones})
    return sess


# ------------------------------------------------------------------------------ images
def frame_items(job):
    """(index, path) of every item of an image job, in source order."""
    return [(i, FRAMES[i % len(FRAMES)]) for i in range(JOBS[job][0])]


def read_file(path):
    return np.fromfile(path, np.uint8)


def decode_rgb(buf, size):
    """JPEG bytes -> RGB u8[size, size, 3]: OpenCV's INTER_LINEAR (no antialias), as Riffle's
    `resize` stage (operators/src/vision/resize, checked against cv2 by its tests)."""
    im = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    im = cv2.resize(im, (size, size), interpolation=cv2.INTER_LINEAR)
    return cv2.cvtColor(im, cv2.COLOR_BGR2RGB)


# ImageNet normalisation folded into one multiply and one subtract: (x/255 - mean)/std.
_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)
_SCALE = (1.0 / (255.0 * _STD))[:, None, None].astype(np.float32)
_BIAS = (_MEAN / _STD)[:, None, None].astype(np.float32)


def prep_classify(buf):
    """JPEG bytes -> f32[3, 224, 224], normalised, NCHW."""
    x = decode_rgb(buf, 224).transpose(2, 0, 1).astype(np.float32)
    x *= _SCALE
    x -= _BIAS
    return x


def classify_batch(sess, xs):
    """f32[3, 224, 224] each -> top-1 class id each."""
    logits = sess.run(["logits"], {"input": np.stack(xs)})[0]
    return logits.argmax(axis=1).tolist()


def prep_detect(buf):
    return decode_rgb(buf, 300)


def detect_batch(sess, xs):
    """u8[300, 300, 3] each -> the person boxes of each, (score, ymin, xmin, ymax, xmax):
    class 1 scoring over 0.5."""
    n, boxes, scores, classes = sess.run(None, {"image_tensor:0": np.stack(xs)})
    out = []
    for b in range(len(xs)):
        k = int(n[b])
        keep = (scores[b, :k] > 0.5) & (classes[b, :k] == 1.0)
        out.append([(float(s),) + tuple(map(float, box))
                    for s, box in zip(scores[b, :k][keep], boxes[b, :k][keep])])
    return out


# ------------------------------------------------------------------------------ ctr
N_CAND, TOP_K = 100, 10
_NITEMS = 2048  # ml-100k's item ids are 1..1682


def load_events(n=JOBS["ctr"][0], path=RATINGS):
    """The first n ratings as (users, items) i64 arrays, in (timestamp, user, item) order.

    ratings-20k.csv is written in that order already; sorting again (a few ms, inside the
    clock) keeps the job defined by its data, not by how the file was written."""
    a = np.loadtxt(path, dtype=np.int64, delimiter=",", skiprows=1, usecols=(0, 1, 3), ndmin=2)
    if len(a) < n:
        raise SystemExit(f"{path}: {len(a)} ratings, {n} needed (scripts/ml-100k.sh writes it)")
    order = np.lexsort((a[:, 1], a[:, 0], a[:, 2]))[:n]
    return a[order, 0].copy(), a[order, 1].copy()


class CandidateState:
    """Popularity so far, and what each user has rated so far.

    event(u, i) first records the event (u has now rated i; i's count goes up by 1), then
    returns u's candidates: the N_CAND items with the highest count so far (ties: the smaller
    item id first) that u has not rated, most popular first; items never rated are none."""

    def __init__(self, n_users=1024):
        # One sortable key per item, count * 2048 + (2047 - id): a higher count first, then a
        # smaller id. -1: never rated (and never a candidate).
        self.key = np.full(_NITEMS, -1, np.int64)
        self.rated = np.zeros((n_users, _NITEMS), bool)

    def event(self, u, i):
        if u >= self.rated.shape[0]:
            self.rated = np.concatenate([self.rated, np.zeros((u + 1, _NITEMS), bool)])
        self.rated[u, i] = True
        self.key[i] = (2047 - i) + _NITEMS if self.key[i] < 0 else self.key[i] + _NITEMS
        k = np.where(self.rated[u], -1, self.key)
        top = np.argpartition(k, -N_CAND)[-N_CAND:]
        top = top[np.argsort(-k[top], kind="stable")]
        return top[k[top] > 0].astype(np.int64)


def score_events(sess, users, cands):
    """One model call for several events: users[e] with candidates cands[e] -> the top-10 items
    of each event by score (a stable sort: ties keep the candidates' order)."""
    lens = [len(c) for c in cands]
    iid = np.concatenate(cands)
    if len(iid) == 0:  # the first event has no candidates, and the model takes no 0-row batch
        return [c[:0] for c in cands]
    uid = np.repeat(np.asarray(users, np.int64), lens)
    p = sess.run(["p_click"], {"user_id": uid, "item_id": iid})[0]
    out, o = [], 0
    for c, n in zip(cands, lens):
        out.append(c[np.argsort(-p[o:o + n], kind="stable")[:TOP_K]])
        o += n
    return out


# ------------------------------------------------------------------------------ results
def check(job, results):
    """A short digest of every output ({index: output}); equal across peers and Riffle."""
    if job == "detect":
        frames = sum(1 for boxes in results.values() if boxes)
        boxes = sum(len(boxes) for boxes in results.values())
        return f"person_frames={frames},person_boxes={boxes}"
    if job == "classify":
        text = ",".join(f"{i}:{results[i]}" for i in sorted(results))
    else:
        text = ";".join(f"{i}:" + ",".join(map(str, results[i].tolist())) for i in sorted(results))
    return "sha1=" + hashlib.sha1(text.encode()).hexdigest()[:12]


def report(name, job, n, seconds, latencies=None, extra=""):
    """Prints the peer's one result line (parsed by scripts/lib/peers_table.py and others):
    PEER <name> <job> items= seconds= items_per_s= [p50_ms= p99_ms=] <extra: ... check=>"""
    line = f"PEER {name} {job} items={n} seconds={seconds:.3f} items_per_s={n / seconds:.1f}"
    if latencies is not None and len(latencies):
        ms = np.asarray(latencies) * 1000.0
        line += f" p50_ms={np.percentile(ms, 50):.2f} p99_ms={np.percentile(ms, 99):.2f}"
    if extra:
        line += " " + extra
    print(line, flush=True)
    return line


def session_per_thread(sessions):
    """A function that gives each calling thread a session of its own, taken from `sessions`
    (made and warmed before the clock). Keyed by thread id: threading.local is reset on the
    threads Bytewax's and Pathway's Rust engines make."""
    import threading

    lock, by_thread = threading.Lock(), {}

    def get():
        tid = threading.get_ident()
        s = by_thread.get(tid)
        if s is None:
            with lock:
                if not sessions:
                    raise RuntimeError("more threads called the model than sessions were made")
                s = by_thread[tid] = sessions.pop()
        return s

    return get


class BytewaxTopology:
    """The topology bytewax.run was given (``-w``, ``-a``, ``-i`` or their environment
    variables), read the way bytewax.run reads it, before the flow is built: each worker's
    session is made (and warmed) off the clock."""

    def __init__(self, argv):
        def arg(flags, env, default):
            for flag in flags:
                if flag in argv:
                    return argv[argv.index(flag) + 1]
            return os.environ.get(env, default)

        self.workers = int(arg(("-w", "--workers-per-process"), "BYTEWAX_WORKERS_PER_PROCESS", "1"))
        addresses = arg(("-a", "--addresses"), "BYTEWAX_ADDRESSES", None)
        self.processes = len(addresses.split(";")) if addresses else 1
        self.process_id = int(arg(("-i", "--process-id"), "BYTEWAX_PROCESS_ID", "0"))
        self.total_workers = self.workers * self.processes
        self.ort_threads = int(os.environ.get("PEER_ORT_THREADS", max(1, TOTAL_ORT_THREADS // self.total_workers)))

    def name(self, base):
        """``base-w2`` for one process, ``base-p2w1`` for several."""
        if self.processes == 1:
            return f"{base}-w{self.workers}"
        return f"{base}-p{self.processes}w{self.workers}"
