"""Chart of copy timelines written by bench/probe_copy_timeline.py (CSV: start_us, dur_us, bytes, stream).

    python3 bench/plot_copy_timeline.py PNG LABEL=CSV [LABEL=CSV ...]

Left: GB the copies had moved by each moment of the load's first 40 ms (a copy's bytes counted when it ends);
right: GB/s of the copies ending in each 5 ms of the whole load.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as fh:
        return sorted((float(r["start_us"]) + float(r["dur_us"]), int(r["bytes"])) for r in csv.DictReader(fh))


def main():
    png, series = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    fig, (early, whole) = plt.subplots(1, 2, figsize=(12, 4.2))
    for label, path in series:
        ends = load(path)
        xs, ys, moved = [0.0], [0.0], 0
        for end_us, b in ends:
            if end_us > 40000:
                break
            moved += b
            xs.append(end_us / 1e3)
            ys.append(moved / 1e9)
        early.plot(xs, ys, label=label)
        bins = {}
        for end_us, b in ends:
            bins[int(end_us // 5000)] = bins.get(int(end_us // 5000), 0) + b
        ks = range(max(bins) + 1)
        whole.plot([k * 5 + 2.5 for k in ks], [bins.get(k, 0) / 5e6 for k in ks], label=label)
    early.set_xlabel("ms since the first copy started")
    early.set_ylabel("GB copied")
    early.set_title("the first 40 ms")
    early.grid(alpha=0.3)
    early.legend(fontsize=8)
    whole.set_xlabel("ms since the first copy started")
    whole.set_ylabel("GB/s (copies ending in each 5 ms)")
    whole.set_title("the whole load")
    whole.set_ylim(0, 60)
    whole.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
