"""Chart of bench/probe_fresh_memory.py runs: GB/s of each way of getting a load's destinations, for a
process's first load and its later loads.

    python3 bench/plot_fresh_memory.py OUT.png LOG [LOG...]

GB/s is the model's bytes over the whole load (opening, allocating, touching and reading: the row's
total_ms); bar: median of the rows, whisker: min..max, the row count under each bar.
"""
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows_of(paths):
    for p in paths:
        with open(p) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
        nbytes = next(r["load"]["bytes"] for r in rows if "load" in r)
        for r in rows:
            first = r.get("round") == "first" or r["way"] == "first"  # "first": the probe's earliest log format
            way = "fresh" if r["way"] == "first" else r["way"]
            total_ms = r.get("total_ms", r.get("load", {}).get("total_ms"))
            yield ("first load" if first else "later loads"), way, nbytes / total_ms / 1e6


def main():
    out, logs = sys.argv[1], sys.argv[2:]
    series = defaultdict(list)
    for phase, way, gbps in rows_of(logs):
        series[(phase, way)].append(gbps)
    phases = ["first load", "later loads"]
    ways = sorted({w for _, w in series}, key=lambda w: (w != "reuse", w != "fresh", w))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(phases)
    for i, phase in enumerate(phases):
        xs, meds, lo, hi, counts = [], [], [], [], []
        for j, way in enumerate(ways):
            v = series.get((phase, way))
            if not v:
                continue
            m = statistics.median(v)
            xs.append(j + (i - (len(phases) - 1) / 2) * width)
            meds.append(m)
            lo.append(m - min(v))
            hi.append(max(v) - m)
            counts.append(len(v))
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=phase)
        for x, m, n in zip(xs, meds, counts):
            ax.text(x, 40.3, str(n), ha="center", fontsize=7)
    ax.set_xticks(range(len(ways)))
    ax.set_xticklabels(ways, rotation=20)
    ax.set_ylim(40, 53)
    ax.set_ylabel("GB/s over the whole load")
    ax.set_title("A 14.2 GB load onto one H200 by how its destinations were obtained (probe_fresh_memory.py)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
