"""Chart of bench/probe_column_slices.py's results: one rank's column slices to its GPU, GB/s by TP degree.

    python3 bench/plot_column_slices.py OUT.png RESULTS.jsonl
RESULTS: lines of probe_column_slices.py, each with a "build" field ("new" or "base") as .gpu scripts add it.
Bars: the mean over the measured ranks of each one's best time, per loader; row slices of the new build as a
reference line.
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {("base", "ckptio-2d"): "ckptio before (one copy per row, one driver lookup per row)",
          ("new", "ckptio-rows"): "ckptio, one copy per row (CKPTIO_GPU_COPY_2D=0)",
          ("new", "ckptio-2d"): "ckptio, one pitched copy per window",
          ("new", "safetensors"): "safetensors get_slice on the host, then .to(cuda)"}


def main():
    out, path = sys.argv[1], sys.argv[2]
    cols = defaultdict(list)
    rows = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        if "tp" not in r:
            continue
        key = (r.get("build", "new"), r["what"])
        (cols if r["by"] == "cols" else rows)[(key, r["tp"])].append(r["GBps_best"])
    tps = sorted({tp for _, tp in cols})
    series = [k for k in LABELS if any((k, tp) in cols for tp in tps)]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.8 / len(series)
    for i, k in enumerate(series):
        vals = [sum(cols[(k, tp)]) / len(cols[(k, tp)]) if cols[(k, tp)] else 0 for tp in tps]
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(tps))]
        bars = ax.bar(xs, vals, width, label=LABELS[k])
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ref = [sum(rows[(("new", "ckptio-2d"), tp)]) / max(1, len(rows[(("new", "ckptio-2d"), tp)])) for tp in tps]
    ax.plot(range(len(tps)), ref, "k--", marker="o", label="ckptio, row slices (for reference)")
    ax.set_xticks(range(len(tps)), [f"TP {tp}: columns [:, r*c:(r+1)*c]" for tp in tps])
    ax.set_ylabel("GB/s of slice bytes on the GPU")
    ax.set_title("One rank's column slices of a 14.21 GB bf16 model, page cache, H200")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
