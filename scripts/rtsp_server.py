#!/usr/bin/python3
"""A small RTSP server for tests and demos: serves MP4 files as live cameras.

    /usr/bin/python3 scripts/rtsp_server.py --port 8554 bikes-0=data/videos/live/bikes-0.mp4 ...

serves rtsp://127.0.0.1:8554/bikes-0 and so on, each in real time (paced by GStreamer's clock),
each client from the file's start, H.264 or H.265 by the file's codec (--codec). Prints
`ready <port>` on stdout once listening. To simulate one camera's outage, run one process per
camera (each on its own port) and kill and restart that one.

Needs GStreamer's RTSP server through PyGObject (the Debian packages python3-gi,
gir1.2-gst-rtsp-server-1.0, gstreamer1.0-plugins-base/good/bad: scripts/setup.sh installs
them), hence the system Python rather than whichever python3 comes first on PATH.
"""

import argparse
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--codec", choices=["h264", "h265"], default="h264")
    parser.add_argument("cameras", nargs="+", metavar="ID=FILE")
    args = parser.parse_args()
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    mounts = server.get_mount_points()
    for spec in args.cameras:
        camera, sep, path = spec.partition("=")
        if not sep or not camera or not path:
            parser.error(f"camera `{spec}` is not ID=FILE")
        factory = GstRtspServer.RTSPMediaFactory()
        # config-interval=-1 repeats SPS/PPS with every keyframe so a decoder can join anywhere.
        factory.set_launch(
            f'( filesrc location="{path}" ! qtdemux ! {args.codec}parse '
            f"! rtp{args.codec}pay name=pay0 pt=96 config-interval=-1 )"
        )
        mounts.add_factory(f"/{camera}", factory)
    if server.attach(None) == 0:
        print(f"rtsp_server: cannot listen on {args.address}:{args.port}", file=sys.stderr)
        return 1
    print(f"ready {args.port}", flush=True)
    GLib.MainLoop().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
