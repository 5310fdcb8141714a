"""Where a process's first GPU load of a model directory spends its time (issue 17).

Later loads into existing tensors reach ~50 GB/s on an H200, a process's first load ~46-48: this times
the parts of a first load in a fresh process (CUDA initialised before the clock, as bench_model_gpu.py
FIRST=1 does), so the gap is split into what is paid once per process and what is paid per load.

    python3 bench/probe_first_load.py DIR MODE     # one fresh process; prints one JSON line
MODE: plain (the first load as it comes), tiny (the tensor with the fewest elements loaded first: the
engine's threads, streams and first slots exist before the timed load; until 2026-11-27 the shape compared
as a list picked a 16 MiB k_proj, which is what BENCHMARKS.md's "first load's phases" measured), prepared
(prepare_gpu, then 0.5 s, then the load), prepared-now (prepare_gpu, then the load at once: the load must not
wait for the pinning it interrupts), slotwarm (the first tenth of the tensors loaded and kept: every slot is
pinned and the pipeline warm, then the whole directory loaded into memory this process never had), newout
(the tensors allocated before the clock, then the first load into them with out=), realloc (15 GiB allocated,
written by host-to-device copies and given back to the driver with torch.cuda.empty_cache() before the load).
For each timed load: open (CheckpointFile over the directory), python (allocating the destination
tensors and building the request, i.e. get_tensors minus the C read), read (the C read, GIL released,
until the copies are done), total; GB/s over total; CPU seconds; staging pinned after it and the process's
anonymous memory on huge pages (with CKPTIO_GPU_HUGE_SLOTS=1: did the slots get them?); after the first load
the process's cudaMalloc count (device_allocs: one per tensor, or fewer when they share blocks). Then a
second load in the same process, timed the same way; SECOND says into what: fresh (default: the first
load's tensors freed and torch.cuda.empty_cache(), so memory given back to the driver and allocated again), reuse (freed, no
empty_cache: the allocator's cached blocks), out (into the first load's tensors).
"""
import json
import math
import os
import sys
import time

import torch

DEV = os.environ.get("DEVICE", "cuda:0")  # DEVICE=cpu: a smoke test of this script without a GPU


def timed_load(ckptio, d, names=None, out=None):
    """Opens d and loads `names` (default all) to cuda:0, or into the tensors `out`; returns (tensors, phase
    seconds)."""
    t0 = time.perf_counter()
    c0 = os.times()
    f = ckptio.CheckpointFile(d, device=DEV)
    t_open = time.perf_counter()
    inner = f._reader
    spent = []

    class Timed:  # the C read, timed around the call that releases the GIL
        def __getattr__(self, k):
            return getattr(inner, k)

        def read(self, targets):
            r0 = time.perf_counter()
            try:
                return inner.read(targets)
            finally:
                spent.append(time.perf_counter() - r0)

    f._reader = Timed()
    out = f.get_tensors(names, out=out)
    if DEV != "cpu":
        torch.cuda.synchronize()
    t_end = time.perf_counter()
    c1 = os.times()
    f._reader = inner
    f.close()
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    read = sum(spent)
    return out, {"bytes": nbytes, "open_ms": round((t_open - t0) * 1e3, 2),
                 "python_ms": round((t_end - t_open - read) * 1e3, 2), "read_ms": round(read * 1e3, 2),
                 "total_ms": round((t_end - t0) * 1e3, 2), "GBps": round(nbytes / (t_end - t0) / 1e9, 2),
                 "cpu_s": round((c1.user - c0.user) + (c1.system - c0.system), 3)}


def anon_huge_mib():
    """This process's anonymous memory on transparent huge pages (MiB), or None: whether
    CKPTIO_GPU_HUGE_SLOTS=1 got huge pages for the staging."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) >> 10
    except OSError:
        pass
    return None


DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64}


def given_back(nbytes):
    """Allocates nbytes of device memory, writes all of it by host-to-device copies, and gives it back to the
    driver: the next allocations get memory this process had (bench/probe_copy_destination.py: the first
    copies into such memory run ~11% slower)."""
    big = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    src = torch.zeros(256 << 20, dtype=torch.uint8).pin_memory()
    for off in range(0, nbytes, src.numel()):
        n = min(src.numel(), nbytes - off)
        big[off:off + n].copy_(src[:n], non_blocking=True)
    torch.cuda.synchronize()
    del big
    torch.cuda.empty_cache()


def main():
    d, mode = sys.argv[1], sys.argv[2]
    torch.zeros(1, device=DEV)
    import ckptio
    eng = ckptio.default_engine()
    row = {"mode": mode, "threads": eng.get("threads")}
    if mode in ("prepared", "prepared-now"):
        if DEV != "cpu":
            ckptio.prepare_gpu(DEV)
        if mode == "prepared":
            time.sleep(0.5)
    elif mode == "tiny":
        with ckptio.CheckpointFile(d, device=DEV) as f:
            small = min(f.keys(), key=lambda k: math.prod(f.get_slice(k).get_shape()))
        _, row["tiny"] = timed_load(ckptio, d, [small])
    elif mode == "slotwarm":
        with ckptio.CheckpointFile(d, device=DEV) as f:
            names = f.keys()
        kept, row["warmup"] = timed_load(ckptio, d, names[:max(1, len(names) // 10)])
    elif mode == "realloc" and DEV != "cpu":
        given_back(15 << 30)
    elif mode not in ("plain", "newout", "realloc"):
        raise SystemExit(f"unknown mode {mode}")
    dest = None
    if mode == "newout":
        with ckptio.CheckpointFile(d, device=DEV) as f:
            dest = {k: torch.empty(f.get_slice(k).get_shape(), dtype=DTYPES[f.get_slice(k).get_dtype()], device=DEV)
                    for k in f.keys()}
    out, row["first"] = timed_load(ckptio, d, out=dest)
    row["first"]["staging_reserved_MiB"] = eng.stats()["staging_reserved"] >> 20
    row["first"]["anon_huge_MiB"] = anon_huge_mib()
    if DEV != "cpu":  # how many cudaMallocs the process has made: one reservation or one per tensor
        row["first"]["device_allocs"] = torch.cuda.memory_stats(DEV).get("num_device_alloc")
    second = os.environ.get("SECOND", "fresh")
    row["second_mode"] = second
    if second == "out":  # into the first load's tensors (load(..., out=)): nothing allocated
        _, row["second"] = timed_load(ckptio, d, out=out)
    else:
        del out
        if DEV != "cpu" and second == "fresh":
            torch.cuda.empty_cache()  # the memory goes back to the driver and comes again from cudaMalloc
        out, row["second"] = timed_load(ckptio, d)  # "reuse": from the blocks the allocator kept
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
