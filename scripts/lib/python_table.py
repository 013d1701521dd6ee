"""The table of scripts/bench-python.sh from its raw lines (`ROUND PEER …`, `ROUND CAMERA …`,
`ROUND FAILED …`): medians with ranges, and ratios taken within each round, printed only where
the sides' checks agree in every round."""

import statistics
import sys
from collections import defaultdict


def fields(words):
    return dict(w.split("=", 1) for w in words if "=" in w)


def parse(path):
    runs = defaultdict(dict)  # round -> side -> fields
    failed = []
    for line in open(path):
        words = line.split()
        if len(words) < 3:
            continue
        r, kind = words[0], words[1]
        if kind == "PEER":
            name, job = words[2], words[3]
            side = "bytewax" if name.startswith("bytewax") else job  # detect | detect-py
            runs[r][side] = fields(words[4:])
        elif kind == "CAMERA":
            runs[r]["camera-" + words[2]] = fields(words[3:])
        else:
            failed.append(" ".join(words[1:]))
    return runs, failed


def spread(values, digits=1):
    if not values:
        return "—"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def compare(runs, a, b, key, invert=False, digits=1, extra=None):
    """A row: a's and b's `key` (median, range) and b ÷ a per round (a ÷ b with `invert`)."""
    rounds = [r for r in runs.values() if a in r and b in r]
    if not rounds:
        return None
    av = [float(r[a][key]) for r in rounds]
    bv = [float(r[b][key]) for r in rounds]
    same = all(r[a].get("check") == r[b].get("check") and r[a].get("check") not in (None, "none") for r in rounds)
    ratios = [(x / y) if invert else (y / x) for x, y in zip(av, bv)]
    ratio = spread(ratios, 2) if same else "outputs differ"
    checks = {r[a].get("check") for r in rounds} | {r[b].get("check") for r in rounds}
    return av, bv, ratio, ", ".join(sorted(c for c in checks if c)), len(rounds)


def main():
    runs, failed = parse(sys.argv[1])
    print("| comparison | side A | side B | A | B | ratio | rounds | outputs (checks) |")
    print("|---|---|---|---|---|---|---|---|")
    row = compare(runs, "detect", "detect-py", "items_per_s")
    if row:
        av, bv, ratio, checks, n = row
        print(f"| Python stage vs Rust stage: items/s (B ÷ A) | Rust `detections` + `select` | `python:` (NumPy) | "
              f"{spread(av)} | {spread(bv)} | {ratio} | {n} | {checks} |")
    row = compare(runs, "detect", "detect-py", "post_p50_ms", digits=3)
    if row:
        av, bv, ratio, checks, n = row
        print(f"| Python stage vs Rust stage: post-processing p50 ms per batch (B ÷ A) | Rust | Python | "
              f"{spread(av, 3)} | {spread(bv, 3)} | {ratio} | {n} | {checks} |")
    row = compare(runs, "bytewax", "detect-py", "items_per_s")
    if row:
        av, bv, ratio, checks, n = row
        print(f"| Same Python post-processing: items/s (B ÷ A) | Bytewax (2 workers) | Riffle + `python:` | "
              f"{spread(av)} | {spread(bv)} | {ratio} | {n} | {checks} |")
    else:
        print("| Same Python post-processing | Bytewax | Riffle + `python:` | — | — | not run (no peers' venv) | 0 | |")
    row = compare(runs, "camera-cli", "camera-python", "seconds", invert=True, digits=2)
    if row:
        av, bv, ratio, checks, n = row
        print(f"| Camera job from Python vs the CLI: seconds, start to exit (speed ratio A ÷ B; target ≥ 0.95) | "
              f"`riffle run` | `riffle.run()` | {spread(av, 2)} | {spread(bv, 2)} | {ratio} | {n} | {checks} |")
    if failed:
        print()
        print("Failed runs: " + "; ".join(failed))


main()
