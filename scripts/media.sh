#!/usr/bin/env bash
# Encodes the test and demo videos from the bundled frames (data/frames/bikes/0000..0249.jpg,
# 640x272 at 25 fps) into data/videos/ (git-ignored). Idempotent: a file already there is kept.
#
# - bikes-0.mp4 .. bikes-3.mp4: H.264, the 4 camera streams the images source makes with
#   `cameras: 4` (contiguous splits of the 250 frames: 0-62, 63-124, 125-187, 188-249, the k-th
#   starting at frame ceil(k*250/4)), losslessly (-qp 0) in the JPEGs' own full-range YUV 4:2:0
#   (yuvj420p), so the decoded frames are the JPEGs' pixels up to the YUV → RGB conversion and
#   detections match (~2.7 MB a file; -crf 12 gave 44 dB and moved borderline detections).
# - hevc/bikes-0.mp4: the first split in H.265 (proves HEVC decodes).
# - mkv/bikes-0.mkv, ts/bikes-0.ts: bikes-0.mp4 remuxed (other containers, same frames).
# - live/bikes-0.mp4 .. live/bikes-3.mp4: each split looped to 60 s, served by
#   scripts/rtsp_server.py as live cameras (one keyframe a second so a client joins fast).
# - hd/720p/bikes-K.mp4, hd/1080p/bikes-K.mp4: the same 4 splits upscaled (Lanczos) to
#   1280x720 and 1920x1080 and encoded as an IP camera does (H.264 High, yuv420p, a keyframe a
#   second, no B-frames): what real cameras send, for the HD rows of scripts/bench-cameras.sh
#   (decoding and colour conversion cost there, not the model).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
frames="$root/data/frames/bikes"
out="$root/data/videos"
command -v ffmpeg >/dev/null || {
  echo "media: the ffmpeg command is missing: apt-get install -y ffmpeg (or run scripts/setup.sh)" >&2
  exit 1
}
mkdir -p "$out/hevc" "$out/mkv" "$out/ts" "$out/live" "$out/hd/720p" "$out/hd/1080p"
total=$(ls "$frames"/*.jpg | wc -l)
cameras=4
ff() { ffmpeg -hide_banner -loglevel error -nostdin -y "$@"; }

# Writes $1 by running the rest with the output path last, through a temporary file so an
# interrupted run never leaves a truncated video behind.
make() {
  local dest="$1"; shift
  if [ -s "$dest" ]; then return; fi
  local part="${dest%.*}.part.${dest##*.}"
  "$@" "$part"
  mv "$part" "$dest"
  echo "media: wrote ${dest#"$root"/}"
}

for k in $(seq 0 $((cameras - 1))); do
  start=$(( (k * total + cameras - 1) / cameras ))
  end=$(( ((k + 1) * total + cameras - 1) / cameras ))
  n=$(( end - start ))
  input=(-framerate 25 -start_number "$start" -i "$frames/%04d.jpg" -frames:v "$n")
  make "$out/bikes-$k.mp4" ff "${input[@]}" \
    -c:v libx264 -preset medium -qp 0 -pix_fmt yuvj420p -g 25
  if [ "$k" = 0 ]; then
    make "$out/hevc/bikes-$k.mp4" ff "${input[@]}" \
      -c:v libx265 -preset fast -crf 12 -pix_fmt yuv420p -tag:v hvc1 -x265-params log-level=error
  fi
  loops=$(( 60 * 25 / n ))
  make "$out/live/bikes-$k.mp4" ff -stream_loop "$loops" "${input[@]:0:6}" \
    -frames:v $(( (loops + 1) * n )) -c:v libx264 -preset veryfast -crf 20 -pix_fmt yuv420p -g 25 -bf 0
  for size in 720:1280x720 1080:1920x1080; do
    make "$out/hd/${size%%:*}p/bikes-$k.mp4" ff "${input[@]}" -vf "scale=${size#*:}:flags=lanczos" \
      -c:v libx264 -preset veryfast -crf 20 -profile:v high -pix_fmt yuv420p -g 25 -bf 0
  done
done
make "$out/mkv/bikes-0.mkv" ff -i "$out/bikes-0.mp4" -c copy
make "$out/ts/bikes-0.ts" ff -i "$out/bikes-0.mp4" -c copy
echo "media: videos present in ${out#"$root"/}"
