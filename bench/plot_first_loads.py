"""Chart of bench_model_gpu.py FIRST=1 runs: each loader's first and second load in a fresh process.

    python3 bench/plot_first_loads.py OUT.png LABEL=JSON[,JSON...] [LABEL=JSON...]

Each LABEL names a build or a run; its JSON files are rounds of the same run, drawn as the range of the rounds
(bar: mean, whisker: min..max). Bars are grouped by case (warm, tmpfs) and load (first, second); one colour per
loader and label. The pinned host-to-device ceiling of the first JSON is drawn as a line, and 90% of it.

A JSON of the benchmark's default mode (every loader REPS times in one process, its memory given back with
torch.cuda.empty_cache() after each load) adds a third group per case, "after empty_cache", for ckptio's plain and
out= loads and InstantTensor (its default backend only on tmpfs: on disk it is O_DIRECT).
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


# The default mode's loaders drawn beside the fresh processes' ones.
DEFAULT_MODE_LOADERS = ("ckptio.load(dir) [default]", "ckptio.load(dir, out=existing tensors)",
                        "instanttensor 0.2.2 BUFFERED", "instanttensor 0.2.2 default backend")


def load_of(r):
    """Which group a row belongs to: first, second, after empty_cache, or None (not drawn)."""
    note = r.get("note", "")
    if "fresh process" in note:
        return "first"
    if "same process" in note:
        return "second"
    if note[:1] == "r" and note[1:].isdigit() and r.get("loader") in DEFAULT_MODE_LOADERS:
        if r["loader"] == "instanttensor 0.2.2 default backend" and r.get("case") != "tmpfs":
            return None
        return "after empty_cache"
    return None


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
            load = load_of(r)
            if load is None:
                continue
            name = r["loader"] if r["loader"].startswith("instanttensor") else f"{r['loader']} ({build})"
            name = name.replace("default backend", "default (MMAP on tmpfs)")
            if name not in order:
                order.append(name)
            series[(name, r["case"], load)].append(r["GBps"])
    loads = [x for x in ("first", "second", "after empty_cache") if any(k[2] == x for k in series)]
    groups = [(c, l) for c in ("warm", "tmpfs") for l in loads]
    fig, ax = plt.subplots(figsize=(6 + 2 * len(groups), 5))
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
        ax.axhline(0.9 * ceiling, color="grey", linestyle=":", linewidth=1, label=f"90% of it {0.9 * ceiling:.1f}")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{c}: {l} load" if l != "after empty_cache" else f"{c}: a load after empty_cache"
                        for c, l in groups])
    ax.set_ylabel("GB/s (10^9 bytes of tensors / s)")
    ax.set_title("One GPU, 14.2 GB model: a fresh process's first load, its second, and loads after empty_cache")
    top = max([max(v) for v in series.values()] + [ceiling or 0])
    ax.set_ylim(0, top * 1.4)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
