"""Chart of bench/probe_copy_destination.py runs: GB/s of each pass of host-to-device copies by the history
of the destination memory, copy engine against copy kernel.

    python3 bench/plot_copy_destination.py OUT.png JSONL [JSONL...]

Bar: median over the processes of one MODE, whisker: min..max, one bar per pass (first, second, third).
"""
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PASSES = ("first", "second", "third")
ORDER = ("cold-new", "new", "new-sleep", "tensors", "cold-tensors", "realloc", "new-kernel", "realloc-kernel")


def main():
    out, paths = sys.argv[1], sys.argv[2:]
    series = defaultdict(list)
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.startswith("{"):
                    r = json.loads(line)
                    for k in PASSES:
                        series[(r["mode"], k)].append(r[k])
    modes = [m for m in ORDER if (m, "first") in series] + sorted({m for m, _ in series} - set(ORDER))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(PASSES)
    for i, k in enumerate(PASSES):
        xs, meds, lo, hi = [], [], [], []
        for j, m in enumerate(modes):
            v = series[(m, k)]
            med = statistics.median(v)
            xs.append(j + (i - 1) * width)
            meds.append(med)
            lo.append(med - min(v))
            hi.append(max(v) - med)
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=f"{k} pass")
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels(modes, rotation=20)
    ax.set_ylim(44, 54.5)
    ax.set_ylabel("GB/s")
    ax.set_title("Host-to-device copies into 6 GiB by the memory's history (H200, probe_copy_destination.py)")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
