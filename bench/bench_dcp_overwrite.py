"""bench_dcp_overwrite.py - saving a DCP checkpoint over the previous one in the same directory (BENCHMARKS.md,
"DCP").

Durable dcp.save of a host-memory state dict (SIZE_MIB of bf16 in 8 tensors, thread_count 8) into a
directory that already holds a checkpoint of the same size, page cache dropped before each save:
  torch        torch's FileSystemWriter (rewrites its files in place)
  ckptio_fg    ckptio.dcp.FileSystemWriter, cleanup="foreground" (default: older files unlinked
               before save() returns)
  ckptio_bg    cleanup="background" (older files unlinked by a thread of the writer; not timed)
  ckptio_fresh ckptio into an empty directory (what the overwrite costs)
Variants alternate, REPEAT rounds; medians printed. Needs root to drop the page cache.
Env: SIZE_MIB (512), REPEAT (4), DIR (/var/tmp/ckptio-overwrite).
"""
import os
import shutil
import statistics
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

import _common as common
import ckptio.dcp as cdcp

warnings.filterwarnings("ignore")
SIZE = int(os.environ.get("SIZE_MIB", "512")) << 20
REPEAT = int(os.environ.get("REPEAT", "4"))
D = os.environ.get("DIR", "/var/tmp/ckptio-overwrite")


def main():
    g = torch.Generator().manual_seed(0)
    cols = 8192
    rows = SIZE // (8 * 2 * cols)
    sd = {f"layers.{i}.w": torch.randn(rows, cols, generator=g).to(torch.bfloat16) for i in range(8)}
    nbytes = sum(v.nbytes for v in sd.values())
    makers = {
        "torch": lambda p: dcp.FileSystemWriter(p, thread_count=8),
        "ckptio_fg": lambda p: cdcp.FileSystemWriter(p, thread_count=8),
        "ckptio_bg": lambda p: cdcp.FileSystemWriter(p, thread_count=8, cleanup="background"),
        "ckptio_fresh": lambda p: cdcp.FileSystemWriter(p, thread_count=8),
    }
    res = {k: [] for k in makers}
    shutil.rmtree(D, ignore_errors=True)
    for _ in range(REPEAT):
        for name, make in makers.items():
            path = os.path.join(D, name)
            if name == "ckptio_fresh":
                shutil.rmtree(path, ignore_errors=True)
            elif not os.path.exists(path):
                dcp.save(sd, storage_writer=make(path), no_dist=True)
            common.drop_caches()
            writer = make(path)
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=writer, no_dist=True)
            el = time.perf_counter() - t0
            getattr(writer, "wait_cleanup", lambda: None)()
            res[name].append(nbytes / el / 1e9)
    shutil.rmtree(D, ignore_errors=True)
    print(common.machine(os.path.dirname(D)))
    print(f"{nbytes / 2**20:.0f} MiB, {REPEAT} rounds, durable save GB/s (median; all)")
    for name, v in res.items():
        print(f"  {name:<13} {statistics.median(v):6.2f}   {', '.join(f'{x:.2f}' for x in v)}")


if __name__ == "__main__":
    main()
