"""Chart of bench_model_gpu.py FIRST=1 runs: each loader's first and second load in a fresh process.

    python3 bench/plot_first_loads.py OUT.png LABEL=JSON[,JSON...] [LABEL=JSON...]

Each LABEL names a build (e.g. new, base); its JSON files are rounds of the same run, drawn as the
range of the rounds (bar: mean, whisker: min..max). Bars are grouped by case (warm, tmpfs) and load
(first, second); one colour per loader and build. The pinned host-to-device ceiling of the first JSON
is drawn as a line.
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows_of(paths):
    for p in paths:
        with open(p) as f:
            yield from json.load(f)["results"]


def main():
    out, specs = sys.argv[1], sys.argv[2:]
    series = defaultdict(list)  # (loader label, case, load) -> GB/s over rounds
    order = []
    ceiling = None
    for spec in specs:
        build, paths = spec.split("=", 1)
        for r in rows_of(paths.split(",")):
            if r.get("loader", "").startswith("ceiling: pinned") and ceiling is None:
                ceiling = r["GBps"]
            if "fresh process" not in r.get("note", "") and "same process" not in r.get("note", ""):
                continue
            name = r["loader"] if r["loader"].startswith("instanttensor") else f"{r['loader']} ({build})"
            name = name.replace("default backend", "default (MMAP on tmpfs)")
            if name not in order:
                order.append(name)
            load = "first" if "fresh process" in r["note"] else "second"
            series[(name, r["case"], load)].append(r["GBps"])
    groups = [(c, l) for c in ("warm", "tmpfs") for l in ("first", "second")]
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / max(1, len(order))
    for i, name in enumerate(order):
        xs, means, lo, hi = [], [], [], []
        for g, (case, load) in enumerate(groups):
            v = series.get((name, case, load))
            if not v:
                continue
            m = sum(v) / len(v)
            xs.append(g + (i - (len(order) - 1) / 2) * width)
            means.append(m)
            lo.append(m - min(v))
            hi.append(max(v) - m)
        ax.bar(xs, means, width, yerr=[lo, hi], capsize=3, label=name)
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1, label=f"pinned host-to-device {ceiling:.1f}")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{c}: {l} load" for c, l in groups])
    ax.set_ylabel("GB/s (10^9 bytes of tensors / s)")
    ax.set_title("One GPU, 14.2 GB model: the first load in a fresh process and the second")
    top = max([max(v) for v in series.values()] + [ceiling or 0])
    ax.set_ylim(0, top * 1.4)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
