"""Host-to-device copies into device memory by its history, copy engine against a copy kernel (issue 17).

A plain load allocates its destination tensors; is a copy into such memory slower than into memory copies
wrote before? This times pure copies (no file, no ckptio) from a 256 MiB pinned buffer into 6 GiB of device
memory, in 4 MiB pieces on 4 streams (the copy engine, like ckptio's slots) or by a copy kernel reading the
pinned buffer through its device mapping (SMs instead of the copy engine; cupy RawKernel, 4 x 16-byte loads
in flight per thread). One MODE per process, one JSON line with the first, second and third pass (GB/s):

    python3 bench/probe_copy_destination.py MODE
MODE: new (memory this process never had: the first pass is its first write), realloc (6 GiB written by
copies, given back to the driver with torch.cuda.empty_cache(), then allocated again), tensors (new memory
as 19 tensors of a Llama layer's sizes); a "cold-" prefix skips the warm-up copies into a scratch buffer
(the process's first copies are then the timed ones), a "-sleep" suffix waits 2 s between allocating and
copying, a "-kernel" suffix copies by the kernel.

Measured on an H200 (2026-11-27, BENCHMARKS.md "Where a first load's time goes", raw
bench/results/h200_2026-11-27_s11_copy_destination.jsonl): new memory takes copies at full speed (52.2-53.3
GB/s on the first pass, cold or warm, slept or not); memory given back and allocated again takes its first
pass at 47.3-47.6, later passes at 53; the kernel runs 49.5-50.9 whatever the memory.
"""
import json
import sys
import time

import torch

PIECE, SRC, STREAMS, LAUNCH = 4 << 20, 256 << 20, 4, 64 << 20
GIB6 = 6 << 30
COPY64 = r'''
extern "C" __global__ void copy64(const uint4 *src, uint4 *dst, unsigned long long n16) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {  /* four loads issued before the stores */
        uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
    }
    for (; i < n16; i += stride) dst[i] = src[i];
}
'''


class Copier:
    def __init__(self, kernel):
        self.src = torch.randint(0, 255, (SRC,), dtype=torch.uint8).pin_memory()
        self.streams = [torch.cuda.Stream() for _ in range(STREAMS)]
        self.kernel = None
        if kernel:
            import cupy
            self.cupy = cupy
            self.kernel = cupy.RawKernel(COPY64, "copy64")

    def _engine(self, dsts):
        k = 0
        for d in dsts:
            for off in range(0, d.numel(), PIECE):
                m = min(PIECE, d.numel() - off)
                so = (k * PIECE) % SRC
                with torch.cuda.stream(self.streams[k % STREAMS]):
                    d[off:off + m].copy_(self.src[so:so + m], non_blocking=True)
                k += 1

    def _kernel(self, dsts):
        cp, k = self.cupy, 0
        for d in dsts:
            for off in range(0, d.numel(), LAUNCH):
                m = min(LAUNCH, d.numel() - off)
                so = (k * LAUNCH) % SRC
                with cp.cuda.Stream.from_external(self.streams[k % STREAMS]):
                    self.kernel((264,), (1024,), (cp.uint64(self.src.data_ptr() + so), cp.uint64(d.data_ptr() + off),
                                                  cp.uint64(m // 16)))
                k += 1

    def timed(self, dsts):
        """GB/s of one pass over dsts (every destination written once)."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        (self._kernel if self.kernel else self._engine)(dsts)
        torch.cuda.synchronize()
        return round(sum(d.numel() for d in dsts) / (time.perf_counter() - t0) / 1e9, 2)


def main():
    mode = sys.argv[1]
    base = mode.removeprefix("cold-").removesuffix("-kernel").removesuffix("-sleep")
    if base not in ("new", "realloc", "tensors"):
        raise SystemExit(f"unknown mode {mode}")
    torch.zeros(1, device="cuda:0")
    c = Copier(mode.endswith("-kernel"))
    row = {"mode": mode}
    if not mode.startswith("cold-"):
        scratch = torch.empty(SRC, dtype=torch.uint8, device="cuda:0")
        for _ in range(3):
            c.timed([scratch])
    if base == "realloc":
        old = torch.empty(GIB6, dtype=torch.uint8, device="cuda:0")
        row["before_free"] = c.timed([old])
        del old
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    if base == "tensors":
        sizes = [128256 * 4096 * 2] + [4096 * 4096 * 2, 1024 * 4096 * 2 * 2, 14336 * 4096 * 2 * 3] * 6
        dsts = [torch.empty(s, dtype=torch.uint8, device="cuda:0") for s in sizes]
    else:
        dsts = [torch.empty(GIB6, dtype=torch.uint8, device="cuda:0")]
    row["alloc_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    row["GB"] = round(sum(d.numel() for d in dsts) / 1e9, 2)
    if mode.endswith("-sleep"):
        time.sleep(2)
    row["first"], row["second"], row["third"] = c.timed(dsts), c.timed(dsts), c.timed(dsts)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
