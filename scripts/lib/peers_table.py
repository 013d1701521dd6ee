"""Joins the PEER lines of scripts/bench-peers.sh into one table: per job, Riffle against the
best Python peer and ONNX Runtime alone, each as median (min-max) over the rounds, ratios taken
per round (the runs of a round are side by side) and then their median and range."""
import collections
import statistics
import sys

TARGET = {"detect": 1.15, "classify": 1.15, "ctr": 3.0}
# ctr also has a latency target: Riffle's p99 (median over the rounds) at most this.
TARGET_P99_MS = {"ctr": 10.0}
LIMIT = "ortonly-s2"


def spread(values, digits):
    v = sorted(values)
    if not v:
        return "-"
    return f"{statistics.median(v):.{digits}f} ({v[0]:.{digits}f}–{v[-1]:.{digits}f})"


def fields(line):
    parts = line.split()
    kv = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
    return parts[1], parts[2], kv


runs = collections.defaultdict(dict)  # (job, round) -> name -> fields
failed = []
for raw in open(sys.argv[1]):
    rnd, line = raw.rstrip("\n").split(" ", 1)
    if line.startswith("FAILED"):
        failed.append(line)
        continue
    name, job, kv = fields(line)
    runs[(job, int(rnd))][name] = kv

jobs = [j for j in ("detect", "classify", "ctr") if any(k[0] == j for k in runs)]
print("| job | Riffle items/s | best Python peer items/s | Riffle ÷ best peer | target | ONNX Runtime alone (2 × 1 thread) | Riffle ÷ ORT alone | Riffle p50 / p99 ms | outputs (Riffle; peer) |")
print("|---|---:|---:|---:|---|---:|---:|---:|---|")
for job in jobs:
    rounds = sorted(r for j, r in runs if j == job)
    rate = lambda name, r: float(runs[(job, r)][name]["items_per_s"]) if name in runs[(job, r)] else None
    peers = sorted({n for r in rounds for n in runs[(job, r)] if not n.startswith("riffle") and n != LIMIT})
    riffle = next((n for r in rounds for n in runs[(job, r)] if n.startswith("riffle")), None)
    if riffle is None or not peers:
        continue
    # The best peer: highest median rate over the rounds.
    best = max(peers, key=lambda n: statistics.median([x for r in rounds if (x := rate(n, r)) is not None] or [0]))
    r_rates = [rate(riffle, r) for r in rounds if rate(riffle, r)]
    b_rates = [rate(best, r) for r in rounds if rate(best, r)]
    vs_peer = [rate(riffle, r) / rate(best, r) for r in rounds if rate(riffle, r) and rate(best, r)]
    limit = [rate(LIMIT, r) for r in rounds if rate(LIMIT, r)]
    vs_limit = [rate(riffle, r) / rate(LIMIT, r) for r in rounds if rate(riffle, r) and rate(LIMIT, r)]
    p50 = [float(runs[(job, r)][riffle]["p50_ms"]) for r in rounds if riffle in runs[(job, r)]]
    p99 = [float(runs[(job, r)][riffle]["p99_ms"]) for r in rounds if riffle in runs[(job, r)]]
    checks = {runs[(job, r)][riffle].get("check") for r in rounds if riffle in runs[(job, r)]}
    peer_checks = {runs[(job, r)][best].get("check") for r in rounds if best in runs[(job, r)]}
    ok = bool(vs_peer) and statistics.median(vs_peer) >= TARGET[job]
    target = f"≥ {TARGET[job]}×"
    if job in TARGET_P99_MS:
        ok = ok and bool(p99) and statistics.median(p99) <= TARGET_P99_MS[job]
        target += f", p99 ≤ {TARGET_P99_MS[job]:g} ms"
    met = "met" if ok else "**not met**"
    print(f"| {job} | {spread(r_rates, 1)} | {spread(b_rates, 1)} ({best}) | {spread(vs_peer, 2)} | {target} ({met}) "
          f"| {spread(limit, 1)} | {spread(vs_limit, 2)} | {spread(p50, 1)} / {spread(p99, 1)} "
          f"| {', '.join(sorted(map(str, checks)))}; {', '.join(sorted(map(str, peer_checks)))} |")
print()
print(f"Rounds: {max((r for _, r in runs), default=0)}. Peers run: {', '.join(sorted({n for v in runs.values() for n in v}))}.")
for f in failed:
    print(f"\nFailed: `{f}`")
