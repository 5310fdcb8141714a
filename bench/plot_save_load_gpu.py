"""Bar chart of a bench_save_load_gpu.py result: GB/s of each saver and loader (save, cold load, warm load), the raw
ceilings of the same run as lines.

    python3 bench/plot_save_load_gpu.py OUT.png JSON
JSON: {"meta": ..., "results": {...}} as the benchmark writes it, or its "results" object alone.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = {"torch": "torch", "torch_mmap": "torch\nmmap", "safetensors": "safe-\ntensors", "dcp_t8": "torch\nDCP",
         "ckptio_st": "ckptio\nC API", "ckptio_py_st": "ckptio\nPython", "ckptio_py_torch": "ckptio\n.pt"}
# each panel's ceiling: the best of these raw measurements of the same run
PANELS = [("save", "save (durable)", (("ceil_odirect_write_4t", "ceil_odirect_write_16t"), "O_DIRECT write")),
          ("load_cold", "load to the GPU, cold", (("ceil_odirect_read_4t", "ceil_odirect_read_16t",
                                                    "ceil_buffered_read_cold_16t"), "raw read")),
          ("load_warm", "load to the GPU, page cache", (("ceil_h2d_pinned",), "pinned host-to-device"))]


def main(dst, src):
    doc = json.load(open(src))
    res = doc.get("results", doc)
    meta = doc.get("meta", {})
    names = [n for n in NAMES if f"{n}_save_GBps" in res]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, title, (ceil, ceil_label)) in zip(axes, PANELS):
        vals = [res[f"{n}_{key}_GBps"] for n in names]
        ax.bar(range(len(names)), vals, color=["tab:blue" if n.startswith("ckptio") else "tab:gray" for n in names])
        ax.set_xticks(range(len(names)), [NAMES[n] for n in names], fontsize=8)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.2f}" if v < 10 else f"{v:.1f}", ha="center", va="bottom", fontsize=7)
        best = max((res[k] for k in ceil if k in res), default=None)
        if best:
            ax.axhline(best, color="tab:red", linestyle="--", linewidth=0.8)
            ax.text(len(names) - 0.5, best, f"{ceil_label} {best:.2f}", color="tab:red", fontsize=7,
                    ha="right", va="bottom")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("GB/s")
    fig.suptitle("8 GiB bf16 state dict, one GPU" + (f", {meta['date']}" if meta.get("date") else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
