"""Bar chart of bench_model_tp.py results: seconds until every rank holds its tensors, per loader, for each mode (tp,
replicas) and case (cold, warm) that has rows (best of the runs); on cold panels the read-once ideal (model bytes /
the O_DIRECT ceiling, the mean of those measured in the run) as a line.

    python3 bench/plot_model_tp.py OUT.png JSON [JSON...]       # the JSONs' rows together (e.g. a cold and a warm run)
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


def main(dst, *srcs):
    docs = [json.load(open(src)) for src in srcs]
    meta = docs[0]["meta"]
    rows = [r for d in docs for r in d["results"]]
    nbytes = meta["model_bytes"]
    odirect = [r["GBps"] for r in rows if r["loader"].startswith("ceiling: O_DIRECT")]
    panels = [(m, c) for m in ("tp", "replicas") for c in ("cold", "warm")
              if any(r.get("mode") == m and r["case"] == c for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (mode, case) in zip(axes[0], panels):
        best = {}
        for r in rows:
            if r.get("mode") == mode and r["case"] == case and r.get("bytes_equal"):
                best[r["loader"]] = min(best.get(r["loader"], 1e9), r["seconds"])
        labels = list(best)
        ax.bar(range(len(labels)), [best[k] for k in labels],
               color=["tab:blue" if k.split(": ", 1)[1].startswith("ckptio") else "tab:gray" for k in labels])
        ax.set_xticks(range(len(labels)), [short(k) for k in labels], fontsize=7)
        ax.set_ylabel("seconds (lower is better)")
        ax.set_title(f"{mode}, {case}: {nbytes / 1e9:.1f} GB model, {meta['world']} x {meta['gpu']}", fontsize=9)
        if case == "cold" and odirect:
            ideal = nbytes / 1e9 / (sum(odirect) / len(odirect))
            ax.axhline(ideal, color="tab:red", linestyle="--", linewidth=1)
            ax.text(len(labels) - 0.5, ideal, f"read-once ideal {ideal:.1f} s", color="tab:red", fontsize=7,
                    ha="right", va="bottom")
        for x, k in enumerate(labels):
            ax.text(x, best[k], f"{best[k]:.2f}", ha="center", va="bottom", fontsize=7)
    fig.suptitle(f"{meta['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
