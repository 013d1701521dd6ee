#!/usr/bin/env python3
"""Python camera peer: the camera job of examples/bench_cameras.rs written as a Python user would.

    camera_peer.py --videos F0,F1,... --seconds S [--width 300 --height 300] [--processes P]
                   [--model models/ssdlite_person.onnx] --results OUT.jsonl [--start-at EPOCH_MS]

Camera k plays file k as a live camera, in process k % P (P: --processes, default one per core):
- a PyAV decoding thread per camera releases each frame at its presentation time (`realtime`),
  plays the file again at its end with times going on (`loop`), stops after 25 × S frames
  (`max_frames`), converts the frame to RGB24 at --width × --height in one swscale pass with
  Riffle's flags, and queues it in a deque of 8 that drops the oldest frame when full
  (`queue_size: 8`);
- the process's inference thread takes up to 4 queued frames (one per camera in turn, as
  Riffle's video source reads its queues), runs SSDLite in ONNX Runtime (1 thread), keeps
  the detections Riffle's `detections` stage keeps (same float32 arithmetic), and tracks them
  per camera with supervision's ByteTrack.

Each result is a line of OUT.jsonl: {"camera", "frame", "count", "capture_ms", "result_ms"}
(capture: the frame's due time, epoch ms), so (camera, frame, count) compares with Riffle's
(camera, frame, detections_count). One JSON summary line is printed on stdout at the end:
frames_in, dropped, results, delivered_fps, capture_p50 / capture_p99 (capture → result ms),
read_p50 / read_p99 (taken from its queue → result ms), cpu_cores (CPU seconds of all processes
from the start to the last result over that time: the job, without Python's start-up) and
cpu_cores_with_startup (the same over the whole run, imports and model loading included).

All cameras share one start: --start-at, or 500 ms after every process has loaded and warmed
its model. Needs av, onnxruntime, numpy and supervision: scripts/peers/camera-setup.sh.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import sys
import threading
import time
import warnings
from collections import deque

import av
import numpy as np
import onnxruntime as ort
from av.video.reformatter import VideoReformatter

# ByteTrack needs no OpenCV, which supervision warns about at import; and its ByteTrack is
# deprecated, which is why camera-setup.sh pins 0.30 (the last release with it).
warnings.filterwarnings("ignore", message=".*OpenCV.*", category=UserWarning)
warnings.filterwarnings("ignore", message=".*ByteTrack.*deprecated.*", category=FutureWarning)
import supervision as sv  # noqa: E402

FPS = 25
BATCH = 4
QUEUE = 8
# Riffle's conversion (connectors/src/video/decoder.rs `scaling_flags`): SWS_BILINEAR |
# SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT. PyAV hands an int straight to swscale as its flags.
SWS_FLAGS = 0x2 | 0x40000 | 0x2000
# Frame step of a looped pass whose frames gave no interval (Riffle's pace.rs DEFAULT_STEP_MS).
DEFAULT_STEP_MS = 40
# The pipeline's `detections` stage: score_threshold, keep_classes, iou_threshold, and its
# default max_detections. Thresholds are float32 as Riffle compares them.
SCORE_THRESHOLD = np.float32(0.1)
KEEP_CLASSES = (1,)
IOU_THRESHOLD = np.float32(0.5)
MAX_DETECTIONS = 100
# The pipeline's `track` stage, in supervision's terms (as scripts/track_reference.py maps
# them): high_threshold 0.5 (supervision starts tracks at 0.6 = new_track_threshold),
# match_iou 0.2, track_buffer 30 frames.
TRACK = dict(
    track_activation_threshold=0.5,
    # supervision keeps a lost track one frame longer than it says.
    lost_track_buffer=29,
    minimum_matching_threshold=0.8,
    # supervision's lost time is frame_rate / 30 × lost_track_buffer: 30 makes it frames.
    frame_rate=30,
    minimum_consecutive_frames=1,
)


def now_ms():
    return time.time() * 1000.0


# ---------------------------------------------------------------------------------------------
# Detections: Riffle's `detections` stage (operators/src/vision/detections/{ssd,nms}.rs).


def to_pixels(boxes, width, height):
    """[K,4] yxyx normalized boxes → x1, y1, x2, y2 in pixels of the camera's frame, ordered and
    clamped (Riffle's `to_pixels`: min/max skip NaN, as Rust's f32::min/max do)."""
    w, h = np.float32(width), np.float32(height)
    y1, x1, y2, x2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    xs = (np.fmin(x1, x2) * w, np.fmax(x1, x2) * w)
    ys = (np.fmin(y1, y2) * h, np.fmax(y1, y2) * h)
    zero = np.float32(0)
    corners = (np.clip(xs[0], zero, w), np.clip(ys[0], zero, h), np.clip(xs[1], zero, w),
               np.clip(ys[1], zero, h))
    return np.stack(corners, axis=1)


def iou_matrix(r):
    """Pairwise IoU of [n,4] x1y1x2y2 float32 boxes, in Riffle's order of float32 operations."""
    zero = np.float32(0)
    w = np.fmax(np.fmin(r[:, None, 2], r[None, :, 2]) - np.fmax(r[:, None, 0], r[None, :, 0]), zero)
    h = np.fmax(np.fmin(r[:, None, 3], r[None, :, 3]) - np.fmax(r[:, None, 1], r[None, :, 1]), zero)
    inter = w * h
    area = np.fmax(r[:, 2] - r[:, 0], zero) * np.fmax(r[:, 3] - r[:, 1], zero)
    union = area[:, None] + area[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > zero, inter / np.where(union > zero, union, np.float32(1)), zero)


def detect(boxes, scores, classes, width, height):
    """One frame's kept detections (xyxy [n,4], scores [n], class ids [n]), best first."""
    # Riffle drops NaN scores and non-finite classes; NaN < threshold is False, so test both.
    ok = ~np.isnan(scores) & ~(scores < SCORE_THRESHOLD) & np.isfinite(classes)
    # f32::round rounds halves away from zero (numpy's round to even): in float64, exactly.
    c = classes.astype(np.float64)
    class_ids = np.where(ok, np.copysign(np.floor(np.abs(c) + 0.5), c), 0).astype(np.int64)
    ok &= np.isin(class_ids, KEEP_CLASSES)
    index = np.flatnonzero(ok)
    rects = to_pixels(boxes[index], width, height)
    kept = []
    # NMS per class, classes in ascending order, candidates in model order within a class.
    for class_id in np.unique(class_ids[index]):
        members = np.flatnonzero(class_ids[index] == class_id)
        # Best score first; equal scores keep model order (a stable sort).
        order = members[np.argsort(-scores[index[members]], kind="stable")]
        iou = iou_matrix(rects[order])
        suppressed = np.zeros(len(order), dtype=bool)
        for i in range(len(order)):
            if suppressed[i]:
                continue
            kept.append(order[i])
            # Riffle keeps a box only if IoU <= threshold with every kept one (NaN suppresses).
            suppressed |= ~(iou[i] <= IOU_THRESHOLD)
    kept = np.array(kept, dtype=np.int64)
    kept = kept[np.argsort(-scores[index[kept]], kind="stable")][:MAX_DETECTIONS]
    return rects[kept], scores[index[kept]], class_ids[index[kept]]


# ---------------------------------------------------------------------------------------------
# A camera: decoding thread and queue (connectors/src/video/{camera,pace,queue}.rs).


class Camera:
    def __init__(self, index, path, frames, size, start_at, wake):
        self.index, self.path, self.frames, self.size = index, path, frames, size
        self.start_at = start_at
        self.wake = wake  # the process's Condition: guards every queue of the process
        self.queue = deque(maxlen=QUEUE)
        self.finished = False
        self.frames_in = 0
        self.dropped = 0
        self.error = None

    def run(self):
        try:
            self.play()
        except Exception as e:  # reported by the worker, which fails the run
            self.error = f"camera {self.index} ({self.path}): {e!r}"
        with self.wake:
            self.finished = True
            self.wake.notify()

    def play(self):
        number = -1  # the frame's number: numbers go on across passes of the file
        offset_ms, last_ms, step_ms = 0, None, None  # pts shift of the pass (Riffle's `Looping`)
        pts0 = None  # first frame's time: it is due at start_at
        # One swscale context for the camera, as Riffle keeps its scaler (frame.reformat would
        # make one a frame).
        scaler = VideoReformatter()
        while True:
            frames_in_pass = 0
            with av.open(self.path) as container:
                stream = container.streams.video[0]
                # Riffle's decoder runs single-threaded (libavcodec's default), one per camera.
                stream.codec_context.thread_count = 1
                tb, start = stream.time_base, stream.start_time or 0
                for frame in container.decode(stream):
                    number += 1
                    frames_in_pass += 1
                    pts = ms_of(frame.pts - start, tb) + offset_ms
                    if last_ms is not None and pts > last_ms:
                        step_ms = pts - last_ms
                    last_ms = pts if last_ms is None else max(last_ms, pts)
                    if pts0 is None:
                        pts0 = pts
                    # Released at its time; a late one stays due when it was (its lateness
                    # counts in its latency).
                    due = self.start_at + max(pts - pts0, 0)
                    wait = due / 1000.0 - time.time()
                    if wait > 0:
                        time.sleep(wait)
                    # Converted after its release, as Riffle does; one thread, like Riffle's.
                    rgb = scaler.reformat(
                        frame, width=self.size[0], height=self.size[1], format="rgb24",
                        interpolation=SWS_FLAGS, threads=1,
                    ).to_ndarray()
                    with self.wake:
                        if len(self.queue) == QUEUE:
                            self.dropped += 1  # the deque drops its oldest frame
                        self.queue.append((number, due, frame.width, frame.height, rgb))
                        self.frames_in += 1
                        self.wake.notify()
                    if self.frames_in == self.frames:
                        return
            if frames_in_pass == 0:
                return
            # The next pass starts one frame step after this one's last frame.
            offset_ms = last_ms + (step_ms or DEFAULT_STEP_MS)


def ms_of(ts, tb):
    """Milliseconds of `ts` in time base `tb`, truncated toward zero like Riffle's integers."""
    v = ts * tb.numerator * 1000
    return v // tb.denominator if v >= 0 else -(-v // tb.denominator)


# ---------------------------------------------------------------------------------------------
# A worker process: its cameras' threads and the inference loop.


def take(cameras, first, limit):
    """Up to `limit` frames, one per camera in turn from camera `first` (Riffle's `take`)."""
    got = []
    progressed = True
    while progressed and len(got) < limit:
        progressed = False
        for k in range(len(cameras)):
            camera = cameras[(first + k) % len(cameras)]
            if len(got) < limit and camera.queue:
                got.append((camera, camera.queue.popleft()))
                progressed = True
    return got


def session(model):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def worker(assigned, args, conn):
    """Runs camera (index, path) pairs `assigned`; sends back results and counters."""
    model = session(args.model)
    image = model.get_inputs()[0].name
    outputs = ["detection_boxes:0", "detection_scores:0", "detection_classes:0"]
    # ONNX Runtime's first run allocates and plans: done before the start, as Riffle warms.
    model.run(outputs, {image: np.zeros((1, args.height, args.width, 3), np.uint8)})
    conn.send("ready")
    start_at = conn.recv()
    cpu0 = cpu_seconds(resource.RUSAGE_SELF)

    # The cameras open their files and decode ahead of the start, then wait for each frame's
    # time: their first frames are due at start_at, all together.
    wake = threading.Condition()
    cameras = [
        Camera(k, path, FPS * args.seconds, (args.width, args.height), start_at, wake)
        for k, path in assigned
    ]
    trackers = {c.index: sv.ByteTrack(**TRACK) for c in cameras}
    threads = [
        threading.Thread(target=c.run, name=f"camera-{c.index}", daemon=True) for c in cameras
    ]
    for t in threads:
        t.start()

    results, reads = [], []
    first = 0
    while True:
        with wake:
            batch = take(cameras, first, BATCH)
            first = (first + 1) % len(cameras)
            if not batch:
                if all(c.finished and not c.queue for c in cameras):
                    break
                wake.wait()
                continue
        read = now_ms()
        pixels = np.stack([frame[4] for _, frame in batch])
        boxes, scores, classes = model.run(outputs, {image: pixels})
        for row, (camera, (number, due, width, height, _)) in enumerate(batch):
            xyxy, conf, class_id = detect(boxes[row], scores[row], classes[row], width, height)
            trackers[camera.index].update_with_detections(
                sv.Detections(xyxy=xyxy, confidence=conf, class_id=class_id)
            )
            done = now_ms()
            results.append((camera.index, number, len(conf), due, done))
            reads.append(done - read)
    for t in threads:
        t.join()
    conn.send({
        "results": results,
        "reads": reads,
        "frames_in": sum(c.frames_in for c in cameras),
        "dropped": sum(c.dropped for c in cameras),
        "cpu": cpu_seconds(resource.RUSAGE_SELF) - cpu0,
        "errors": [c.error for c in cameras if c.error],
    })


def cpu_seconds(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# The parent: deals cameras to processes, starts them together, merges and sums up.


def quantile(values, q):
    """Nearest-rank quantile, 0 when empty (as the bench's `quantile`)."""
    if not values:
        return 0.0
    v = sorted(values)
    rank = min(max(math.ceil(q * len(v)), 1), len(v))
    return v[rank - 1]


def receive(proc, conn):
    try:
        return conn.recv()
    except EOFError:
        proc.join()
        sys.exit(f"camera-peer: {proc.name} failed (exit code {proc.exitcode})")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--videos", required=True, help="comma-separated: camera k plays file k")
    p.add_argument("--seconds", type=int, required=True,
                   help="max_frames = 25 × seconds per camera")
    p.add_argument("--width", type=int, default=300)
    p.add_argument("--height", type=int, default=300)
    p.add_argument("--processes", type=int, default=os.cpu_count())
    p.add_argument("--model", default="models/ssdlite_person.onnx")
    p.add_argument("--results", required=True, help="JSONL written: one line per result")
    p.add_argument("--start-at", type=int,
                   help="common start, epoch ms (default: 500 ms after every process is ready)")
    return p.parse_args()


def main():
    args = parse_args()
    t0 = time.time()
    cpu0 = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN)
    videos = args.videos.split(",")
    processes = max(1, min(args.processes, len(videos)))
    # Spawned, not forked: each process starts clean (no inherited threads or FFmpeg state).
    ctx = mp.get_context("spawn")
    workers = []
    for w in range(processes):
        assigned = [(k, path) for k, path in enumerate(videos) if k % processes == w]
        parent, child = ctx.Pipe()
        # Daemons: a failing run ends them with the parent instead of waiting on them.
        proc = ctx.Process(target=worker, args=(assigned, args, child), name=f"camera-peer-{w}",
                           daemon=True)
        proc.start()
        workers.append((proc, parent))
    for proc, conn in workers:
        receive(proc, conn)  # "ready"
    start_at = args.start_at if args.start_at is not None else int(now_ms()) + 500
    for _, conn in workers:
        conn.send(start_at)
    parts = [receive(proc, conn) for proc, conn in workers]
    for proc, _ in workers:
        proc.join()
    errors = [e for part in parts for e in part["errors"]]
    if errors or any(proc.exitcode != 0 for proc, _ in workers):
        sys.exit("camera-peer: " + ("; ".join(errors) or "a worker process failed"))

    results = sorted(r for part in parts for r in part["results"])
    with open(args.results, "w") as out:
        for camera, frame, count, capture, result in results:
            out.write(json.dumps({"camera": camera, "frame": frame, "count": count,
                                  "capture_ms": capture, "result_ms": result}) + "\n")
    captures = [r[4] - r[3] for r in results]
    reads = [x for part in parts for x in part["reads"]]
    first = min((r[3] for r in results), default=0)
    last = max((r[4] for r in results), default=0)
    wall = time.time() - t0
    cpu_all = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN) - cpu0
    print(json.dumps({
        "frames_in": sum(p["frames_in"] for p in parts),
        "dropped": sum(p["dropped"] for p in parts),
        "results": len(results),
        "delivered_fps": len(results) / (max(last - first, 1) / 1000.0),
        "capture_p50": quantile(captures, 0.5),
        "capture_p99": quantile(captures, 0.99),
        "read_p50": quantile(reads, 0.5),
        "read_p99": quantile(reads, 0.99),
        "cpu_cores": sum(p["cpu"] for p in parts) / max((last - start_at) / 1000.0, 1e-3),
        "cpu_cores_with_startup": cpu_all / wall,
        "processes": processes,
    }))


if __name__ == "__main__":
    main()
