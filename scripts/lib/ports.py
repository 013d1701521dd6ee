#!/usr/bin/env python3
"""Blocks of free TCP ports for one test run's services (scripts/services.sh).

    ports.py reserve DIR COUNT   # prints P: P..P+COUNT-1 are free now and reserved for DIR
    ports.py release DIR         # drops DIR's reservations

A port that is free now can be taken by another run between this check and its server's
bind (a JVM binds seconds after it starts), so a block is also reserved: a file in
$TMPDIR/riffle-ports, written under a lock, that other runs on this machine skip. A
reservation lasts while its DIR exists (a run killed before `release` leaves nothing
stale once its folder is gone).

Blocks lie in 11000-18999: below the ephemeral range, which clients' own ends draw from (a
server stopped and started again by a test finds its port free), and away from the scripts'
fixed defaults (9092, 19092..., 19300, 19379, 19381, 19432) used by demos and by hand, and
from the 20000+ that the tests pick for their own servers (tests/common/mod.rs).
"""

import fcntl
import os
import random
import socket
import sys

LOW, HIGH = 11000, 19000


def registry():
    d = os.path.join(os.environ.get("TMPDIR") or "/tmp", "riffle-ports")
    os.makedirs(d, exist_ok=True)
    try:
        # Shared by every user's runs, like /tmp itself.
        os.chmod(d, 0o1777)
    except PermissionError:
        pass
    return d


def locked(d):
    path = os.path.join(d, "lock")
    try:
        f = open(path, "a")
    except PermissionError:
        # Another user's lock file: a read-only descriptor takes the lock as well.
        f = open(path)
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def reservations(d):
    """(first, count, owner) of every live reservation; stale ones are removed."""
    live = []
    for name in os.listdir(d):
        if not name.startswith("block-"):
            continue
        path = os.path.join(d, name)
        try:
            first, count = (int(x) for x in name[len("block-"):].split("-"))
            owner = open(path).read().strip()
        except (ValueError, OSError):
            continue
        if owner and os.path.isdir(owner):
            live.append((first, count, owner))
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    return live


def free(port):
    # Bound on every address: fails when any listener (or a lingering connection) holds it.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def reserve(owner, count):
    d = registry()
    with locked(d):
        taken = reservations(d)
        starts = list(range(LOW, HIGH - count + 1, count))
        random.shuffle(starts)
        for first in starts:
            if any(first < f + c and f < first + count for f, c, _ in taken):
                continue
            if all(free(p) for p in range(first, first + count)):
                with open(os.path.join(d, f"block-{first}-{count}"), "w") as f:
                    f.write(owner + "\n")
                return first
    sys.exit(f"ports: no block of {count} free ports in {LOW}-{HIGH - 1}")


def release(owner):
    d = registry()
    with locked(d):
        for first, count, o in reservations(d):
            if o == owner:
                try:
                    os.unlink(os.path.join(d, f"block-{first}-{count}"))
                except OSError:
                    pass


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "reserve":
        print(reserve(os.path.realpath(args[1]), int(args[2])))
    elif len(args) == 2 and args[0] == "release":
        release(os.path.realpath(args[1]))
    else:
        sys.exit("usage: ports.py reserve DIR COUNT | release DIR")


if __name__ == "__main__":
    main()
