"""Joins the PEER lines of scripts/bench-peers.sh into one table: per job, Riffle against the
best Python peer and ONNX Runtime alone, each as median (min-max) over the rounds, ratios taken
per round (the runs of a round are side by side) and then their median and range.

A ratio is printed only between runs that did the same work: every run of a job (Riffle's, each
peer's, ONNX Runtime alone's, in every round) must print the same `check=`. Where the peers
disagree among themselves the ratio and the target say "peers' outputs differ"; where Riffle
disagrees with them (or a run printed no check) they say "outputs differ" (or "outputs not
checked"), and the target is never "met".

    python3 scripts/lib/peers_table.py LINES   # LINES: "<round> PEER <name> <job> k=v ..." or
                                               # "<round> FAILED ..." per line
"""
import collections
import statistics
import sys

# The team's targets (docs/benchmarks.md): the image jobs ahead of every peer (both are bound by ONNX Runtime
# on 2 cores; the old 1.15× is retired there), ctr at 3× the best peer.
TARGET = {"detect": 1.0, "classify": 1.0, "ctr": 3.0}
# ctr also has a latency target: Riffle's p99 (median over the rounds) at most this.
TARGET_P99_MS = {"ctr": 10.0}
LIMIT = "ortonly-s2"
JOBS = ("detect", "classify", "ctr")


def spread(values, digits):
    v = sorted(values)
    if not v:
        return "-"
    return f"{statistics.median(v):.{digits}f} ({v[0]:.{digits}f}–{v[-1]:.{digits}f})"


def fields(line):
    parts = line.split()
    if len(parts) < 3 or parts[0] != "PEER":
        raise ValueError(f"expected `PEER <name> <job> k=v ...`, got {line!r}")
    kv = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
    return parts[1], parts[2], kv


def read(path):
    """(runs, failed): runs[(job, round)][name] = that run's fields; failed: the FAILED lines."""
    runs = collections.defaultdict(dict)
    failed = []
    with open(path) as f:
        for number, raw in enumerate(f, 1):
            raw = raw.rstrip("\n")
            if not raw.strip():
                continue
            rnd, _, line = raw.partition(" ")
            if line.startswith("FAILED"):
                failed.append(line)
                continue
            try:
                name, job, kv = fields(line)
                runs[(job, int(rnd))][name] = kv
            except ValueError as e:
                sys.exit(f"{path}:{number}: {e}")
    return runs, failed


def outputs(job, runs, rounds, riffle, others):
    """(verdict, cell): verdict is None when every run of the job printed the same check (the
    ratios stand), else what to print in their place; cell lists the checks, by who printed them."""
    checks = collections.defaultdict(set)  # check -> names that printed it
    per_name = collections.defaultdict(set)
    for r in rounds:
        for name in [riffle] + others:
            if name in runs[(job, r)]:
                check = runs[(job, r)][name].get("check")
                checks[check].add(name)
                per_name[name].add(check)
    peer_checks = set().union(*(per_name[n] for n in others)) if others else set()
    if None in checks:
        verdict = "outputs not checked"
    elif len(peer_checks) != 1:
        verdict = "peers' outputs differ"
    elif per_name[riffle] != peer_checks:
        verdict = "outputs differ"
    else:
        verdict = None
    if verdict is None:
        cell = f"{next(iter(peer_checks))} (all agree)"
    else:
        def who(names):
            names = sorted(names)
            return ", ".join(["Riffle"] * (riffle in names) + [n for n in names if n != riffle])
        cell = "; ".join(f"{who(names)}: {check if check is not None else 'no check'}"
                         for check, names in sorted(checks.items(), key=lambda kv: (riffle not in kv[1], str(kv[0]))))
    return verdict, cell


def main(path):
    runs, failed = read(path)
    jobs = [j for j in JOBS if any(k[0] == j for k in runs)]
    print("| job | Riffle items/s | best Python peer items/s | Riffle ÷ best peer | target | ONNX Runtime alone (2 × 1 thread) | Riffle ÷ ORT alone | Riffle p50 / p99 ms | outputs |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---|")
    for job in jobs:
        rounds = sorted(r for j, r in runs if j == job)

        def rate(name, r):
            return float(runs[(job, r)][name]["items_per_s"]) if name in runs[(job, r)] else None

        names = sorted({n for r in rounds for n in runs[(job, r)]})
        peers = [n for n in names if not n.startswith("riffle") and n != LIMIT]
        # One row per Riffle configuration (riffle-w2: ONNX Runtime; riffle-dense-w2: the
        # dense executor), each against the same peers.
        riffles = sorted((n for n in names if n.startswith("riffle")), key=lambda n: (n != "riffle-w2", n))
        for riffle in riffles if peers else []:
            row(job, rounds, runs, rate, names, peers, riffle)
    print()
    print(f"Rounds: {max((r for _, r in runs), default=0)}. Peers run: {', '.join(sorted({n for v in runs.values() for n in v}))}.")
    for f in failed:
        print(f"\nFailed: `{f}`")


def row(job, rounds, runs, rate, names, peers, riffle):
    """The table's row of one Riffle configuration on one job."""
    # The best peer: highest median rate over the rounds.
    best = max(peers, key=lambda n: statistics.median([x for r in rounds if (x := rate(n, r)) is not None] or [0]))
    r_rates = [rate(riffle, r) for r in rounds if rate(riffle, r)]
    b_rates = [rate(best, r) for r in rounds if rate(best, r)]
    vs_peer = [rate(riffle, r) / rate(best, r) for r in rounds if rate(riffle, r) and rate(best, r)]
    limit = [rate(LIMIT, r) for r in rounds if rate(LIMIT, r)]
    vs_limit = [rate(riffle, r) / rate(LIMIT, r) for r in rounds if rate(riffle, r) and rate(LIMIT, r)]
    p50 = [float(runs[(job, r)][riffle]["p50_ms"]) for r in rounds if riffle in runs[(job, r)]]
    p99 = [float(runs[(job, r)][riffle]["p99_ms"]) for r in rounds if riffle in runs[(job, r)]]
    # Every system that ran the job, ONNX Runtime alone included, must have done the same work.
    verdict, cell = outputs(job, runs, rounds, riffle, [n for n in names if n != riffle])
    target = f"≥ {TARGET[job]}×"
    if job in TARGET_P99_MS:
        target += f", p99 ≤ {TARGET_P99_MS[job]:g} ms"
    if verdict is None:
        ok = bool(vs_peer) and statistics.median(vs_peer) >= TARGET[job]
        if job in TARGET_P99_MS:
            ok = ok and bool(p99) and statistics.median(p99) <= TARGET_P99_MS[job]
        status = "met" if ok else "**not met**"
        ratio_peer, ratio_limit = spread(vs_peer, 2), spread(vs_limit, 2)
    else:
        status = ratio_peer = ratio_limit = f"**{verdict}**"
    # riffle-dense-w2 -> "ctr, dense executor"
    label = job if riffle == "riffle-w2" else f"{job}, {riffle.split('-')[1]} executor"
    print(f"| {label} | {spread(r_rates, 1)} | {spread(b_rates, 1)} ({best}) | {ratio_peer} | {target} ({status}) "
          f"| {spread(limit, 1)} | {ratio_limit} | {spread(p50, 1)} / {spread(p99, 1)} | {cell} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: peers_table.py LINES")
    main(sys.argv[1])
