"""What allocating a model's destination tensors on the GPU costs, and whether one allocation can pay it.

A later load into new tensors trailed a load into existing ones (out=) by ~3 GB/s on the H200
(BENCHMARKS.md); this probe asked whether allocating the destinations is that difference. With torch's
caching allocator emptied (as after
torch.cuda.empty_cache, or in a fresh process) each tensor of more than 1 MiB is its own cudaMalloc.
This probe times, for the shapes of the model files in MODEL_DIR:

  per-tensor     torch.empty for each tensor (the loaders' way)
  one-block      torch.empty of the sum of the sizes, freed into the cache, then torch.empty for each
                 tensor (served by splitting the cached block: one cudaMalloc)
  one-alloc      the single torch.empty of the sum alone

    MODEL_DIR=/var/tmp/ckptio-model python3 bench/probe_alloc.py

Measured on an H200 (2026-11-26, bench/results/h200_2026-11-26_issue17s4_probe_alloc.log): 74 tensors,
14.2 GB: per-tensor 5.2-9.5 ms (58 segments), one-block 1.3-1.7 ms (2), one-alloc 0.8-1.6 ms: 1-2% of a
load, not the ~6% gap. Serving a load's destinations the one-block way made later loads slower (44.2 /
44.6 against 46.3 / 46.0 GB/s, cause not measured), so ckptio allocates per tensor. What does cost: copies
into device memory freed and allocated again (bench/probe_pipeline.c fresh=1; docs/GPU.md, "Bounds").
"""
import glob
import os
import time

import torch
from safetensors import safe_open

DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
      "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}


def shapes(d):
    out = []
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, "pt") as h:
            for k in h.keys():
                sl = h.get_slice(k)
                out.append((tuple(sl.get_shape()), DT[sl.get_dtype()]))
    return out


def timed(fn):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    segs0 = torch.cuda.memory_stats().get("segment.all.allocated", 0)
    t0 = time.perf_counter()
    keep = fn()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    segs = torch.cuda.memory_stats().get("segment.all.allocated", 0) - segs0
    del keep
    torch.cuda.empty_cache()
    return dt, segs


def main():
    sh = shapes(os.environ.get("MODEL_DIR", "/var/tmp/ckptio-model"))
    sizes = [torch.Size(s).numel() * t.itemsize for s, t in sh]
    total = sum((n + 511) // 512 * 512 for n in sizes)
    torch.zeros(1, device="cuda:0")

    def per_tensor():
        return [torch.empty(s, dtype=t, device="cuda:0") for s, t in sh]

    def one_block():
        big = torch.empty(total, dtype=torch.uint8, device="cuda:0")
        del big
        return [torch.empty(s, dtype=t, device="cuda:0") for s, t in sh]

    def one_alloc():
        return torch.empty(total, dtype=torch.uint8, device="cuda:0")

    print(f"{len(sh)} tensors, {total / 1e9:.2f} GB", flush=True)
    for rep in range(3):
        for name, fn in (("per-tensor", per_tensor), ("one-block", one_block), ("one-alloc", one_alloc)):
            dt, segs = timed(fn)
            print(f"alloc {name:11s} {dt * 1e3:8.2f} ms  segments {segs}  ({dt / 0.36 * 100:.1f}% of a 0.36 s load)",
                  flush=True)


if __name__ == "__main__":
    main()
