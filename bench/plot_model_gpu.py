"""Bar chart of bench_model_gpu.py results: GB/s per loader in each case (best of the runs), ceilings as lines.

    python3 bench/plot_model_gpu.py OUT.png JSON [JSON...]      # the JSONs' rows together (e.g. cold and warm runs)
Rows of a process's first or second load (FIRST=1) are left out: bench/plot_first_loads.py draws those.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SHORT = {
    "ckptio.load(dir) [default]": "ckptio",
    "ckptio.load(dir, out=existing tensors)": "ckptio (out=)",
    "instanttensor 0.2.2 default backend": "InstantTensor",
    "instanttensor 0.2.2 BUFFERED": "InstantTensor\nBUFFERED",
    "fastsafetensors 0.5.0 (1 GPU, nogds)": "fastsafetensors",
    "runai-model-streamer 0.16.1 (+ .to(cuda))": "Run:ai streamer",
    "safetensors.torch.load_file(device=cuda)": "safetensors",
}


def main(dst, *srcs):
    docs = [json.load(open(src)) for src in srcs]
    data = docs[0]
    rows = [r for d in docs for r in d["results"] if "GBps" in r and "process" not in r.get("note", "")]
    cases = [c for c in ("cold", "warm", "tmpfs") if any(r["case"] == c for r in rows)]
    h2d = max((r["GBps"] for r in rows if "host-to-device" in r["loader"]), default=None)
    rows = [r for r in rows if r["case"] != "-"]
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4.2), sharey=False)
    for ax, case in zip(axes, cases):
        best = {}
        for r in rows:
            if r["case"] == case and r["loader"] in SHORT and r.get("bytes_equal"):
                best[SHORT[r["loader"]]] = max(best.get(SHORT[r["loader"]], 0), r["GBps"])
        names = [n for n in SHORT.values() if n in best]
        colors = ["tab:blue" if n.startswith("ckptio") else "tab:gray" for n in names]
        ax.bar(range(len(names)), [best[n] for n in names], color=colors)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        for i, n in enumerate(names):
            ax.text(i, best[n], f"{best[n]:.1f}", ha="center", va="bottom", fontsize=7)
        ceilings = {(r["loader"], r.get("note", "")): r for r in rows
                    if r["case"] == case and r["loader"].startswith("ceiling")}
        for (label, note), c in ceilings.items():
            ax.axhline(c["GBps"], color="tab:red", linestyle="--", linewidth=0.8)
            ax.text(len(names) - 0.5, c["GBps"], label.replace("ceiling: ", "") + (" " + note if note else ""),
                    color="tab:red", fontsize=7, ha="right", va="bottom")
        if h2d and case != "cold":
            ax.axhline(h2d, color="tab:green", linestyle=":", linewidth=0.8)
            ax.text(len(names) - 0.5, h2d, "pinned host-to-device", color="tab:green", fontsize=7, ha="right",
                    va="bottom")
        ax.set_title(f"{case}", fontsize=10)
        ax.set_ylabel("GB/s (best of the runs)")
    m = data["meta"]
    fig.suptitle(f"{m['model_bytes'] / 1e9:.1f} GB HF model ({m['shards']} shards) to one {m['gpu']}, {m['date']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
