#!/usr/bin/env python3
"""Compares Riffle's `track` ids with supervision's ByteTrack on the same detections.

    track_reference.py RESULTS.jsonl [--high-threshold 0.5] [--match-iou 0.2] [--track-buffer 30]

RESULTS.jsonl is a `track` pipeline's output: rows with `camera_id`, `frame` and `detections`
(each with `score`, `x1`..`y2` and, when tracked, `track_id`). Every camera's frames are fed,
in order, to a fresh `sv.ByteTrack`; its ids are the ground truth, Riffle's the hypotheses, and
both label the same detections, so a detection is matched to itself (distance 0) and to nothing
else. Prints one JSON object: motmetrics' IDF1, ID switches, MOTA, and counts.

Needs `supervision` (0.30: the last with `sv.ByteTrack`) and `motmetrics`; scripts/setup.sh
installs them into ~/.cache/riffle/track-venv.
"""

import argparse
import json
import sys
from collections import defaultdict

import motmetrics as mm
import numpy as np
import supervision as sv


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results")
    p.add_argument("--high-threshold", type=float, default=0.5)
    p.add_argument("--low-threshold", type=float, default=0.1)
    p.add_argument("--new-track-threshold", type=float, default=0.6)
    p.add_argument("--match-iou", type=float, default=0.2)
    p.add_argument("--track-buffer", type=int, default=30)
    return p.parse_args()


def main():
    args = parse_args()
    # supervision fixes what Riffle makes configurable: say so rather than compare apples to pears.
    if abs(args.low_threshold - 0.1) > 1e-9:
        sys.exit("supervision's ByteTrack has a fixed low threshold of 0.1")
    if abs(args.new_track_threshold - min(args.high_threshold + 0.1, 1.0)) > 1e-6:
        sys.exit("supervision starts tracks at high_threshold + 0.1: set new_track_threshold so")

    cameras = defaultdict(dict)
    with open(args.results) as f:
        for line in f:
            row = json.loads(line)
            cameras[row["camera_id"]][row["frame"]] = row.get("detections") or []

    acc = mm.MOTAccumulator(auto_id=True)
    counts = defaultdict(int)
    for c, camera in enumerate(sorted(cameras)):
        frames = cameras[camera]
        # motmetrics wants numeric ids: ids are per camera, so the camera goes in the high digits.
        uid = lambda track_id, c=c: c * 1_000_000 + int(track_id)
        tracker = sv.ByteTrack(
            track_activation_threshold=args.high_threshold,
            # supervision keeps a lost track one frame longer than it says (it drops removed
            # tracks from the lost list a frame late): buffer - 1 keeps it as long as Riffle.
            lost_track_buffer=args.track_buffer - 1,
            minimum_matching_threshold=1.0 - args.match_iou,
            # max_time_lost = frame_rate / 30 × lost_track_buffer: 30 makes it frames.
            frame_rate=30,
            minimum_consecutive_frames=1,
        )
        # Missing frame numbers are empty frames, as Riffle treats them.
        for frame in range(min(frames), max(frames) + 1):
            dets = frames.get(frame, [])
            n = len(dets)
            xyxy = np.array([[d["x1"], d["y1"], d["x2"], d["y2"]] for d in dets], dtype=np.float32)
            detections = sv.Detections(
                xyxy=xyxy.reshape(n, 4),
                confidence=np.array([d["score"] for d in dets], dtype=np.float32),
                class_id=np.array([d.get("class_id", 0) for d in dets], dtype=int),
                data={"index": np.arange(n)},
            )
            tracked = tracker.update_with_detections(detections)
            reference = {}
            if len(tracked) > 0:
                for i, t in zip(tracked.data["index"], tracked.tracker_id):
                    reference[int(i)] = uid(t)
            riffle = {
                i: uid(d["track_id"])
                for i, d in enumerate(dets)
                if d.get("track_id") is not None
            }
            gt, hyp = sorted(reference), sorted(riffle)
            dist = np.array([[0.0 if g == h else np.nan for h in hyp] for g in gt]).reshape(
                len(gt), len(hyp)
            )
            acc.update([reference[g] for g in gt], [riffle[h] for h in hyp], dist)
            counts["frames"] += 1
            counts["detections"] += n
            counts["tracked_by_reference"] += len(gt)
            counts["tracked_by_riffle"] += len(hyp)
            counts["tracked_by_both"] += sum(
                1 for g in gt if g in riffle
            )

    summary = mm.metrics.create().compute(
        acc, metrics=["idf1", "num_switches", "mota", "num_unique_objects"], name="all"
    )
    out = {
        "idf1": float(summary["idf1"]["all"]),
        "id_switches": int(summary["num_switches"]["all"]),
        "mota": float(summary["mota"]["all"]),
        "reference_ids": int(summary["num_unique_objects"]["all"]),
        "riffle_ids": len({h for h in acc.mot_events["HId"].dropna().unique()}),
        "cameras": len(cameras),
        **counts,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
