"""A node's GPUs loading one Hugging Face model directory, tensor parallel and as replicas: ckptio beside its peers,
same run (BENCHMARKS.md, "A node's GPUs").

    torchrun --standalone --nproc_per_node=2 bench/bench_model_tp.py     # $OUT/bench_model_tp.json + a table

The model is bench_model_gpu.py's (_common.make_model: a Llama-70B-like layer stack, bf16, GIB GiB, default 16, in 4
shards written by safetensors.torch.save_file: data not 4 KiB aligned), written once by rank 0 into MODEL_DIR.
Tensor parallelism over all ranks: rank r takes torch.tensor_split(t, world, 0)[r] of every 2-D weight and
every 1-D weight whole. The time is from a barrier until every rank holds its slices on its own GPU
(torch.cuda.synchronize, barrier). Every rank's result is compared on its GPU with its cut of
safetensors' own load of the same files; a loader that differs is reported as bytes_equal=False.

Loaders:
  ckptio read-once   ckptio.load(dir, device=cuda:r, process_group=pg, tp_dim=0): each byte the ranks need
                     is read from storage once across the node and the rest travels over NCCL
  ckptio per rank    every rank ckptio.load(dir, device=cuda:r) of the whole model, then slices
  safetensors        safe_open(file, "pt", device=cuda:r).get_slice(name)[rows] per rank
  fastsafetensors    SafeTensorsFileLoader(pg, cuda:r, nogds=True), files split over the ranks,
                     get_sharded(name, 0) / get_tensor(name) (scattered / broadcast over NCCL)
Ceilings: the O_DIRECT read of the model's files (16 threads, one process): "read-once ideal" cold time is
model bytes / that rate; warm, once a run: the page-cache read of the files (16 threads, one process) and
pinned host-to-device copies on every GPU at once (the node's aggregate).
Modes: tp (above) and replicas (every rank takes every tensor whole; aggregate GB/s = world x model bytes / s).
Cases: cold (every shard's pages dropped before each load) and warm (files in the page cache).
Environment: GIB, MODEL_DIR (default /var/tmp/ckptio-model), MODES (tp,replicas), CASES (cold,warm), REPS
(warm repeats, 2), COLD_REPS (cold rounds, 1; the O_DIRECT ceiling is measured before each and after the last),
LOADERS (comma list: only the loaders whose label holds one of these, e.g. "read once"), PEERS=0 (ckptio only),
VARIANTS=0 (no runs of ckptio with other settings: cold, 8 threads and buffered reads; warm replicas, other batch
sizes).
"""
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import _common as c

warnings.filterwarnings("ignore")
results = []


MODE = "tp"  # or "replicas": every rank takes every tensor whole


def cut(t, rank, world):
    return torch.tensor_split(t, world, 0)[rank] if MODE == "tp" and t.dim() >= 2 else t


def log0(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


def read_ceiling(case, files, direct):
    """Rank 0: a read ceiling over the model's files (16 threads, one process), recorded in results; its GB/s."""
    nbytes, seconds = c.read_files_ceiling(files, direct)
    gbps = round(c.gbps(nbytes, seconds), 2)
    results.append({"case": case, "loader": f"ceiling: {'O_DIRECT' if direct else 'page-cache'} read "
                    "(16 threads, one process)", "seconds": round(seconds, 3), "GBps": gbps})
    return gbps


def warm_ceilings(files, dev, world, rank):
    """The warm case's ceilings, once a run: rank 0 reading the model from the page cache (16 threads, one
    process), then every rank copying 8 GiB of pinned host memory to its own GPU at the same time (what the
    node's host memory and PCIe links give all GPUs together)."""
    if rank == 0:
        read_ceiling("warm", files, direct=False)
    n = 8 << 30
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    dst.copy_(src, non_blocking=True)  # first touch outside the timing
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    dist.barrier()
    secs = time.perf_counter() - t0
    del src, dst
    torch.cuda.empty_cache()
    label = f"ceiling: pinned host-to-device, {world} GPUs at once (8 GiB each)"
    results.append({"case": "warm", "loader": label, "seconds": round(secs, 3),
                    "GBps": round(world * n / secs / 1e9, 2)})
    log0(f"warm  {label}: {world * n / secs / 1e9:.2f} GB/s together ({n / secs / 1e9:.2f} each)")


def reference(files, rank, world, dev):
    from safetensors.torch import load_file
    ref = {}
    for f in files:
        for k, v in load_file(f, device=dev).items():
            ref[k] = cut(v, rank, world).clone()
    return ref


def equal(out, ref):
    return (isinstance(out, dict) and len(out) == len(ref) and
            all(k in out and out[k].dtype == v.dtype and tuple(out[k].shape) == tuple(v.shape)
                and out[k].device == v.device and torch.equal(out[k], v) for k, v in ref.items()))


def all_true(flag):
    t = torch.tensor([0 if flag else 1], device=f"cuda:{dist.get_rank()}")
    dist.all_reduce(t)
    return t.item() == 0


def timed(case, label, nbytes, fn, ref, note=""):
    rank = dist.get_rank()
    torch.cuda.synchronize()
    dist.barrier()
    c0 = os.times()
    t0 = time.perf_counter()
    err = None
    try:
        out = fn()
    except Exception as ex:  # noqa: BLE001 - a peer's failure is reported, the run goes on
        out, err = None, repr(ex)
    torch.cuda.synchronize()
    dist.barrier()
    secs = time.perf_counter() - t0
    c1 = os.times()
    cpu = torch.tensor([(c1.user - c0.user) + (c1.system - c0.system)], device=f"cuda:{rank}")
    dist.all_reduce(cpu)
    ok = all_true(err is None and equal(out, ref)) if ref is not None else None
    row = {"case": case, "loader": label, "seconds": round(secs, 3), "GBps": round(nbytes / secs / 1e9, 2),
           "cpu_s_per_GB": round(cpu.item() / (nbytes / 1e9), 3), "bytes_equal": ok, "note": note}
    if err:
        row["error"] = err[:500]
        print(f"rank {rank}: {label} failed: {err[:500]}", flush=True)
    results.append(row)
    log0(f"{case:5s} {label:62s} {secs:7.3f} s {row['GBps']:7.2f} GB/s cpu {row['cpu_s_per_GB']:.3f} s/GB "
         f"equal={ok} {note}")
    del out
    torch.cuda.empty_cache()
    return row


def ckptio_read_once(d, dev, pg, batch_bytes=None, **settings):
    import ckptio
    engine = ckptio.Engine(**settings) if settings else None
    tp = 0 if MODE == "tp" else None

    def fn():
        return ckptio.load(d, device=dev, process_group=pg, tp_dim=tp, engine=engine, batch_bytes=batch_bytes)
    return fn


def ckptio_per_rank(d, dev, rank, world):
    import ckptio

    def fn():
        whole = ckptio.load(d, device=dev)
        # A slice is cloned so that the whole tensor can go; a replica is the tensor itself (a clone of it
        # would hold two models beside the reference, more than an 80 GB GPU has for a 28 GB model).
        return {k: (cut(v, rank, world).clone() if MODE == "tp" and v.dim() >= 2 else v) for k, v in whole.items()}
    return fn


def safetensors_slices(files, dev, rank, world):
    from safetensors import safe_open

    def fn():
        out = {}
        for f in files:
            with safe_open(f, framework="pt", device=dev) as h:
                for k in h.keys():
                    sl = h.get_slice(k)
                    shape = sl.get_shape()
                    if len(shape) >= 2 and MODE == "tp":
                        rows = torch.tensor_split(torch.arange(shape[0]), world)[rank]
                        out[k] = sl[int(rows[0]):int(rows[-1]) + 1] if len(rows) else sl[0:0]
                    else:
                        out[k] = sl[:]
        return out
    return fn


def fastsafetensors_pg_dims(files, dev, pg, rank, world):
    """fastsafetensors needs each tensor's rank to pick scatter or broadcast; read from the headers."""
    dims = {k: len(v["shape"]) for f in files for k, v in c.safetensors_header(f).items()}
    from fastsafetensors import SafeTensorsFileLoader

    def fn():
        loader = SafeTensorsFileLoader(pg, dev, nogds=True)
        loader.add_filenames({r: files[r::world] for r in range(world)})
        fb = loader.copy_files_to_device()
        out = {}
        for k in sorted(dims):
            t = fb.get_sharded(k, 0) if dims[k] >= 2 and MODE == "tp" else fb.get_tensor(k)
            out[k] = t.clone()
        fb.close()
        loader.close()
        return out
    return fn


def main():
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = f"cuda:{rank}"
    pg = dist.group.WORLD
    d = os.environ.get("MODEL_DIR", "/var/tmp/ckptio-model")
    if rank == 0 and not c.shard_files(d):
        t0 = time.perf_counter()
        c.make_model(d, float(os.environ.get("GIB", "16")))
        print(f"model written in {time.perf_counter() - t0:.1f} s", flush=True)
    dist.barrier()
    files = c.shard_files(d)
    nbytes = c.tensor_bytes(files)
    import ckptio
    log0(f"model: {len(files)} shards, {nbytes / 1e9:.2f} GB of tensors; {world} ranks, "
         f"{torch.cuda.get_device_name(0)}; ckptio {ckptio.__version__} from {ckptio.__file__}")
    meta = c.machine(d)
    meta.update(gpu=torch.cuda.get_device_name(0), world=world, model_bytes=nbytes, shards=len(files),
                command=" ".join(sys.argv))
    global MODE
    warm_ceilings_done = False
    for MODE in os.environ.get("MODES", "tp,replicas").split(","):
        ref = reference(files, rank, world, dev)
        what = "tp_dim=0" if MODE == "tp" else "replicas"
        loaders = [(f"{MODE}: ckptio.load(dir, process_group, {what}) [read once]", ckptio_read_once(d, dev, pg)),
                   (f"{MODE}: ckptio.load(dir) on every rank" + (", then slice" if MODE == "tp" else ""),
                    ckptio_per_rank(d, dev, rank, world))]
        if os.environ.get("PEERS", "1") != "0":
            loaders += [(f"{MODE}: safetensors safe_open().get_slice()[...] per rank",
                         safetensors_slices(files, dev, rank, world)),
                        (f"{MODE}: fastsafetensors 0.5.0 (process group, nogds)",
                         fastsafetensors_pg_dims(files, dev, pg, rank, world))]
        variants = [(f"{MODE}: ckptio read once [threads=8]", ckptio_read_once(d, dev, pg, threads=8)),
                    (f"{MODE}: ckptio read once [read_cache=on]", ckptio_read_once(d, dev, pg, read_cache="on"))]
        only = [w for w in os.environ.get("LOADERS", "").split(",") if w]
        loaders = [(label, fn) for label, fn in loaders if not only or any(w in label for w in only)]

        def cold_ceiling():
            if rank == 0:
                gbps = read_ceiling("cold", files, direct=True)
                print(f"cold  ceiling: O_DIRECT read {gbps} GB/s -> read-once ideal "
                      f"{nbytes / 1e9 / gbps:.2f} s", flush=True)
            dist.barrier()

        for case in os.environ.get("CASES", "cold,warm").split(","):
            if case != "cold":
                if rank == 0:
                    c.warm(*files)
                if not warm_ceilings_done:
                    warm_ceilings(files, dev, world, rank)
                    warm_ceilings_done = True
            warm_variants = [(f"{MODE}: ckptio read once [batch {b >> 20} MiB]", ckptio_read_once(d, dev, pg, b))
                             for b in (64 << 20, 1 << 30)] if MODE == "replicas" else []
            runs = loaders + ((variants if case == "cold" else warm_variants)
                              if os.environ.get("VARIANTS", "1") == "1" else [])
            reps = int(os.environ.get("COLD_REPS" if case == "cold" else "REPS", "1" if case == "cold" else "2"))
            for rep in range(reps):
                if case == "cold":  # the disk drifts: its ceiling before every round, and once after the last
                    cold_ceiling()
                for label, fn in runs:
                    if case == "cold":
                        if rank == 0:
                            c.drop_caches(*files)
                        dist.barrier()
                    row = timed(case, label, nbytes, fn, ref, f"r{rep}")
                    row["mode"] = MODE
                    if "read once" in label:
                        st = ckptio.last_load_stats()
                        rb = torch.tensor([st.bytes_read if st else 0, st.bytes_received if st else 0], device=dev)
                        dist.all_reduce(rb)
                        row["bytes_read_all_ranks"], row["bytes_received_all_ranks"] = int(rb[0]), int(rb[1])
                        log0(f"      over all ranks: {rb[0].item() / 1e9:.2f} GB read from storage "
                             f"(model {nbytes / 1e9:.2f} GB), {rb[1].item() / 1e9:.2f} GB received over NCCL")
            if case == "cold":
                cold_ceiling()
            if rank == 0:
                c.write_result("bench_model_tp.json", meta, results)
        del ref
        torch.cuda.empty_cache()
    bad = [r["loader"] for r in results if r.get("bytes_equal") is False]
    if bad:
        log0("LOADERS WITH WRONG BYTES:", bad)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
