#!/usr/bin/env python3
"""bench_small_checkpoints.py - small checkpoints (16 KB .. 64 MB) on the CPU: ckptio.dcp's writer and reader
beside torch's FileSystemWriter / FileSystemReader, torch.save / torch.load and safetensors, all in one run, on one
state dict in host memory (BENCHMARKS.md, "Small checkpoints (DCP)").

Each size is a float32 state dict of 8 tensors. Per repetition, in this order:
  1. one process (no process group): saves into fresh directories / files with
       - DCP, torch's writer and ckptio's, sync_files=True and False;
       - torch.save and safetensors.torch.save_file, each followed by os.fsync of the file ("+fsync"),
         save_file done atomically by hand ("atomic": a temporary, fsync, rename, fsync of the directory), and
         ckptio.save (durable and atomic: the same steps);
     then warm loads (the files were just written) of each: DCP into the same state dict, torch.load,
     safetensors' load_file, ckptio.load (copied and mapped); every load is compared with the state dict once.
  2. two gloo ranks (torch.multiprocessing, one process each; --gloo-sizes): a checkpoint saved by one process,
     loaded by both ranks into plain tensors (Replicate) and into DTensors sharded by columns (Shard(1)), with
     torch's reader and ckptio's (broadcast "auto", True, False); then a 2-rank save of a row-sharded state dict
     with each writer. A time is the slowest rank's, between barriers.
Durability of the saves: torch's DCP writer with sync_files=True fsyncs each data file and .metadata (no
directory fsync); ckptio's writer fsyncs each data file, its manifest and .metadata and the directory after
each rename; sync_files=False: no fsync at all (ckptio's data files still go O_DIRECT when 1 MiB or larger).
Footprint: bytes of the DCP directories (every file), and of a Linear(16, 16) + AdamW state.
Medians (and minima) over the repetitions, after one round that is not counted (imports, first calls);
ratios are ckptio / peer (below 1: ckptio faster).

Usage: python3 bench/bench_small_checkpoints.py [--sizes 16K,256K,4M,16M,64M] [--gloo-sizes 16M,200M]
                                                [--repeat 5] [--dir /var/tmp] [--json FILE]
This is a benchmark, not a test: it is not run by scripts/test.sh.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import _common as common
from _common import parse_size

warnings.filterwarnings("ignore")


def state(size, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    n = max(1, size // 4 // 8)
    return {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(8)}


def dir_bytes(path):
    return sum(os.path.getsize(p) for p in common.files_of(path))


def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(save, path):
    """What an atomic durable save is by hand (ckptio.save's guarantee): a temporary, its fsync, the rename over
    the name, the directory's fsync."""
    tmp = path + ".tmp"
    save(tmp)
    fsync_file(tmp)
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check(got, want, what):
    import torch
    for k, v in want.items():
        if not torch.equal(got[k], v):
            raise SystemExit(f"{what}: {k} differs from what was saved")


def one_process(size, reps, base):
    import torch
    import torch.distributed.checkpoint as dcp
    import safetensors.torch as st
    import ckptio
    import ckptio.dcp

    sd = state(size)
    saves = {
        "dcp torch sync": lambda p: dcp.save(sd, storage_writer=dcp.FileSystemWriter(p, sync_files=True)),
        "dcp ckptio sync": lambda p: dcp.save(sd, storage_writer=ckptio.dcp.FileSystemWriter(p, sync_files=True)),
        "dcp torch nosync": lambda p: dcp.save(sd, storage_writer=dcp.FileSystemWriter(p, sync_files=False)),
        "dcp ckptio nosync": lambda p: dcp.save(sd, storage_writer=ckptio.dcp.FileSystemWriter(p, sync_files=False)),
        "torch.save+fsync": lambda p: (torch.save(sd, p), fsync_file(p)),
        "safetensors+fsync": lambda p: (st.save_file(sd, p), fsync_file(p)),
        "safetensors atomic": lambda p: save_atomic(lambda t: st.save_file(sd, t), p),
        "ckptio.save": lambda p: ckptio.save(sd, p + ".safetensors"),
    }

    def dcp_load(reader_of):
        def run(p):
            out = {k: torch.empty_like(v) for k, v in sd.items()}
            dcp.load(out, storage_reader=reader_of(p))
            return out
        return run

    loads = {
        "dcp torch": ("dcp torch sync", dcp_load(dcp.FileSystemReader)),
        "dcp ckptio": ("dcp ckptio sync", dcp_load(ckptio.dcp.FileSystemReader)),
        "torch.load": ("torch.save+fsync", lambda p: torch.load(p, weights_only=True)),
        "safetensors": ("safetensors+fsync", lambda p: st.load_file(p)),
        "ckptio.load": ("ckptio.save", lambda p: ckptio.load(p + ".safetensors")),
        "ckptio.load mmap": ("ckptio.save", lambda p: ckptio.load(p + ".safetensors", mmap=True)),
    }
    samples = {k: [] for k in list(saves) + [f"load {k}" for k in loads]}
    footprint = {}
    for r in range(reps + 1):  # round 0 warms up (imports, first calls) and is not counted
        paths = {}
        for name, fn in saves.items():
            p = os.path.join(base, f"{name.replace(' ', '_')}_{r}")
            seconds = common.timed(lambda: fn(p))[0]
            if r:
                samples[name].append(seconds)
            paths[name] = p
        for name, (src, fn) in loads.items():
            seconds, got, _ = common.timed(lambda: fn(paths[src]))
            if r:
                samples[f"load {name}"].append(seconds)
            if r == 0:
                check(got, sd, f"load {name} of {size} bytes")
        if r == 0:
            footprint = {"dcp torch": dir_bytes(paths["dcp torch sync"]),
                         "dcp ckptio": dir_bytes(paths["dcp ckptio sync"])}
        for p in paths.values():
            common.rmf(p)
            common.rmf(p + ".safetensors")
    return samples, footprint


def tiny_footprint(base):
    import torch
    import torch.distributed.checkpoint as dcp
    import ckptio.dcp

    torch.manual_seed(0)
    m = torch.nn.Linear(16, 16)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 16)).sum().backward()
    opt.step()
    sd = {"model": m.state_dict(), "optim": opt.state_dict()}
    out = {}
    for name, w in (("dcp torch", dcp.FileSystemWriter), ("dcp ckptio", ckptio.dcp.FileSystemWriter)):
        p = os.path.join(base, "tiny_" + name.replace(" ", "_"))
        dcp.save(sd, storage_writer=w(p))
        out[name] = dir_bytes(p)
        common.rmf(p)
    return out


# ---- two gloo ranks -------------------------------------------------------------------------------------------

def _rank_main(rank, world, store_path, base, size, reps, queue):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    import ckptio.dcp

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    n = max(world, int((size // 4 / 8) ** 0.5) // world * world)  # 8 square matrices of `size` bytes in all
    want = {f"w{i}": torch.randn(n, n, generator=torch.Generator().manual_seed(i)) for i in range(8)}
    plain = os.path.join(base, "plain")
    if rank == 0:
        dcp.save(want, storage_writer=dcp.FileSystemWriter(plain), no_dist=True)
    dist.barrier()

    def timed_all(fn):
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        mine = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return float(mine)

    readers = {"torch": lambda: dcp.FileSystemReader(plain),
               "ckptio auto": lambda: ckptio.dcp.FileSystemReader(plain),
               "ckptio broadcast=True": lambda: ckptio.dcp.FileSystemReader(plain, broadcast=True),
               "ckptio broadcast=False": lambda: ckptio.dcp.FileSystemReader(plain, broadcast=False)}
    samples = {}

    def add(key, seconds):
        if r:  # round 0 warms up and is not counted
            samples.setdefault(key, []).append(seconds)

    for r in range(reps + 1):
        for name, reader in readers.items():
            out = {k: torch.zeros_like(v) for k, v in want.items()}
            add(f"Replicate {name}", timed_all(lambda: dcp.load(out, storage_reader=reader())))
            if r == 0:
                check(out, want, f"Replicate {name}")
            out = {k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(1)]) for k, v in want.items()}
            add(f"Shard(1) {name}", timed_all(lambda: dcp.load(out, storage_reader=reader())))
            if r == 0:
                check({k: v.full_tensor() for k, v in out.items()}, want, f"Shard(1) {name}")
        sharded = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in want.items()}
        for name, w in (("torch", dcp.FileSystemWriter), ("ckptio", ckptio.dcp.FileSystemWriter)):
            p = os.path.join(base, f"save_{name}_{r}")
            add(f"save Shard(0) {name}", timed_all(lambda: dcp.save(sharded, storage_writer=w(p))))
            dist.barrier()
            if rank == 0:
                common.rmf(p)
    if rank == 0:
        queue.put({"bytes": 8 * n * n * 4, "samples": samples})
    dist.barrier()
    dist.destroy_process_group()


def two_ranks(size, reps, base):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = os.path.join(base, f"store_{size}")  # a FileStore's file serves one process group only
    procs = [ctx.Process(target=_rank_main, args=(r, 2, store, base, size, reps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        result = queue.get(timeout=600)
    except Exception:
        for p in procs:
            p.kill()
        raise
    for p in procs:
        p.join(60)
    return result


# ---- the report -------------------------------------------------------------------------------------------------

def ms(xs):
    return f"{1e3 * statistics.median(xs):7.1f} ({1e3 * min(xs):.1f})"


def ratio(a, b):
    return f"{statistics.median(a) / statistics.median(b):.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16K,256K,4M,16M,64M")
    ap.add_argument("--gloo-sizes", default="16M,200M", help="'' to skip the two-rank part")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gloo-repeat", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="ckptio-small-", dir=args.dir)
    meta = common.machine(args.dir)
    meta.update(sizes=args.sizes, gloo_sizes=args.gloo_sizes, repeat=args.repeat, gloo_repeat=args.gloo_repeat,
                command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]))
    results = {"one_process": {}, "two_ranks": {}}
    try:
        results["tiny_footprint"] = tiny = tiny_footprint(base)
        common.log(f"Linear(16,16)+AdamW on disk: torch {tiny['dcp torch']} B, ckptio {tiny['dcp ckptio']} B "
                   f"({tiny['dcp ckptio'] / tiny['dcp torch']:.2f}x)")
        for text in args.sizes.split(","):
            size = parse_size(text)
            samples, foot = one_process(size, args.repeat, base)
            results["one_process"][text] = {"bytes": size, "samples": samples, "footprint": foot}
            common.log(f"{text}: one process, ms median (min); footprint torch {foot['dcp torch']} B, ckptio "
                       f"{foot['dcp ckptio']} B ({foot['dcp ckptio'] / foot['dcp torch']:.2f}x)")
            for k, v in samples.items():
                print(f"    {k:22s} {ms(v)}")
            s = samples
            print(f"    ratios ckptio/peer: dcp save sync {ratio(s['dcp ckptio sync'], s['dcp torch sync'])}, "
                  f"nosync {ratio(s['dcp ckptio nosync'], s['dcp torch nosync'])}, "
                  f"dcp load {ratio(s['load dcp ckptio'], s['load dcp torch'])}; "
                  f"ckptio.save/safetensors+fsync {ratio(s['ckptio.save'], s['safetensors+fsync'])}, "
                  f"/safetensors atomic {ratio(s['ckptio.save'], s['safetensors atomic'])}; "
                  f"ckptio.load/safetensors {ratio(s['load ckptio.load'], s['load safetensors'])}, "
                  f"mmap {ratio(s['load ckptio.load mmap'], s['load safetensors'])}", flush=True)
        for text in filter(None, args.gloo_sizes.split(",")):
            r = two_ranks(parse_size(text), args.gloo_repeat, base)
            results["two_ranks"][text] = r
            common.log(f"{text}: two gloo ranks ({r['bytes']} bytes), ms median (min), slowest rank")
            s = r["samples"]
            for k, v in s.items():
                print(f"    {k:32s} {ms(v)}")
            for layout in ("Replicate", "Shard(1)"):
                print(f"    {layout} ratios to torch's reader: " + ", ".join(
                    f"{m} {ratio(s[f'{layout} ckptio {m}'], s[f'{layout} torch'])}"
                    for m in ("auto", "broadcast=True", "broadcast=False")), flush=True)
            print(f"    save Shard(0) ckptio/torch {ratio(s['save Shard(0) ckptio'], s['save Shard(0) torch'])}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        common.log("wrote", args.json)


if __name__ == "__main__":
    main()
