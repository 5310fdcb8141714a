"""One rank's tensor-parallel slices of a model directory, read straight to its GPU (no process group).

What a loader that gives each rank only its own part does (vLLM's per-rank `get_slice`): every matrix cut by
columns (`[:, r*c:(r+1)*c]`) or by rows (`[r*c:(r+1)*c]`) for rank r of TP ranks, all in one ckptio plan
(`get_slices`). A column slice of a row-major matrix is one run per row. ckptio (default) reads the runs one by
one into packed staging slots where the page cache holds them, and copies each window's runs to the GPU as one
copy (pitched where they land apart); ckptio-span (CKPTIO_GPU_PACK=0) reads the span the runs cover, gaps
included, and copies them in pitched copies (cuMemcpy2DAsync); ckptio-rows (also CKPTIO_GPU_COPY_2D=0) one copy
per run, what ckptio did until 2026-11-27. Beside it, safetensors' own `get_slice` on the host and
`.to(device)` (what a plain loader does), and ckptio's whole-model load. The page cache holds the directory
(warmed first). Every slice is compared with the whole tensor, sliced on the GPU.

    python3 bench/probe_column_slices.py DIR        # prints one JSON line per measurement
Environment: TP (comma list, default 2,4,8), REPS (3), WHICH (ckptio,ckptio-span,ckptio-rows,safetensors).
"""
import glob
import json
import os
import time

import torch

DEV = os.environ.get("DEVICE", "cuda:0")
# ckptio's variants: its default (runs read packed where the page cache holds them, copied in pitched copies),
# and with the experiment knobs that undo each step (what ckptio did before 2026-11-27: ckptio-rows).
VARIANTS = {"ckptio": {}, "ckptio-span": {"CKPTIO_GPU_PACK": "0"},
            "ckptio-rows": {"CKPTIO_GPU_PACK": "0", "CKPTIO_GPU_COPY_2D": "0"},
            "ckptio-2d": {}}  # the name of the default in the runs of call B and C (before packed reads)


def sync():
    if DEV != "cpu":
        torch.cuda.synchronize()


def requests_for(shapes, tp, rank, by):
    """{name: index} for the 2-D tensors whose cut dimension splits evenly."""
    out = {}
    for name, shape in shapes.items():
        if len(shape) != 2:
            continue
        dim = 1 if by == "cols" else 0
        if shape[dim] % tp:
            continue
        c = shape[dim] // tp
        cut = slice(rank * c, (rank + 1) * c)
        out[name] = (slice(None), cut) if dim == 1 else cut
    return out


def main():
    import sys
    import ckptio
    d = sys.argv[1]
    tps = [int(x) for x in os.environ.get("TP", "2,4,8").split(",")]
    reps = int(os.environ.get("REPS", "3"))
    which = os.environ.get("WHICH", "ckptio,ckptio-span,ckptio-rows,safetensors").split(",")
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    for p in files:  # the page cache holds the model
        with open(p, "rb") as fh:
            while fh.read(64 << 20):
                pass
    torch.zeros(1, device=DEV)
    t0 = time.perf_counter()
    whole = ckptio.load(d, device=DEV)
    sync()
    nbytes = sum(t.numel() * t.element_size() for t in whole.values())
    print(json.dumps({"what": "whole model", "GBps": round(nbytes / (time.perf_counter() - t0) / 1e9, 2),
                      "bytes": nbytes}), flush=True)
    shapes = {k: tuple(v.shape) for k, v in whole.items()}
    for tp in tps:
        for by in ("cols", "rows"):
            for rank in (0, tp - 1):
                req = requests_for(shapes, tp, rank, by)
                want = {k: whole[k][idx] for k, idx in req.items()}
                got_bytes = sum(t.numel() * t.element_size() for t in want.values())
                for w in which:
                    times = []
                    for _ in range(reps):
                        for k, v in VARIANTS.get(w, {}).items():
                            os.environ[k] = v
                        t = time.perf_counter()
                        if w == "safetensors":
                            from safetensors import safe_open
                            out = {}
                            for p in files:
                                with safe_open(p, framework="pt", device="cpu") as f:
                                    for k in f.keys():
                                        if k in req:
                                            out[k] = f.get_slice(k)[req[k]].to(DEV)
                        else:
                            with ckptio.open(d, device=DEV) as f:
                                out = f.get_slices(req)
                        sync()
                        times.append(time.perf_counter() - t)
                        for k in VARIANTS.get(w, {}):
                            os.environ.pop(k, None)
                        bad = [k for k in req if not torch.equal(out[k], want[k])]
                        assert not bad, f"{w} tp={tp} {by} rank {rank}: {len(bad)} slices differ, first {bad[0]}"
                        del out
                    best = min(times)
                    print(json.dumps({"what": w, "tp": tp, "by": by, "rank": rank, "tensors": len(req),
                                      "bytes": got_bytes, "s": [round(x, 4) for x in times],
                                      "GBps_best": round(got_bytes / best / 1e9, 2)}), flush=True)


if __name__ == "__main__":
    main()
