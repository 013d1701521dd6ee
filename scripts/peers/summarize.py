"""The PEER lines of scripts/peers/bench.sh -> a markdown table: per job and peer, items/s as
median (min..max) over the runs, p50 and p99 medians, and whether every run printed the same
`check=` (per job, across all peers).

    python summarize.py out/peers/<stamp>/peer_lines.txt
"""
import collections
import statistics
import sys

ORDER = ["ortonly", "ortonly-s2", "plain", "bytewax-w1", "bytewax-w2", "bytewax-p2w1",
         "pathway-t1", "pathway-t2"]

runs = collections.defaultdict(list)  # (job, peer) -> each run's fields
checks = collections.defaultdict(set)  # job -> every check printed
failed = []
for line in open(sys.argv[1]):
    if line.startswith("FAILED"):
        failed.append(line.strip())
    elif line.startswith("PEER "):
        _, name, job, *rest = line.split()
        kv = dict(p.split("=", 1) for p in rest if "=" in p)
        runs[(job, name)].append(kv)
        checks[job].add(kv.get("check"))


def median(rs, key):
    if not all(key in r for r in rs):
        return "–"
    return f"{statistics.median(float(r[key]) for r in rs):.2f}"


print("| job | peer | ORT threads | runs | items/s median (min..max) | p50 ms | p99 ms | check |")
print("|---|---|---|---|---|---|---|---|")
for job in ("classify", "detect", "ctr"):
    names = sorted({n for j, n in runs if j == job}, key=lambda n: (ORDER.index(n) if n in ORDER else 99, n))
    for name in names:
        rs = runs[(job, name)]
        ips = [float(r["items_per_s"]) for r in rs]
        same = "same" if len(checks[job]) == 1 else rs[0].get("check")
        print(f"| {job} | {name} | {rs[0].get('ort_threads', '?')} | {len(rs)} | "
              f"{statistics.median(ips):.1f} ({min(ips):.1f}..{max(ips):.1f}) | "
              f"{median(rs, 'p50_ms')} | {median(rs, 'p99_ms')} | {same} |")
for job, cs in checks.items():
    differs = "" if len(cs) == 1 else "  <-- DIFFERS"
    print(f"\n{job} check: {' / '.join(sorted(map(str, cs)))}{differs}")
for f in failed:
    print("\n" + f)
