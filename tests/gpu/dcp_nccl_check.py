"""dcp_nccl_check.py - ckptio.dcp with several ranks on NCCL (one GPU each).

    torchrun --standalone --nproc_per_node=2 tests/gpu/dcp_nccl_check.py --dir /tmp/x --out $OUT [--size-mb 256]
    torchrun --standalone --nproc_per_node=2 tests/gpu/dcp_nccl_check.py --dir /tmp/x --backend gloo --device cpu
    torchrun --standalone --nproc_per_node=4 tests/gpu/dcp_nccl_check.py --dir /tmp/x --keep
    torchrun --standalone --nproc_per_node=2 tests/gpu/dcp_nccl_check.py --dir /tmp/x --load-only

A sharded state dict of DTensors on a 1-D mesh over all ranks (Shard(0),
Shard(1) and Replicate() parameters in float32, bfloat16, float16 and int64,
about --size-mb in total, plus a step counter) is saved with
ckptio.dcp.FileSystemWriter (thread_count 1 and 4, and dcp.async_save) and
with torch's stock FileSystemWriter, then loaded into freshly created
DTensors of the same and of another sharding with ckptio.dcp.FileSystemReader
(load-once broadcast on and off) and with torch's stock reader, and compared
bit for bit (torch.equal on full_tensor()). With broadcast on, the bytes read
from storage over all ranks must equal the stored bytes (replicated items
read once); with it off, every rank reads the replicated items itself.
--keep leaves the checkpoints in --dir; --load-only then loads them (all the
loads above, no saves) with another number of ranks, e.g. half: the values
depend on --size-mb only, so every rank count can check them. --cache cold
drops the host's page cache before each timed load (root), --cache warm reads
the checkpoint's files once before it: without one of them a checkpoint
written with O_DIRECT (ckptio's) loads cold and one written through the page
cache (torch's) warm, and their times do not compare. For large
state dicts (a scale run): --threads N (the writers' thread_count, 4) and
--saves ckptio_tN,torch_stock (a subset of ckptio_t1, ckptio_tN,
ckptio_async, torch_stock; every load of a checkpoint not made is skipped).

Prints one "PASS name" / "FAIL name: why" line per check (rank 0; other
ranks print their own failures), one "time ..." line per save and load, and
writes dcp_nccl_check.json to --out. Exit status 1 when any check failed.
The NCCL process group is "cpu:gloo,cuda:nccl" (dcp.async_save needs a CPU
backend); NCCL_NVLS_ENABLE=0 is expected in the environment on shared hosts.
"""
import argparse
import json
import os
import pickle
import shutil
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

if not os.environ.get("CKPTIO_TEST_INSTALLED"):  # else: the installed package, never the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import ckptio.dcp as cdcp  # noqa: E402
from nccl_checks import Checks, summed  # noqa: E402 - beside this script (torchrun puts it on sys.path)

warnings.filterwarnings("ignore")

# name: (dtype, share of the total bytes, columns, placement at save, placement of the "other" load)
PARAMS = {
    "emb": (torch.bfloat16, 0.30, 4096, Shard(0), Shard(1)),
    "w1": (torch.float32, 0.20, 2048, Shard(1), Shard(0)),
    "w2": (torch.bfloat16, 0.25, 1024, Replicate(), Shard(0)),
    "norm": (torch.float32, 0.02, 512, Replicate(), Replicate()),
    "idx": (torch.int64, 0.13, 256, Shard(0), Replicate()),
    "h16": (torch.float16, 0.10, 1000, Shard(0), Shard(0)),
}


def shapes(size_mb):
    total = size_mb * 1e6
    out = {}
    for name, (dtype, share, cols, _, _) in PARAMS.items():
        rows = max(int(total * share / (cols * dtype.itemsize)) // 4 * 4, 4)
        out[name] = (rows, cols)
    return out


class Values:
    """The full tensors every rank expects, made on demand on the device, one at a time: a pattern of
    each element's index (integer arithmetic, exact on every device, so every rank and every run of
    the same --size-mb makes the same bytes, a resharded --load-only run included) rather than a
    seeded random generator on the CPU, which took minutes for 32 GB on every rank and, kept whole
    on every GPU beside a loaded copy, did not fit 32 GB on 2 ranks of 80 GB cards."""

    CHUNK = 1 << 26  # elements made at a time (512 MiB of int64 indices)

    def __init__(self, size_mb):
        self.shapes = shapes(size_mb)

    def nbytes(self, name):
        rows, cols = self.shapes[name]
        return rows * cols * PARAMS[name][0].itemsize

    def meta(self):
        """(name, shape, dtype) of every tensor, nothing made."""
        return [(name, shape, PARAMS[name][0]) for name, shape in self.shapes.items()]

    def make(self, name):
        rows, cols = self.shapes[name]
        dtype = PARAMS[name][0]
        seed = zlib.crc32(name.encode())
        flat = torch.empty(rows * cols, dtype=dtype, device=DEVICE)
        for start in range(0, flat.numel(), self.CHUNK):
            i = torch.arange(start, min(start + self.CHUNK, flat.numel()), dtype=torch.int64, device=DEVICE)
            if dtype == torch.int64:  # every position its own value (i < 2^34: no overflow)
                v = i * 1000003 + seed
            else:  # 16 bits from two co-prime periods, so no shift of a shard by whole rows repeats them
                v = ((i * 7919 + seed) % 65521) ^ ((i // 65521) % 251)
                v = (v - 32768).to(torch.float32) / 256
            flat[start:start + i.numel()] = v.to(dtype)
            del i, v
        return flat.view(rows, cols)

    def items(self):
        for name in self.shapes:
            yield name, self.make(name)


def read_through(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def set_page_cache(mode, path):
    """Before a timed load: "cold" drops the host's page cache (root; the load reads the disk),
    "warm" reads every file of the checkpoint once (the load finds it in memory), "asis" leaves it
    (then a checkpoint written with O_DIRECT, as ckptio's writer does, loads cold and one written
    through the page cache, as torch's does, warm: not comparable). A collective."""
    dist.barrier()
    if dist.get_rank() == 0 and mode == "cold":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:  # PermissionError when not root: the check fails
            f.write("3\n")
    elif dist.get_rank() == 0 and mode == "warm":
        paths = [os.path.join(root, name) for root, _, files in os.walk(path) for name in files]
        with ThreadPoolExecutor(8) as pool:  # one file per thread: the disk serves several reads faster
            list(pool.map(read_through, paths))
    dist.barrier()


def make_state(mesh, vals, which):
    sd = {}
    for name, shape, dtype in vals.meta():
        placement = PARAMS[name][3] if which == "save" else PARAMS[name][4]
        if which == "zeros_same":
            placement = PARAMS[name][3]
        src = vals.make(name) if which == "save" else torch.zeros(shape, dtype=dtype, device=DEVICE)
        sd[name] = distribute_tensor(src, mesh, [placement])
        del src
    sd["step"] = 1234 if which == "save" else 0
    return sd


def compare(sd, vals):
    bad = []
    for name, want in vals.items():
        got = sd[name].full_tensor() if isinstance(sd[name], DTensor) else sd[name]
        if got.dtype != want.dtype or not torch.equal(got, want):
            bad.append(name)
        del got, want
    if sd["step"] != 1234:
        bad.append(f"step={sd['step']}")
    return f"values differ: {bad}" if bad else True


def stored_bytes(path):
    """(bytes of every stored item once, bytes of the byte items among them)."""
    with open(os.path.join(path, ".metadata"), "rb") as f:
        md = pickle.load(f)
    total = byte_items = 0
    for idx, info in md.storage_data.items():
        entry = md.state_dict_metadata[idx.fqn]
        if isinstance(entry, BytesStorageMetadata):
            byte_items += info.length
        elif info.transform_descriptors:
            total += info.length
        else:
            chunk = next(c for c in entry.chunks if tuple(c.offsets) == tuple(idx.offset))
            total += chunk.sizes.numel() * entry.properties.dtype.itemsize
    return total + byte_items, byte_items


def main():
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--size-mb", "--size", dest="size_mb", type=int, default=256)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--threads", type=int, default=4, help="thread_count of the writers (ckptio_tN, torch_stock)")
    ap.add_argument("--saves", default=None, help="comma list of ckptio_t1,ckptio_tN,ckptio_async,torch_stock")
    ap.add_argument("--keep", action="store_true", help="leave the checkpoints in --dir")
    ap.add_argument("--load-only", action="store_true",
                    help="no saves: load the checkpoints an earlier --keep run left in --dir")
    ap.add_argument("--cache", default="asis", choices=["asis", "cold", "warm"],
                    help="the page cache before each timed load: dropped (root), filled with the checkpoint, "
                         "or left as the run left it")
    args = ap.parse_args()
    tn = f"ckptio_t{args.threads}"
    every = ("ckptio_t1", tn, "ckptio_async", "torch_stock")
    wanted = every if args.saves is None else tuple(k.replace("ckptio_tN", tn) for k in args.saves.split(","))
    unknown = [k for k in wanted if k not in every]
    if unknown:
        raise SystemExit(f"--saves: unknown {unknown}; choose from {every} (ckptio_tN = {tn})")

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        DEVICE = torch.device("cuda", local_rank)
    else:
        DEVICE = torch.device("cpu")
    backend = "cpu:gloo,cuda:nccl" if args.backend == "nccl" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(args.device, (world,))
    checks = Checks(rank, DEVICE)
    base = os.path.abspath(args.dir)
    if rank == 0 and not args.load_only:
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
    dist.barrier()

    vals = Values(args.size_mb)
    nbytes = sum(vals.nbytes(name) for name in PARAMS)
    replicated = sum(vals.nbytes(n) for n, p in PARAMS.items() if p[3] == Replicate())
    if rank == 0:
        print(f"== {world} ranks, backend {backend}, device {args.device}, torch {torch.__version__}, "
              f"state dict {nbytes / 1e6:.0f} MB ({replicated / 1e6:.0f} MB replicated)", flush=True)
    dirs = {key: os.path.join(base, key) for key in every if key in wanted}
    if args.load_only:
        missing = [p for p in dirs.values() if not os.path.isfile(os.path.join(p, ".metadata"))]
        found = checks.check("checkpoints of an earlier --keep run", lambda: f"missing: {missing}" if missing else True)
    else:
        save_all(checks, mesh, vals, nbytes, dirs, args.threads)
        found = True
    if found:
        load_all(checks, mesh, vals, nbytes, dirs, world, replicated, tn, args.cache)

    failed = [k for k, v in checks.results.items() if not v]
    if rank == 0:
        print(f"== {len(checks.results) - len(failed)} passed, {len(failed)} failed", flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            name = "dcp_nccl_check_load_only.json" if args.load_only else "dcp_nccl_check.json"
            with open(os.path.join(args.out, name), "w") as f:
                json.dump({"world": world, "backend": backend, "device": args.device, "torch": torch.__version__,
                           "cache": args.cache,
                           "state_bytes": nbytes, "replicated_bytes": replicated, "load_only": args.load_only,
                           "checks": checks.results, "seconds": checks.times}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    sys.exit(1 if failed else 0)


def save_all(checks, mesh, vals, nbytes, dirs, tn_threads):
    """The checkpoints in `dirs`: ckptio's writer with 1 and N threads, its async save, torch's writer."""
    sd = make_state(mesh, vals, "save")
    for threads in sorted({1, tn_threads}):
        path = dirs.get(f"ckptio_t{threads}")
        if path is None:
            continue
        checks.check(f"save ckptio thread_count={threads}", lambda path=path, threads=threads: checks.timed(
            f"save ckptio thread_count={threads}", nbytes,
            lambda: dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path, thread_count=threads))) or True)
    if "ckptio_async" in dirs:
        save_async(checks, sd, nbytes, dirs["ckptio_async"], tn_threads)
    if "torch_stock" in dirs:
        path = dirs["torch_stock"]
        checks.check("save torch stock FileSystemWriter", lambda: checks.timed(
            "save torch stock", nbytes,
            lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, thread_count=tn_threads))) or True)


def save_async(checks, sd, nbytes, path, threads):
    """dcp.async_save with ckptio's writer: the caller's stall, then the time until durable."""
    writer = cdcp.FileSystemWriter(path, thread_count=threads, cache_staged_state_dict=True)
    # The background save runs collectives while this thread goes on with its
    # own (the timing barriers): they must not share a group, or the two
    # threads' collectives interleave differently on each rank and hang.
    async_group = dist.new_group(backend="gloo")

    def async_save():
        holder = {}
        stall = checks.timed("async_save stall (caller blocked)", nbytes,
                             lambda: holder.setdefault("fut", dcp.async_save(sd, storage_writer=writer,
                                                                               process_group=async_group)))
        holder["fut"].result()
        dist.barrier()
        return stall is not None

    checks.check("save ckptio dcp.async_save", lambda: checks.timed("async_save until durable", nbytes, async_save))


def load_all(checks, mesh, vals, nbytes, dirs, world, replicated, tn, cache):
    """Every checkpoint loaded by ckptio's reader (broadcast on and off, the saved and another sharding)
    and by torch's; with broadcast on, every stored byte is read by exactly one rank."""
    rank = dist.get_rank()

    def load(name, path, reader, layout, expect_read=None):
        def run():
            out = make_state(mesh, vals, "zeros_same" if layout == "same" else "zeros_other")
            set_page_cache(cache, path)
            checks.timed(f"load {name}", nbytes, lambda: dcp.load(out, storage_reader=reader))
            result = compare(out, vals)
            stats = getattr(reader, "last_read_stats", None)
            if expect_read is not None:  # a collective: every rank gets here
                got = summed(stats["bytes_read"] if stats else -(1 << 50), DEVICE)
                want = expect_read(*stored_bytes(path))
                if result is True and got != want:
                    result = f"bytes read over all ranks {got}, expected {want} ({stats})"
                elif rank == 0:
                    print(f"   {name}: bytes_read over ranks {got} (expected {want}), rank 0 {stats}", flush=True)
            return result

        checks.check(f"load {name}", run)

    once = lambda total, byte_items: total  # noqa: E731 - every stored byte read by exactly one rank
    # Broadcast off: every rank reads the replicated tensors and the byte items itself.
    each = lambda total, byte_items: total + (world - 1) * (replicated + byte_items)  # noqa: E731
    for key in [k for k in ("ckptio_t1", tn, "ckptio_async") if k in dirs]:
        path = dirs[key]
        load(f"{key} same sharding, broadcast on", path, cdcp.FileSystemReader(path, broadcast=True), "same", once)
        load(f"{key} same sharding, broadcast off", path, cdcp.FileSystemReader(path, broadcast=False), "same", each)
        # Columns of emb's row chunks are read as spans that overlap between ranks: shared, so still once.
        load(f"{key} other sharding, broadcast on", path, cdcp.FileSystemReader(path, broadcast=True), "other", once)
    if tn in dirs:
        load(f"{tn} by torch stock reader", dirs[tn], dcp.FileSystemReader(dirs[tn]), "same")
    if "torch_stock" in dirs:
        load("torch_stock by ckptio reader, broadcast on", dirs["torch_stock"],
             cdcp.FileSystemReader(dirs["torch_stock"], broadcast=True), "same", once)
        load("torch_stock by ckptio reader, other sharding", dirs["torch_stock"],
             cdcp.FileSystemReader(dirs["torch_stock"]), "other")


DEVICE = torch.device("cpu")

if __name__ == "__main__":
    main()
