"""Bar chart of a bench_model_tp.py result: seconds until every rank holds its tensors, per loader, for each
mode (tp, replicas) and case (cold, warm; best of the runs), the read-once ideal (model bytes / O_DIRECT
ceiling of the same run) as a line on the cold panels.

    python3 bench/plot_model_tp.py bench/results/h100x2_2026-11-26_run2_bench_model_tp.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def short(label):
    label = label.split(": ", 1)[1]
    if "[read once]" in label:
        return "ckptio\nread once"
    if label.startswith("ckptio read once ["):
        return "ckptio read once\n" + label.split("[")[1].rstrip("]")
    if label.startswith("ckptio.load(dir) on every rank"):
        return "ckptio\nevery rank"
    if label.startswith("safetensors"):
        return "safetensors\nget_slice"
    if label.startswith("fastsafetensors"):
        return "fastsafetensors\n(process group)"
    return label


def main(src, dst):
    data = json.load(open(src))
    rows = data["results"]
    nbytes = data["meta"]["model_bytes"]
    modes = [m for m in ("tp", "replicas") if any(r.get("mode") == m for r in rows)]
    fig, axes = plt.subplots(len(modes), 2, figsize=(11, 3.8 * len(modes)), squeeze=False)
    # The ceiling rows come before each mode's cold rows, in order.
    ceilings = [r for r in rows if r["loader"].startswith("ceiling")]
    for i, mode in enumerate(modes):
        for j, case in enumerate(("cold", "warm")):
            ax = axes[i][j]
            best = {}
            for r in rows:
                if r.get("mode") == mode and r["case"] == case and r.get("bytes_equal"):
                    best[r["loader"]] = min(best.get(r["loader"], 1e9), r["seconds"])
            labels = list(best)
            ax.bar(range(len(labels)), [best[k] for k in labels],
                   color=["tab:blue" if k.split(": ", 1)[1].startswith("ckptio") else "tab:gray" for k in labels])
            ax.set_xticks(range(len(labels)), [short(k) for k in labels], fontsize=7)
            ax.set_ylabel("seconds (lower is better)")
            ax.set_title(f"{mode}, {case}: {nbytes / 1e9:.1f} GB model, {data['meta']['world']} x {data['meta']['gpu']}",
                         fontsize=9)
            if case == "cold" and i < len(ceilings):
                ideal = nbytes / 1e9 / ceilings[i]["GBps"]
                ax.axhline(ideal, color="tab:red", linestyle="--", linewidth=1)
                ax.text(len(labels) - 0.5, ideal, f"read-once ideal {ideal:.1f} s", color="tab:red", fontsize=7,
                        ha="right", va="bottom")
            for x, k in enumerate(labels):
                ax.text(x, best[k], f"{best[k]:.2f}", ha="center", va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
