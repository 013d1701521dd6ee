#!/usr/bin/env bash
# The wheel where the system has no FFmpeg: installs target/wheels/riffle-*.whl (scripts/wheel.sh)
# into a fresh venv, then, in a mount namespace where every FFmpeg library of the system reads
# as an empty file, shows they are hidden (loading libavcodec fails there), streams the video
# camera pipeline (H.264 decoded by the FFmpeg inside the wheel: /proc/self/maps says which)
# and checks every frame came back. Needs root (a mount namespace) and scripts/media.sh's
# videos; scripts/python-tests.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
wheel=$(ls "$target"/wheels/riffle-*.whl)
venv="$target/wheel-venv"
rm -rf "$venv"
python3 -m venv "$venv"
PIP_ROOT_USER_ACTION=ignore "$venv/bin/pip" install --quiet "$wheel"
libs=/usr/lib/x86_64-linux-gnu
hidden=$(ls "$libs"/lib{avcodec,avformat,avutil,avfilter,avdevice,swscale,swresample,postproc}.so* 2>/dev/null || true)
empty=$(mktemp)
trap 'rm -f "$empty"' EXIT
# shellcheck disable=SC2016 # expanded by the inner shell
unshare --mount --propagation private bash -c '
  set -euo pipefail
  for f in $1; do mount --bind "$2" "$f"; done
  exec "$3" -' _ "$hidden" "$empty" "$venv/bin/python" <<'PY'
import ctypes
import sys

try:
    ctypes.CDLL("libavcodec.so.59")
    sys.exit("wheel-portable: the system's libavcodec still loads: nothing was hidden")
except OSError:
    pass

import riffle

rows, cameras, people = 0, set(), 0
with riffle.stream("pipelines/camera-video.yaml") as results:
    for batch in results:
        rows += batch.num_rows
        cameras.update(batch.column("camera_id").to_pylist())
        people += sum(1 for n in batch.column("detections_count").to_pylist() if n)
maps = open("/proc/self/maps").read()
ours = sorted({l.split()[-1].rsplit("/", 1)[-1] for l in maps.splitlines() if "riffle.libs/libavcodec" in l})
assert ours, "libavcodec was not loaded from the wheel's riffle.libs"
assert "/usr/lib/x86_64-linux-gnu/libavcodec" not in maps, "the system's libavcodec was loaded"
assert rows == 250 and len(cameras) == 4 and people > 0, (rows, cameras, people)
print(f"wheel-portable: ok: {rows} frames of {len(cameras)} cameras ({people} with a person), "
      f"decoded by {ours[0]} from the wheel, the system's FFmpeg hidden")
PY
