#!/usr/bin/env bash
# How long a camera added while running takes to its first result (issue #30 item 6): runs the
# release `riffle` with the person detector + tracker over an open video source and the view's
# control API, then, round after round, POSTs a camera to /api/cameras and times until its first
# result row is in the results file (then DELETEs it). Rows: a file camera played in real time,
# an RTSP camera (scripts/rtsp_server.py) in one process, and an RTSP camera that lands on
# process 1 of 2 (it learns of the camera with its next report to process 0's view, every
# 0.5 s). Writes docs/benchmarks/camera-add.md. Argument: rounds (default 5).
# BENCH_NOTE="…" adds a line under the header. Needs scripts/setup.sh and scripts/media.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-doc.sh
rounds="${1:-5}"
for f in models/ssdlite_person.onnx data/videos/live/bikes-0.mp4; do
  [ -f "$f" ] || { echo "bench-camera-add: $f is missing (scripts/setup.sh, scripts/media.sh)" >&2; exit 1; }
done
# RIFFLE_BIN=path runs another build (e.g. a debug one, to try the script quickly).
if [ -z "${RIFFLE_BIN:-}" ]; then
  cargo build --quiet --release --bin riffle
fi
bin="${RIFFLE_BIN:-$(pwd)/${CARGO_TARGET_DIR:-target}/release/riffle}"
table=$(mktemp)
trap 'rm -f "$table"' EXIT
python3 - "$bin" "$rounds" >"$table" <<'PY'
import json, os, socket, statistics, subprocess, sys, tempfile, time, urllib.request

riffle, rounds = sys.argv[1], int(sys.argv[2])
repo = os.getcwd()
clip = lambda k: f"{repo}/data/videos/live/bikes-{k % 4}.mp4"

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def request(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def rtsp_server(k):
    port = free_port()
    p = subprocess.Popen(["/usr/bin/python3", f"{repo}/scripts/rtsp_server.py", "--port", str(port),
                          f"cam{k}={clip(k)}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if not p.stdout.readline().startswith("ready"):
        sys.exit("bench-camera-add: scripts/rtsp_server.py did not start")
    return p, f"rtsp://127.0.0.1:{port}/cam{k}"

PIPELINE = """name: camera-add
source:
  video:
    cameras: [{{ id: base, uri: "{base}", realtime: true, loop: true }}]
    stay_open: true
    batch_size: 4
stages:
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: "{repo}/models/ssdlite_person.onnx"
      inputs: {{ "image_tensor:0": tensor }}
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: 4, max_delay_ms: 10 }}
  - detections: {{ boxes: boxes, scores: scores, classes: classes, box_format: yxyx_normalized, score_threshold: 0.3, keep_classes: [1] }}
  - exchange: {{ key: camera_id }}
  - track: {{}}
  - select: {{ columns: [camera_id, frame] }}
runtime: {{ workers: 1 }}
sink:
  jsonl: {{ path: "{out}" }}
"""

def first_result(out, camera, since, deadline=30.0):
    """Seconds from `since` until a row of `camera` is in `out` (read as it grows)."""
    needle = f'"camera_id":"{camera}"'.encode()
    with open(out, "rb") as f:
        f.seek(0, os.SEEK_END)
        buf = b""
        while time.monotonic() - since < deadline:
            chunk = f.read()
            if chunk:
                buf = (buf + chunk)[-65536:]
                if needle in buf:
                    return time.monotonic() - since
            else:
                time.sleep(0.002)
    raise SystemExit(f"bench-camera-add: no result of {camera} within {deadline} s")

def scenario(processes, uri_for):
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/out.jsonl"
        open(out, "w").close()
        path = f"{tmp}/p.yaml"
        with open(path, "w") as f:
            f.write(PIPELINE.format(base=clip(0), repo=repo, out=out))
        ui = free_port()
        args = [riffle, "run", "-q", path, "--ui", f"127.0.0.1:{ui}"]
        if processes > 1:
            args += ["--processes", str(processes), "--base-port", str(free_port() % 20000 + 30000)]
        run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, RUST_LOG="error"))
        try:
            first_result(out, "base", time.monotonic(), deadline=120)
            times = []
            for r in range(rounds):
                uri, cleanup = uri_for(r)
                camera = f"add-{r}"
                since = time.monotonic()
                status, body = request("POST", f"http://127.0.0.1:{ui}/api/cameras",
                                       {"id": camera, "uri": uri, **({"realtime": True} if uri.startswith("/") else {})})
                if status != 201:
                    raise SystemExit(f"bench-camera-add: POST answered {status}: {body}")
                if processes > 1 and body.get("worker") != 1:
                    raise SystemExit(f"bench-camera-add: expected the camera on worker 1: {body}")
                times.append(first_result(out, camera, since) * 1000)
                request("DELETE", f"http://127.0.0.1:{ui}/api/cameras/{camera}")
                cleanup()
                time.sleep(1)
            return times
        finally:
            run.terminate()
            run.wait(timeout=60)

def file_camera(r):
    return clip(r + 1), lambda: None

def rtsp_camera(r):
    server, uri = rtsp_server(r + 1)
    return uri, lambda: (server.kill(), server.wait())

rows = [
    ("file camera (realtime), 1 process", scenario(1, file_camera)),
    ("RTSP camera, 1 process", scenario(1, rtsp_camera)),
    ("RTSP camera on process 1 of 2", scenario(2, rtsp_camera)),
]
print(f"### POST /api/cameras → the camera's first result row written ({rounds} rounds; median (min–max))")
print()
print("| camera | ms |")
print("|---|---|")
for name, t in rows:
    print(f"| {name} | {statistics.median(t):.0f} ({min(t):.0f}–{max(t):.0f}) |")
PY
out=docs/benchmarks/camera-add.md
description=$(cat <<'TEXT'
A running pipeline (the SSD-Lite person detector → tracker, 1 worker per process, results to a
JSONL file, one camera already playing in real time) is sent `POST /api/cameras` for a new
camera; the time is taken from the request until the new camera's first result row is in the
results file, i.e. placement, the camera's thread starting, opening the file or the RTSP
session (DESCRIBE/SETUP/PLAY), decoding the first frame, the model and the tracker, and the
epoch's commit to the sink. The camera is then removed and the next round adds another. On
process 1 of 2, the camera set reaches that process with its next report to process 0's view
(every 0.5 s).
TEXT
)
bench_doc "$out" "Adding a camera while running" "scripts/bench-camera-add.sh $rounds" "$description" "$table"
echo "bench-camera-add: wrote $out"
cat "$table"
