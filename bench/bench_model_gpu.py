"""One GPU, one Hugging Face model directory: ckptio beside the loaders people use, same run (BENCHMARKS.md, "Load
to one GPU").

A Llama-shaped bf16 model (GIB GiB, default 16: 14.21 GB of tensors in 4 shards written by
safetensors.torch.save_file, so its data is not 4 KiB aligned; _common.make_model) is loaded to cuda:0 from three
places: cold (pages dropped), warm (page cache) and tmpfs (/dev/shm). Every load's tensors are compared with
safetensors' own load of the same files; a loader that differs is reported, not timed.

Loaders: ckptio.load(directory) (one plan over all shards; its default path, CKPTIO_GPU_PATH=pipeline and
CKPTIO_READ_CACHE=off), ckptio.load(..., out=) into existing tensors, InstantTensor 0.2.2 (default backend,
BUFFERED; copy=True default, so its tensors are its own), fastsafetensors (one GPU, no GDS), Run:ai Model Streamer
(host tensors moved to the GPU), safetensors.torch.load_file(device=...). Ceilings beside them: pinned
host-to-device (torch), page-cache read (16 threads), O_DIRECT read (before and after the cold loaders).
For each: GB/s, CPU seconds per GB (user+system of the process), and the GPU memory the load took beyond its
destination tensors (peak of cuMemGetInfo-used during the load, sampled every 2 ms, minus used after it with the
tensors held).

The case columns (page cache): one rank's column slices [:, r*c:(r+1)*c] of every matrix for TP ranks 0 and TP-1,
what a loader that gives each rank only its part reads (vLLM's per-rank get_slice): ckptio.open(dir).get_slices()
in one plan beside safetensors' get_slice on the host and .to(device); best of REPS, every slice compared.

    python3 bench/bench_model_gpu.py            # writes $OUT/bench_model_gpu.json and prints a table
Environment: GIB (model size), MODEL_DIR (default /var/tmp/ckptio-model), REPS (default 2), CASES (comma list of
cold,warm,tmpfs,columns), PEERS=0 (ckptio only) or PEERS=it (InstantTensor only), TP (columns: 2,4,8),
FIRST=1 (each loader's first load in a fresh process, as a model server meets it: its pinned buffers, streams and
threads are made inside the timed load; CUDA is initialised before the clock starts; FIRST_WHICH picks loaders of
FIRST_KEYS, FIRST_ONLY=1 leaves out the loads in this process),
SECOND=reuse (FIRST=1: the second load reuses the blocks torch's allocator kept, as a server replacing its weights
does; default fresh: they were given back with torch.cuda.empty_cache(), the driver's slower case),
MEMWATCH=0 (no sampling of GPU memory during the loads: extra GPU memory is then not reported),
COLD_ROTATE=N (cold: the ckptio loaders' order rotated by N), BENCH_JSON (the result's file name).
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import torch

import _common as c
from _common import GiB, make_model, shard_files, tensor_bytes

REPS = int(os.environ.get("REPS", "2"))
results = []


def log(*a):
    print(*a, flush=True)


def drop_cache(files):
    c.drop_caches(*files)


def warm_cache(files):
    c.warm(*files)


class GpuMemWatch:
    """Peak device memory in use (cuMemGetInfo), sampled every 2 ms while a load runs.
    MEMWATCH=0: not sampled (peak None), to see whether sampling slows the loads it watches."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self.sampling = os.environ.get("MEMWATCH", "1") != "0"

    def used(self):
        free, total = torch.cuda.mem_get_info(0)
        return total - free

    def __enter__(self):
        if not self.sampling:
            self.peak = None
            return self
        self.peak = self.used()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used())
            time.sleep(0.002)

    def __exit__(self, *exc):
        if not self.sampling:
            return
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.used())


def timed(case, loader, nbytes, fn, reference, note="", give_back=True):
    """Runs fn() -> {name: tensor} (or None for ceilings), checks it, records GB/s, CPU s/GB, extra GPU memory.
    give_back: torch.cuda.empty_cache() after the result is freed (its memory goes back to the driver)."""
    torch.cuda.synchronize()
    with GpuMemWatch() as w:
        c0 = os.times()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        c1 = os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    used_after = torch.cuda.mem_get_info(0)[1] - torch.cuda.mem_get_info(0)[0]
    ok = None
    if out is not None and reference is not None:
        ok = len(out) == len(reference) and all(
            k in out and out[k].device.type == "cuda" and out[k].dtype == v.dtype and out[k].shape == v.shape
            and torch.equal(out[k], v) for k, v in reference.items())
    row = {"case": case, "loader": loader, "seconds": round(secs, 3), "GBps": round(nbytes / secs / 1e9, 2),
           "cpu_s_per_GB": round(cpu / (nbytes / 1e9), 3),
           "extra_gpu_GiB": round(max(0, w.peak - used_after) / GiB, 2) if out is not None and w.peak is not None else None,
           "bytes_equal": ok, "note": note}
    results.append(row)
    log(f"{case:6s} {loader:55s} {row['GBps']:7.2f} GB/s {secs:7.3f} s  cpu {row['cpu_s_per_GB']:.3f} s/GB  "
        f"extra GPU {row['extra_gpu_GiB']} GiB  equal={ok} {note}")
    del out
    if give_back:
        torch.cuda.empty_cache()
    return row


# ---- ceilings -------------------------------------------------------------------------

def ceiling_h2d():
    n = 8 * GiB
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    def copy():
        dst.copy_(src, non_blocking=True)
    timed("-", "ceiling: pinned host-to-device (torch, 8 GiB)", n, copy, None)
    del src, dst


def ceiling_read(case, files, direct, threads=16, note=""):
    nbytes, seconds = c.read_files_ceiling(files, direct, threads)
    label = f"ceiling: {'O_DIRECT' if direct else 'page-cache'} read ({threads} threads)"
    row = {"case": case, "loader": label, "seconds": round(seconds, 3), "GBps": round(c.gbps(nbytes, seconds), 2),
           "note": note}
    results.append(row)
    log(f"{case:6s} {label:55s} {row['GBps']:7.2f} GB/s {seconds:7.3f} s  {note}")
    return row


# ---- loaders ----------------------------------------------------------------------------

def load_ckptio(d, **settings):
    import ckptio
    e = ckptio.Engine(**settings)
    holder = {}

    def fn():
        out = ckptio.load(d, device="cuda:0", engine=e)
        holder["stats"] = e.stats()
        return out
    return fn, holder


def load_ckptio_default(d):
    import ckptio  # outside the timed load, as the peers' imports are
    return lambda: ckptio.load(d, device="cuda:0")


def load_ckptio_out(d, reference):
    import ckptio
    dst = {k: torch.empty_like(v) for k, v in reference.items()}
    def fn():
        ckptio.load(d, device="cuda:0", out=dst)
        return dst
    return fn


def load_instanttensor(files, backend=None):
    from instanttensor import BackendPolicy, safe_open as it_open
    kw = {} if backend is None else {"backend": getattr(BackendPolicy, backend)}

    def fn():
        out = {}
        with it_open(list(files), framework="pt", device=0, **kw) as f:
            for name, t in f.tensors():
                out[name] = t
        return out
    return fn


def load_fastsafetensors(files):
    from fastsafetensors import SafeTensorsFileLoader

    def fn():
        loader = SafeTensorsFileLoader(None, "cuda:0", nogds=True)
        loader.add_filenames({0: list(files)})
        keys = loader.get_keys()
        fb = loader.copy_files_to_device()
        # Its tensors are views of per-file device buffers freed by close(): a model keeps copies.
        out = {k: fb.get_tensor(k).clone() for k in keys}
        fb.close()
        loader.close()
        return out
    return fn


def load_runai(files):
    from runai_model_streamer import SafetensorsStreamer

    def fn():
        out = {}
        with SafetensorsStreamer() as s:
            s.stream_files(list(files))
            for name, t in s.get_tensors():
                out[name] = t.to("cuda:0", non_blocking=False)
        return out
    return fn


def load_safetensors(files):
    from safetensors.torch import load_file

    def fn():
        out = {}
        for f in files:
            out.update(load_file(f, device="cuda:0"))
        return out
    return fn


FIRST_LOADERS = {
    "ckptio.load(dir) [default]": lambda d, files, ref: load_ckptio_default(d),
    "ckptio.load(dir) after prepare_gpu": lambda d, files, ref: load_ckptio_default(d),
    "ckptio.load(dir, out=existing tensors)": lambda d, files, ref: load_ckptio_out(d, ref),
    "instanttensor 0.2.2 default backend": lambda d, files, ref: load_instanttensor(files),
    "instanttensor 0.2.2 BUFFERED": lambda d, files, ref: load_instanttensor(files, "BUFFERED"),
}


def first_load_child(label, d):
    """In a fresh process: CUDA initialised, then the loader's first load timed, then checked."""
    torch.zeros(1, device="cuda:0")
    if "prepare_gpu" in label:
        # A server calls prepare_gpu, then builds its model (0.3 s stands for that here).
        import ckptio
        ckptio.prepare_gpu("cuda:0")
        time.sleep(0.3)
    files = shard_files(d)
    nbytes = tensor_bytes(files)
    shapes = None
    if "out=" in label:  # the destination tensors exist before the load, as in load_state_dict
        from safetensors import safe_open
        shapes = {}
        for f in files:
            with safe_open(f, "pt") as h:
                for k in h.keys():
                    sl = h.get_slice(k)
                    shapes[k] = (sl.get_shape(), sl.get_dtype())
        dt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
        ref_like = {k: torch.empty(shape, dtype=dt[t], device="cuda:0") for k, (shape, t) in shapes.items()}
        fn = FIRST_LOADERS[label](d, files, ref_like)
    else:
        fn = FIRST_LOADERS[label](d, files, None)
    # SECOND=reuse: the first load's memory stays with torch's allocator for the second (a server replacing
    # its weights); default fresh: torch.cuda.empty_cache() gives it back to the driver in between.
    reuse = os.environ.get("SECOND", "fresh") == "reuse"
    row = timed(os.environ["FIRST_CASE"], label, nbytes, fn, None, "first load in a fresh process",
                give_back=not reuse)
    engine_stats = None
    if label.startswith("ckptio"):
        import ckptio
        engine_stats = ckptio.default_engine().stats
    before = engine_stats() if engine_stats else None
    row2 = timed(os.environ["FIRST_CASE"], label, nbytes, fn, None,
                 "second load, same process" + (" (the allocator's cached blocks)" if reuse else ""))
    if engine_stats:
        # Where the second load's workers spent their time: waiting on GPU copies (seconds_copy, summed
        # over workers) against the load's wall time x workers says whether the DMA or the CPU side bounds it.
        after = engine_stats()
        row2["ckptio_second_load"] = {k: round(after[k] - before[k], 4) for k in ("seconds_io", "seconds_copy")}
        row2["ckptio_second_load"]["threads"] = ckptio.default_engine().get("threads")
    from safetensors.torch import load_file
    reference = {}
    for f in files:
        reference.update(load_file(f, device="cuda:0"))
    out = fn()
    ok = len(out) == len(reference) and all(torch.equal(out[k], v) for k, v in reference.items())
    row["bytes_equal"] = row2["bytes_equal"] = ok
    if label.startswith("ckptio"):  # which path ran (all three loads together)
        import ckptio
        st = ckptio.default_engine().stats()
        # bytes_direct/bytes_buffered: whether the file reads went O_DIRECT or through the page cache
        # (tmpfs included), all three loads together.
        row["ckptio_stats"] = {k: st.get(k) for k in ("bytes_h2d",
                                                      "staging_reserved", "bytes_direct", "bytes_buffered")}
        row["env"] = {k: v for k, v in os.environ.items() if k.startswith("CKPTIO_")}
    print("FIRSTROW " + json.dumps([row, row2]), flush=True)


FIRST_KEYS = {"ckptio": "ckptio.load(dir) [default]", "ckptio-out": "ckptio.load(dir, out=existing tensors)",
              "ckptio-prepared": "ckptio.load(dir) after prepare_gpu",
              "it": "instanttensor 0.2.2 default backend", "it-buffered": "instanttensor 0.2.2 BUFFERED"}


def run_first_loads(case, d):
    """Each loader's first load in a process of its own (FIRST=1; FIRST_WHICH: comma list of FIRST_KEYS).
    From the page cache, InstantTensor's default backend (O_DIRECT: it reads the disk whatever the page
    cache holds) is left out: its BUFFERED backend is its warm path."""
    which = os.environ.get("FIRST_WHICH", ",".join(FIRST_KEYS)).split(",")
    for key in which:
        label = FIRST_KEYS[key]
        if os.environ.get("PEERS") == "0" and not label.startswith("ckptio"):
            continue
        if case == "warm" and key == "it":
            continue
        env = dict(os.environ, FIRST_CASE=case)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--first", label, d], env=env,
                           capture_output=True, text=True, timeout=300)
        rows = [json.loads(line[9:]) for line in r.stdout.splitlines() if line.startswith("FIRSTROW ")]
        if r.returncode != 0 or not rows:
            log(f"{case:6s} {label} (fresh process): failed rc={r.returncode} {r.stderr[-400:]}")
            continue
        for row in rows[0]:
            results.append(row)
            log(f"{case:6s} {label:55s} {row['GBps']:7.2f} GB/s {row['seconds']:7.3f} s  cpu {row['cpu_s_per_GB']:.3f}"
                f" s/GB  extra GPU {row['extra_gpu_GiB']} GiB  equal={row['bytes_equal']} {row['note']}"
                f" {row.get('ckptio_stats', '')}{row.get('ckptio_second_load', '')}")


def run_case(case, d, nbytes, reference):
    files = shard_files(d)
    loaders = [
        ("ckptio.load(dir) [default]", *load_ckptio(d)),
        ("ckptio.load(dir) [CKPTIO_GPU_PATH=pipeline]", *load_ckptio(d, gpu_path="pipeline")),
        ("ckptio.load(dir) [CKPTIO_READ_CACHE=off]", *load_ckptio(d, read_cache="off")),
    ]
    peers = [("ckptio.load(dir, out=existing tensors)", lambda: load_ckptio_out(d, reference), None),
             ("instanttensor 0.2.2 default backend", lambda: load_instanttensor(files), None),
             ("instanttensor 0.2.2 BUFFERED", lambda: load_instanttensor(files, "BUFFERED"), None),
             ("fastsafetensors 0.5.0 (1 GPU, nogds)", lambda: load_fastsafetensors(files), None),
             ("runai-model-streamer 0.16.1 (+ .to(cuda))", lambda: load_runai(files), None),
             ("safetensors.torch.load_file(device=cuda)", lambda: load_safetensors(files), None)]
    if case == "cold":
        # The measured disks read faster as a cold run goes on, whoever reads (BENCHMARKS.md, "Load to one GPU"):
        # the ceiling is measured at both ends, and COLD_ROTATE=N rotates the ckptio loaders' order.
        drop_cache(files)
        ceiling_read(case, files, direct=True)
    else:  # warm, tmpfs: every page read once before the first loader, so none pays first touches
        warm_cache(files)
        if case == "warm":
            ceiling_read(case, files, direct=False)
    if os.environ.get("FIRST") == "1" and case != "cold":
        run_first_loads(case, d)
    if os.environ.get("FIRST_ONLY") == "1":
        return
    if case == "cold" and os.environ.get("COLD_ROTATE"):
        k = int(os.environ["COLD_ROTATE"]) % len(loaders)
        loaders = loaders[k:] + loaders[:k]
    if os.environ.get("PEERS") == "0":
        peers = []
    elif os.environ.get("PEERS") == "it":
        peers = [x for x in peers if x[0].startswith("instanttensor")]
    for rep in range(REPS if case != "cold" else 1):
        for label, fn, holder in loaders:
            if case == "cold":
                drop_cache(files)
            row = timed(case, label, nbytes, fn, reference, f"r{rep}")
            st = holder.get("stats", {})
            row["ckptio_stats"] = {k: st.get(k) for k in ("bytes_h2d",
                                                         "bytes_direct", "bytes_buffered", "staging_peak")}
            log("       ckptio stats:", row["ckptio_stats"])
        for label, make, _ in peers:
            if case == "cold" and ("safetensors.torch" in label or "runai" in label or "fastsafe" in label):
                continue  # disk-bound like the others; kept out to save device time
            try:
                fn = make()
            except Exception as ex:  # a peer that is not installed
                log(f"{case:6s} {label}: unavailable ({ex!r})")
                continue
            if case == "cold":
                drop_cache(files)
            try:
                timed(case, label, nbytes, fn, reference, f"r{rep}")
            except Exception as ex:
                log(f"{case:6s} {label}: failed ({ex!r})")
                results.append({"case": case, "loader": label, "error": repr(ex)})
    if case == "cold":
        ceiling_read(case, files, direct=True, note="again, after the loaders")

def column_requests(shapes, tp, rank):
    """{name: index} of rank's column slice of every matrix whose columns split evenly over tp ranks."""
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 2 and shape[1] % tp == 0:
            w = shape[1] // tp
            out[name] = (slice(None), slice(rank * w, (rank + 1) * w))
    return out


def run_columns(d, reference):
    """One rank's column slices to its GPU, ranks 0 and TP-1 of each TP degree, from the page cache: ckptio's
    get_slices (one plan) and safetensors' get_slice on the host then .to(device); best of REPS per loader."""
    import ckptio
    from safetensors import safe_open
    files = shard_files(d)
    warm_cache(files)
    shapes = {k: tuple(v.shape) for k, v in reference.items()}

    def load_ckptio(req):
        with ckptio.open(d, device="cuda:0") as f:
            return f.get_slices(req)

    def load_safetensors(req):
        out = {}
        for p in files:
            with safe_open(p, framework="pt", device="cpu") as f:
                for k in f.keys():
                    if k in req:
                        out[k] = f.get_slice(k)[req[k]].to("cuda:0")
        return out
    if os.environ.get("PEERS") == "0":
        loaders = [("ckptio.open(dir).get_slices(columns)", load_ckptio)]
    else:
        loaders = [("ckptio.open(dir).get_slices(columns)", load_ckptio),
                   ("safetensors get_slice(columns) + .to(cuda)", load_safetensors)]
    for tp in [int(x) for x in os.environ.get("TP", "2,4,8").split(",")]:
        for rank in (0, tp - 1):
            req = column_requests(shapes, tp, rank)
            want = {k: reference[k][idx] for k, idx in req.items()}
            nbytes = sum(t.numel() * t.element_size() for t in want.values())
            for label, load in loaders:
                best = None
                for rep in range(REPS):
                    seconds, out, cpu = c.timed(lambda: load(req), cuda=True)
                    ok = all(torch.equal(out[k], v) for k, v in want.items())
                    del out
                    if best is None or seconds < best[0]:
                        best = (seconds, cpu, ok)
                row = {"case": "columns", "loader": label, "tp": tp, "rank": rank, "tensors": len(req),
                       "bytes": nbytes, "seconds": round(best[0], 4), "GBps": round(c.gbps(nbytes, best[0]), 2),
                       "cpu_s_per_GB": round(best[1] / (nbytes / c.GB), 3), "bytes_equal": best[2],
                       "note": f"best of {REPS}"}
                results.append(row)
                log(f"columns TP {tp} rank {rank} {label:45s} {row['GBps']:7.2f} GB/s {row['seconds']:7.3f} s  "
                    f"equal={row['bytes_equal']}")


def main():
    d = os.environ.get("MODEL_DIR", "/var/tmp/ckptio-model")
    gib = float(os.environ.get("GIB", "16"))
    if not shard_files(d):
        t0 = time.perf_counter()
        make_model(d, gib)
        log(f"model written in {time.perf_counter() - t0:.1f} s")
    files = shard_files(d)
    nbytes = tensor_bytes(files)
    log(f"model: {len(files)} shards, {nbytes / 1e9:.2f} GB of tensors, {sum(map(os.path.getsize, files)) / 1e9:.2f} GB")
    meta = c.machine(d)
    meta.update(gpu=torch.cuda.get_device_name(0), model_bytes=nbytes, shards=len(files), command=" ".join(sys.argv),
                env={k: v for k, v in os.environ.items() if k in ("CASES", "REPS", "FIRST", "FIRST_ONLY",
                                                                  "FIRST_WHICH", "SECOND", "PEERS", "TP", "GIB")})
    log("machine:", meta)
    from safetensors.torch import load_file
    reference = {}
    for f in files:
        reference.update(load_file(f, device="cuda:0"))
    ceiling_h2d()

    def dump():
        c.write_result(os.environ.get("BENCH_JSON", "bench_model_gpu.json"), meta, results)
    for case in os.environ.get("CASES", "cold,warm,tmpfs").split(","):
        if case == "tmpfs":
            shm = "/dev/shm/ckptio-model"
            shutil.rmtree(shm, ignore_errors=True)
            shutil.copytree(d, shm)
            run_case(case, shm, nbytes, reference)
            shutil.rmtree(shm, ignore_errors=True)
        elif case in ("cold", "warm"):
            run_case(case, d, nbytes, reference)
        elif case == "columns":
            run_columns(d, reference)
        else:
            continue
        dump()
    bad = [r for r in results if r.get("bytes_equal") is False]
    if bad:
        log("LOADERS WITH WRONG BYTES:", [r["loader"] for r in bad])

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--first":
        first_load_child(sys.argv[2], sys.argv[3])
    else:
        main()
