"""The campaign's table: faults by kind (landed, output stall) and sinks (lost, duplicated,
retracted), in markdown."""
import os
import statistics
import time


def spread(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "–"
    p99 = values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]
    return f"{statistics.median(values):.1f} / {p99:.1f} s"


def table(summary):
    lines = [f"Seed {summary['seed']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{os.cpu_count()} CPU cores: {len(summary['faults'])} faults, "
             f"{summary['input']} input records at {summary['rate']}/s over "
             f"{summary['minutes']:.0f} minutes.", "",
             "| fault | injected | landed | output stall p50 / p99 (sinks it hits) | "
             "no new output within 60 s | the service served again after (p50 / p99) |",
             "|---|---:|---:|---:|---:|---:|"]
    kinds = sorted({f["kind"] for f in summary["faults"]})
    for k in kinds:
        fs = [f for f in summary["faults"] if f["kind"] == k]
        stalls = [s for f in fs for s in f["stall"].values()]
        serving = [f.get("serving") for f in fs]
        lines.append(f"| {k} | {len(fs)} | {sum(f['landed'] for f in fs)} | {spread(stalls)} | "
                     f"{sum(1 for s in stalls if s is None)} | {spread(serving)} |")
    for kind, why in summary.get("left_out", {}).items():
        lines.append(f"| {kind} | left out: {why} | | | | |")
    lines += ["", "| sink | input | delivered | lost | duplicated | retracted | caught up | "
              "clean stop | restarts |", "|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for name, r in summary["sinks"].items():
        lines.append(f"| {r['kind']} | {r['expected']} | {r['got']} | {r['lost']} | "
                     f"{r['duplicated']} | {r['retracted']} | {'yes' if r['caught_up'] else 'NO'} "
                     f"| {'yes' if r['exited'] else 'NO (hang)'} | {r['restarts']} |")
    return "\n".join(lines)
