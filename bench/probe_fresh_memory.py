"""What a GPU load pays for destination memory that is new from cudaMalloc, and what hides it (issue 17).

A load into tensors the caching allocator already holds runs at ~51 GB/s on an H200; into memory new from
cudaMalloc at ~48 (bench/probe_first_load.py SECOND=fresh|reuse). This loads one model directory several times
in one process, each time into destinations made a different way, with torch.cuda.empty_cache() before every
load that wants new memory, and times the allocating and the C read apart:

    python3 bench/probe_fresh_memory.py DIR [ROUNDS [FIRST]]   # one JSON line per load

FIRST (default fresh) is the way of the process's first load; then ROUNDS rounds (default 3; 0: none) run
every way in WAYS (default all below, comma-separated) once, in an order rotating by round:
  fresh      plain load: the tensors allocated one by one inside the load (what a process's first load does)
  reuse      plain load into the allocator's cached blocks (the previous load's tensors freed, no empty_cache)
  reserve    one torch.empty of the whole load's bytes, freed, then the plain load: the allocator splits that
             one cudaMalloc into the tensors
  new-out    the tensors allocated one by one before the clock, then load(out=): only the copies are timed
  touched    as new-out, then every tensor zero_()ed (timed apart) before load(out=): is it the first write?
  touch-N    as touched, but one byte in every N bytes zeroed (N = 4k, 64k, 2m): does writing one byte
             per page buy what zeroing all of it buys, for almost nothing?
  overlap-P  the first tensors (P% of the bytes) allocated and read on a thread while this one allocates the
             rest, then the rest read: does hiding the allocations behind the first reads pay?
  views      one torch.empty of the whole load's bytes, the tensors views into it, load(out=) (the copies
             into one big allocation)

Measured on an H200 (2026-11-27, BENCHMARKS.md "Memory new from cudaMalloc", bench/results/h200_2026-11-27_s10_*):
the C read of 14.2 GB takes 274-277 ms into memory host-to-device copies wrote before (reuse), 283-300 into any
new memory whichever way it came; sparse touches do nothing, zeroing gains back less than it costs, and neither
one block nor allocating behind the first reads pays, so ckptio allocates per tensor, up front.
Corrected on 2026-11-27 (eighth session, bench/probe_copy_destination.py): every way here but reuse gets memory
given back with empty_cache() and allocated again, which is what is slow; memory new to the process is not.
"""
import json
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_first_load import timed_load  # noqa: E402

DEV = os.environ.get("DEVICE", "cuda:0")
WAYS = os.environ.get("WAYS", "fresh,reuse,reserve,new-out,touched,touch-64k,touch-2m,views").split(",")
STRIDES = {"touched": 1, "touch-4k": 4096, "touch-64k": 65536, "touch-2m": 2 << 20}
ALIGN = 512  # the caching allocator rounds every block to 512 bytes


def sync():
    if DEV != "cpu":
        torch.cuda.synchronize()


def release():
    """Gives every cached block back to the driver, so the next allocation is new cudaMalloc memory."""
    sync()
    if DEV != "cpu":
        torch.cuda.empty_cache()


def one_block(layout):
    """(block, views): one allocation holding every tensor of `layout` {name: (shape, dtype, nbytes)}."""
    total = sum(-(-n // ALIGN) * ALIGN for _, _, n in layout.values())
    block = torch.empty(total, dtype=torch.uint8, device=DEV)
    views, off = {}, 0
    for name, (shape, dtype, n) in layout.items():
        views[name] = block[off:off + n].view(dtype).view(shape)
        off += -(-n // ALIGN) * ALIGN
    return block, views


def one_way(ckptio, d, way, layout):
    """Runs one load the given way (the previous load's tensors already freed); returns (tensors to keep
    until the next load, row)."""
    row = {"way": way}
    if way != "reuse":  # reuse: the next allocations come from the freed tensors' cached blocks
        release()
    t0 = time.perf_counter()
    if way == "reserve":
        total = sum(-(-n // ALIGN) * ALIGN for _, _, n in layout.values())
        torch.empty(total, dtype=torch.uint8, device=DEV)  # freed at once: its one block stays cached
        row["reserve_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    if way == "new-out" or way in STRIDES:
        out = {k: torch.empty(s, dtype=dt, device=DEV) for k, (s, dt, _) in layout.items()}
        sync()
        row["alloc_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        if way in STRIDES:
            t1 = time.perf_counter()
            for t in out.values():
                t.view(-1).view(torch.uint8)[::STRIDES[way]].zero_()
            sync()
            row["touch_ms"] = round((time.perf_counter() - t1) * 1e3, 2)
        tensors, row["load"] = timed_load(ckptio, d, out=out)
    elif way == "views":
        block, out = one_block(layout)
        sync()
        row["alloc_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        tensors, row["load"] = timed_load(ckptio, d, out=out)
        tensors = (tensors, block)
    elif way.startswith("overlap-"):
        tensors = overlapped(ckptio, d, layout, int(way.split("-")[1]) / 100, row)
    else:
        tensors, row["load"] = timed_load(ckptio, d)
    row["total_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    if "GBps" not in row.get("load", {}):
        row["GBps"] = round(sum(n for _, _, n in layout.values()) / row["total_ms"] / 1e6, 2)
    return tensors, row


def overlapped(ckptio, d, layout, head_share, row):
    """A load whose first tensors (head_share of the bytes) are allocated and read first, on a thread, while
    this thread allocates the rest; then the rest is read. Returns the tensors; phases go into row."""
    names = list(layout)
    total = sum(n for _, _, n in layout.values())
    head, acc = [], 0
    for k in names:
        if acc >= head_share * total:
            break
        head.append(k)
        acc += layout[k][2]
    t0 = time.perf_counter()
    f = ckptio.CheckpointFile(d, device=DEV)
    out = {k: torch.empty(layout[k][0], dtype=layout[k][1], device=DEV) for k in head}
    errors = []

    def read_head():
        try:
            f.get_tensors(head, out=out)
        except BaseException as exc:  # noqa: B902 - handed to the main thread
            errors.append(exc)

    th = threading.Thread(target=read_head)
    th.start()
    t1 = time.perf_counter()
    for k in names[len(head):]:
        out[k] = torch.empty(layout[k][0], dtype=layout[k][1], device=DEV)
    t2 = time.perf_counter()
    th.join()
    t3 = time.perf_counter()
    if errors:
        raise errors[0]
    f.get_tensors(names[len(head):], out=out)
    sync()
    f.close()
    t4 = time.perf_counter()
    row.update(head_bytes=acc, head_alloc_ms=round((t1 - t0) * 1e3, 2), tail_alloc_ms=round((t2 - t1) * 1e3, 2),
               head_read_ms=round((t3 - t1) * 1e3, 2), tail_read_ms=round((t4 - t3) * 1e3, 2))
    return out


def file_layout(ckptio, d):
    """{name: (shape, torch dtype, nbytes)} of every tensor in d, from its headers."""
    with ckptio.CheckpointFile(d, device="cpu") as f:
        metas = {k: torch.empty(f.get_slice(k).get_shape(), device="meta",
                                dtype=ckptio._adapt.torch_dtype(f._entry(k).code, k)) for k in f.keys()}
    return {k: (tuple(m.shape), m.dtype, m.numel() * m.element_size()) for k, m in metas.items()}


def main():
    d = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    first_way = sys.argv[3] if len(sys.argv) > 3 else "fresh"
    torch.zeros(1, device=DEV)
    import ckptio
    layout = file_layout(ckptio, d)
    kept, row = one_way(ckptio, d, first_way, layout)  # the process's first load: it also pins the staging
    row["round"] = "first"
    print(json.dumps(row), flush=True)
    for r in range(rounds):
        order = WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]
        for way in order:
            kept = None
            kept, row = one_way(ckptio, d, way, layout)
            row["round"] = r
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
