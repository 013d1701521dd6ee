"""``python -m riffle run FILE --processes N --process I --base-port P …``: one process of a
local cluster that ``riffle.run(..., processes=N)`` supervises (the arguments the ``riffle``
binary's processes get). A pipeline given as a dict reaches it in ``RIFFLE_PIPELINE_TEXT``.

SIGTERM from the supervisor stops it as it stops ``riffle run``: the open epochs finish."""

import argparse
import signal
import sys

from . import PipelineError, _native


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m riffle")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one process of a local cluster")
    run.add_argument("file")
    run.add_argument("--processes", type=int, required=True)
    run.add_argument("--process", type=int, required=True)
    run.add_argument("--base-port", type=int, required=True)
    run.add_argument("--workers", type=int)
    run.add_argument("--output")
    run.add_argument("--checkpoint-dir")
    run.add_argument("--checkpoint-url")
    args = parser.parse_args(argv)
    # The run's wait turns KeyboardInterrupt into a clean stop.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        summary = _native.run(
            args.file,
            None,
            args.workers,
            args.checkpoint_dir or args.checkpoint_url,
            args.output,
            args.processes,
            args.process,
            args.base_port,
        )
    except KeyboardInterrupt:
        return 0
    except (PipelineError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return int(summary["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
