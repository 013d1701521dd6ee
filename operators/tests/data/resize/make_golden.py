"""Golden outputs of OpenCV's u8 INTER_LINEAR resize for the `resize` stage's two-tap path.

    "$RIFFLE_CV2_PYTHON" operators/tests/data/resize/make_golden.py > operators/tests/data/resize/cv2_inter_linear.txt

(RIFFLE_CV2_PYTHON: a Python with opencv-python-headless 5.0.0.93, such as scripts/setup.sh's
YOLO venv, which scripts/test.sh uses, or the peers' venv of scripts/peers/setup.sh.)

Each line: `sw sh dw dh seed fnv1a64(output) [output bytes in hex, small cases only]`, the source
being `synthetic(sw, sh, seed)` (the Rust test builds the same image), RGB8, row-major.
With `--check sw sh dw dh seed`, prints one case's line instead (the live test calls it).
"""
import sys

import cv2
import numpy as np

cv2.setNumThreads(1)

# (source w, h) -> (target w, h): the peers' and YOLO's sizes, 2x both ways (OpenCV's 2x2
# INTER_AREA shortcut), one axis up and one down, a single row or column, and odd sizes.
CASES = [
    (640, 272, 224, 224), (640, 272, 300, 300), (1280, 720, 640, 360), (320, 240, 640, 640),
    (320, 240, 640, 480), (640, 272, 640, 640), (1280, 720, 640, 640), (1920, 1080, 224, 224),
    (64, 48, 23, 37), (37, 23, 16, 20), (5, 7, 11, 13), (101, 100, 29, 37), (47, 33, 3, 5),
    (9, 9, 3, 3), (1, 1, 4, 4), (7, 1, 2, 3), (1, 5, 9, 1), (2, 2, 1, 1), (500, 300, 501, 299),
    (300, 300, 100, 100), (481, 641, 240, 320),
]
SMALL = 2000


def synthetic(w, h, seed):
    """Gradients with every fifth byte noise from a 32-bit LCG (the Rust test's generator)."""
    out = np.empty(w * h * 3, np.uint8)
    state = (seed * 2654435761 + 1) & 0xFFFFFFFF
    i = 0
    for y in range(h):
        for x in range(w):
            for c in range(3):
                state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
                smooth = (x * 7 + y * 3 + c * 50) % 256
                out[i] = state >> 24 if (x + y + c) % 5 == 0 else smooth
                i += 1
    return out.reshape(h, w, 3)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def line(sw, sh, dw, dh, seed):
    out = cv2.resize(synthetic(sw, sh, seed), (dw, dh), interpolation=cv2.INTER_LINEAR)
    data = out.tobytes()
    text = f"{sw} {sh} {dw} {dh} {seed} {fnv1a64(data):016x}"
    if len(data) <= SMALL:
        text += " " + data.hex()
    return text


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--check":
        print(line(*map(int, sys.argv[2:])))
    else:
        print(f"# cv2 {cv2.__version__}: see make_golden.py")
        for i, case in enumerate(CASES):
            print(line(*case, seed=i + 1))
