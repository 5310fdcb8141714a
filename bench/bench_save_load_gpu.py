"""bench_save_load_gpu.py - one state dict saved from GPU memory and loaded back to it: ckptio beside its peers and
the raw ceilings, in one run (BENCHMARKS.md, "Save from GPU memory" and "Load to one GPU: one file").

An 8 GiB bf16 state dict of 18 tensors on cuda:0 (_common.state_dict). Measured in the same run, same file system:
  ceilings   O_DIRECT write and read (8 MiB blocks, 4 and 16 threads), buffered cold read and page-cache read
             (16 threads), pinned and pageable host-to-device and device-to-host copies (torch)
  peers      torch.save / torch.load(map_location=cuda), torch.load(mmap=True) + .cuda(), safetensors save_file /
             load_file(device=cuda), torch DCP (thread_count 8), torch.cuda.gds.GdsFile (fails without nvidia-fs)
  ckptio     through ctypes over libckptio.so (CKPTIO_TEST_LIB): a safetensors save from the GPU (atomic, fsynced) and
             loads to it cold and warm, ratios to O_DIRECT ceilings measured right before each; the same bytes as
             one raw plan; 16 threads with 512 MiB of staging; and the Python package (ckptio.save / ckptio.load,
             safetensors and torch.save formats) when it is importable
  checksums  (PARTS=checksums) durable Python saves alternated with and without integrity: the XXH3-64 manifest
             of safetensors files, the CRC-32 of torch.save records; medians of REPEAT
save = write + fsync; cold = page cache dropped (needs root); warm = the file in the page cache. The peers run once
(cold, then warm), ckptio twice (the better run counts). Every load is compared with the state dict.

    python3 bench/bench_save_load_gpu.py         # prints a table, writes $OUT/bench_save_load_gpu.json
Environment: SIZE_GIB (8), DIR (/tmp/ckptio-bench), CKPTIO_TEST_LIB (default build-gpu/lib/libckptio.so or
build/libckptio.so), OUT, PARTS (comma list of ckptio,python,peers,checksums; default the first three), REPEAT
(checksums: 3), SMOKE=1 (the same code on the CPU with 64 MiB, host memory: checks the driver, measures nothing).
"""
import ctypes
import os
import sys
import time

import torch

import _common as c

SMOKE = os.environ.get("SMOKE") == "1" or not torch.cuda.is_available()
DEV = "cpu" if SMOKE else "cuda"
SIZE = (64 << 20) if SMOKE else int(float(os.environ.get("SIZE_GIB", "8")) * c.GiB)
D = os.environ.get("DIR", "/tmp/ckptio-bench")
PARTS = os.environ.get("PARTS", "ckptio,python,peers").split(",")
res = {}
sd, NB = None, 0


def timed(fn):
    return c.timed(fn, cuda=not SMOKE)[:2]


def check(loaded):
    for k in list(sd)[:5] + list(sd)[-3:]:
        assert torch.equal(sd[k], loaded[k].to(DEV)), k


def bench(name, save, load, path, reps=1, adjacent=False):
    """adjacent: the O_DIRECT write (16 threads) and read ceilings are measured right before each save and cold load,
    and the ratios to them recorded."""
    best, ratios = {}, {"save": [], "cold": []}
    small = min(2 * c.GiB, SIZE)
    for _ in range(reps):
        c.rmf(path)
        c.drop_caches()
        if adjacent:
            wc = c.io_ceiling(D + "/adjacent.bin", 16, True, True, small)
            c.rmf(D + "/adjacent.bin")
        el, _ = timed(lambda: (save(path), c.fsync_path(path)))
        best["save"] = max(best.get("save", 0), c.gbps(NB, el))
        if adjacent:
            ratios["save"].append(c.gbps(NB, el) / wc)
        for v in ("cold", "warm"):
            if v == "cold":
                if adjacent:
                    c.drop_caches()
                    f = path if os.path.isfile(path) else max(c.files_of(path), key=os.path.getsize)
                    n = min(small, os.path.getsize(f) // c.BLOCK * c.BLOCK)
                    rc = max(c.io_ceiling(f, 16, False, True, n), c.io_ceiling(f, 4, False, True, n))
                c.drop_caches()
            else:
                c.warm(path)
            el, out = timed(lambda: load(path))
            check(out)
            del out
            best[v] = max(best.get(v, 0), c.gbps(NB, el))
            if adjacent and v == "cold":
                ratios["cold"].append(c.gbps(NB, el) / rc)
    if adjacent:
        res[name + "_save_to_adjacent_write_ceiling"] = ratios["save"]
        res[name + "_cold_to_adjacent_read_ceiling"] = ratios["cold"]
        c.log(name, "ratios to adjacent ceilings", {k: [round(x, 3) for x in v] for k, v in ratios.items()})
    c.rmf(path)
    res[name + "_save_GBps"] = best["save"]
    res[name + "_load_cold_GBps"] = best["cold"]
    res[name + "_load_warm_GBps"] = best["warm"]
    c.log(name, {k: round(v, 2) for k, v in best.items()})


def run_peer(name, fn):
    try:
        fn()
    except Exception as e:  # a peer failing is a result, not the end of the run
        import traceback
        traceback.print_exc()
        res[name + "_error"] = f"{type(e).__name__}: {e}"[:400]
        c.log(name, "FAILED:", res[name + "_error"])


def peers():
    run_peer("torch", lambda: bench("torch", lambda p: torch.save(sd, p),
                                    lambda p: torch.load(p, map_location=DEV, weights_only=True), D + "/t.pt"))
    run_peer("torch_mmap", lambda: bench(
        "torch_mmap", lambda p: torch.save(sd, p),
        lambda p: {k: v.to(DEV) for k, v in torch.load(p, mmap=True, weights_only=True).items()}, D + "/tm.pt"))

    def st():
        import safetensors.torch as sst
        bench("safetensors", lambda p: sst.save_file(sd, p), lambda p: sst.load_file(p, device=DEV),
              D + "/s.safetensors")
    run_peer("safetensors", st)

    def dcp8():
        import torch.distributed.checkpoint as dcp

        def dsave(p):
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(p, thread_count=8, sync_files=True), no_dist=True)

        def dload(p):
            out = {k: torch.empty_like(v) for k, v in sd.items()}
            dcp.load(out, storage_reader=dcp.FileSystemReader(p), no_dist=True)
            return out
        bench("dcp_t8", dsave, dload, D + "/dcp8")
    run_peer("dcp_t8", dcp8)

    def gds():
        p = D + "/g.bin"
        fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
        os.ftruncate(fd, NB)
        os.close(fd)
        try:
            f = torch.cuda.gds.GdsFile(p, os.O_RDWR)

            def write_all():
                off = 0
                for v in sd.values():
                    f.save_storage(v.untyped_storage(), off)
                    off += v.nbytes
            res["gdsfile_save_GBps"] = c.gbps(NB, timed(write_all)[0])
        finally:
            c.rmf(p)
    if not SMOKE:
        run_peer("gdsfile", gds)


# ---- ckptio's C API through ctypes -------------------------------------------------------------------------------
class Extent(ctypes.Structure):
    _fields_ = [("file", ctypes.c_void_p), ("file_offset", ctypes.c_uint64), ("length", ctypes.c_uint64),
                ("memory", ctypes.c_void_p), ("mem_kind", ctypes.c_int)]


class TensorSource(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_uint32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_uint64),
                ("mem_kind", ctypes.c_int)]


class TensorTarget(ctypes.Structure):
    _fields_ = [("index", ctypes.c_size_t), ("data", ctypes.c_void_p), ("capacity", ctypes.c_uint64),
                ("mem_kind", ctypes.c_int)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_uint32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("file_offset", ctypes.c_uint64),
                ("nbytes", ctypes.c_uint64)]


class Stats(ctypes.Structure):
    """ckptio_stats (include/ckptio/core.h), the fields read here, then room for any the library has beyond them: it
    writes the whole struct it knows."""
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "bytes_read", "bytes_written", "bytes_direct", "bytes_buffered", "bytes_bounced", "bytes_h2d", "bytes_d2h",
        "bytes_cufile", "staging_reserved", "staging_in_use", "staging_peak", "io_requests", "retries")] + [
        ("seconds_io", ctypes.c_double), ("seconds_fsync", ctypes.c_double), ("seconds_copy", ctypes.c_double),
        ("room", ctypes.c_uint64 * 32)]


MEM_HOST, MEM_CUDA, DTYPE_BF16 = 0, 2, 10  # ckptio_mem_kind, ckptio_dtype
OPT_THREADS, OPT_STAGING, OPT_GPU_PATH = 1, 4, 8  # ckptio_option
OPEN_READ, OPEN_WRITE = 1, 2
MEM = MEM_HOST if SMOKE else MEM_CUDA


class Ckptio:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.ckptio_last_error_message.restype = ctypes.c_char_p
        L.ckptio_version.restype = ctypes.c_char_p
        L.ckptio_io_path_name.restype = ctypes.c_char_p
        L.ckptio_engine_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
        self.engine = ctypes.c_void_p()
        self.ok(L.ckptio_engine_create(ctypes.byref(self.engine)), "engine_create")

    def ok(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: status {st}: {self.lib.ckptio_last_error_message().decode()}")

    def set(self, opt, value):
        self.ok(self.lib.ckptio_engine_set(self.engine, opt, value), "engine_set")

    def stats(self):
        s = Stats()
        self.ok(self.lib.ckptio_engine_stats(self.engine, ctypes.byref(s)), "stats")
        return s

    def gpu_path(self):
        p = ctypes.c_int()
        self.ok(self.lib.ckptio_engine_gpu_path(self.engine, ctypes.byref(p)), "gpu_path")
        return self.lib.ckptio_io_path_name(p.value).decode()

    def st_save(self, path, tensors):
        keep = []
        arr = (TensorSource * len(tensors))()
        for i, (k, v) in enumerate(tensors.items()):
            shape = (ctypes.c_int64 * v.dim())(*v.shape)
            keep.append(shape)
            arr[i] = TensorSource(k.encode(), DTYPE_BF16, v.dim(), shape, v.data_ptr(), v.nbytes, MEM)
        self.ok(self.lib.ckptio_safetensors_save(self.engine, path.encode(), arr, len(tensors), None, 0, 0),
                "safetensors_save")

    def st_load(self, path):
        h = ctypes.c_void_p()
        self.ok(self.lib.ckptio_safetensors_open(self.engine, path.encode(), ctypes.byref(h)), "safetensors_open")
        n = ctypes.c_size_t()
        self.lib.ckptio_safetensors_count(h, ctypes.byref(n))
        out, targets = {}, (TensorTarget * n.value)()
        for i in range(n.value):
            info = TensorInfo()
            self.ok(self.lib.ckptio_safetensors_tensor(h, ctypes.c_size_t(i), ctypes.byref(info)), "tensor")
            t = torch.empty([info.shape[j] for j in range(info.ndim)], dtype=torch.bfloat16, device=DEV)
            out[info.name.decode()] = t
            targets[i] = TensorTarget(i, t.data_ptr(), t.nbytes, MEM)
        try:
            self.ok(self.lib.ckptio_safetensors_read(h, targets, n.value), "safetensors_read")
        finally:
            self.lib.ckptio_safetensors_close(h)
        return out

    def plan_io(self, path, tensors, write):
        """All tensors as one plan, each at a 4 KiB-aligned offset (a raw layout)."""
        L = self.lib
        f, plan = ctypes.c_void_p(), ctypes.c_void_p()
        self.ok(L.ckptio_file_open(self.engine, path.encode(), OPEN_WRITE if write else OPEN_READ, ctypes.byref(f)),
                "file_open")
        try:
            self.ok(L.ckptio_plan_create(1 if write else 0, ctypes.byref(plan)), "plan_create")
            off = 0
            for v in tensors.values():
                e = Extent(f, off, v.nbytes, v.data_ptr(), MEM)
                self.ok(L.ckptio_plan_add(plan, ctypes.byref(e)), "plan_add")
                off = (off + v.nbytes + 4095) // 4096 * 4096
            self.ok(L.ckptio_engine_execute(self.engine, plan), "execute")
            if write:
                self.ok(L.ckptio_file_commit(f), "commit")
        finally:
            L.ckptio_plan_destroy(plan)
            L.ckptio_file_close(f)


def run_ckptio():
    libpath = os.environ.get("CKPTIO_TEST_LIB", "")
    if not libpath:
        libpath = next((p for p in ("build-gpu/lib/libckptio.so", "build/libckptio.so") if os.path.exists(p)), "")
    try:
        ck = Ckptio(libpath)
    except Exception as e:
        res["ckptio_error"] = f"cannot load libckptio ({libpath!r}): {e}"
        c.log(res["ckptio_error"])
        return
    c.log("libckptio", ck.lib.ckptio_version().decode(), libpath)
    ck.set(OPT_GPU_PATH, 0)  # AUTO: what a user gets
    run_peer("ckptio_st", lambda: bench("ckptio_st", lambda p: ck.st_save(p, sd), ck.st_load,
                                        D + "/c.safetensors", reps=2, adjacent=True))
    s = ck.stats()
    res["ckptio_staging_reserved_MiB"] = s.staging_reserved / c.MiB
    res["ckptio_staging_peak_MiB"] = s.staging_peak / c.MiB
    res["ckptio_gpu_path"] = ck.gpu_path()

    def interop():  # safetensors reads what ckptio wrote (3 tensors)
        from safetensors import safe_open
        p = D + "/interop.safetensors"
        ck.st_save(p, sd)
        with safe_open(p, framework="pt", device="cpu") as f:
            for k in list(sd)[:2] + list(sd)[-1:]:
                assert torch.equal(f.get_tensor(k).to(DEV), sd[k]), k
        c.rmf(p)
        res["ckptio_safetensors_interop"] = "ok"
    run_peer("ckptio_interop", interop)

    def raw():
        out = {k: torch.empty_like(v) for k, v in sd.items()}
        bench("ckptio_plan", lambda p: ck.plan_io(p, sd, True), lambda p: (ck.plan_io(p, out, False), out)[1],
              D + "/c.raw", reps=2)
    run_peer("ckptio_plan", raw)

    def threads16():
        ck.set(OPT_THREADS, 16)
        ck.set(OPT_STAGING, 512 * c.MiB)
        bench("ckptio_st_16t", lambda p: ck.st_save(p, sd), ck.st_load, D + "/c16.safetensors", reps=1)
    run_peer("ckptio_st_16t", threads16)
    s = ck.stats()
    res["ckptio_staging_reserved_MiB_16t"] = s.staging_reserved / c.MiB
    res["ckptio_seconds_copy_wait"] = s.seconds_copy
    ck.lib.ckptio_engine_destroy(ck.engine)


def import_ckptio():
    try:
        import ckptio
        return ckptio
    except Exception as e:  # the package is optional for this driver
        c.notes.append(f"ckptio Python package not importable ({e}); its rows are missing")
        return None


def run_ckptio_python():
    """What a PyTorch user calls: the ckptio package's save/load, in both formats."""
    ckpy = import_ckptio()
    if ckpy is None:
        return
    run_peer("ckptio_py_st", lambda: bench("ckptio_py_st", lambda p: ckpy.save(sd, p),
                                           lambda p: ckpy.load(p, device=DEV), D + "/py.safetensors"))
    run_peer("ckptio_py_torch", lambda: bench("ckptio_py_torch", lambda p: ckpy.save(sd, p, format="torch"),
                                              lambda p: ckpy.load(p, device=DEV), D + "/py.pt"))


def run_checksums():
    """Durable saves alternated with and without integrity, both computed on the pinned staging copy while the
    data is written: medians, and the cost in percent."""
    import statistics
    ckpy = import_ckptio()
    if ckpy is None:
        return
    variants = {"safetensors": dict(format="safetensors"),
                "safetensors + XXH3 manifest": dict(format="safetensors", checksums=True),
                "torch.save, crc=False": dict(format="torch", crc=False),
                "torch.save, CRC-32": dict(format="torch", crc=True)}
    samples = {k: [] for k in variants}
    for _ in range(int(os.environ.get("REPEAT", "3"))):
        for name, kw in variants.items():
            p = os.path.join(D, "m.pt" if kw["format"] == "torch" else "m.safetensors")
            el, _ = timed(lambda: ckpy.save(sd, p, **kw))
            samples[name].append(c.gbps(NB, el))
            if kw.get("checksums") or kw.get("crc"):  # the integrity data is there and matches
                with ckpy.open(p) as f:
                    r = f.verify()
                assert (r["tensors"] == len(sd)) if kw.get("checksums") else (r["crc_absent"] == 0), r
            for q in (p, p + ".ckptio-manifest.json"):
                c.rmf(q)
    med = {k: statistics.median(v) for k, v in samples.items()}
    res["checksums"] = {"median_GBps": med, "samples_GBps": samples}
    for k, v in samples.items():
        print(f"{k:30s} median {med[k]:5.2f} GB/s   runs {' '.join(f'{x:.2f}' for x in v)}")
    print(f"cost of the XXH3 manifest: {100 * (1 - med['safetensors + XXH3 manifest'] / med['safetensors']):.1f}%; "
          f"of CRC-32 in torch.save files: {100 * (1 - med['torch.save, CRC-32'] / med['torch.save, crc=False']):.1f}%")


def table():
    wr = max((v for k, v in res.items() if k.startswith("ceil_odirect_write")), default=0)
    rd = max(res.get("ceil_odirect_read_4t", 0), res.get("ceil_odirect_read_16t", 0),
             res.get("ceil_buffered_read_cold_16t", 0))
    st_warm = res.get("safetensors_load_warm_GBps", 0)
    print()
    print(f"ceilings: O_DIRECT write {wr:.2f} GB/s, raw read (best of O_DIRECT/buffered cold) {rd:.2f} GB/s, "
          f"page cache 16t {res.get('ceil_page_cache_read_16t', 0):.1f} GB/s, pinned H2D "
          f"{res.get('ceil_h2d_pinned', 0):.1f} GB/s, D2H {res.get('ceil_d2h_pinned', 0):.1f} GB/s, pageable H2D "
          f"{res.get('ceil_h2d_pageable', 0):.1f} GB/s")
    print(f"{'GB/s':<16}{'save':>8}{'%wr':>6}{'cold':>8}{'%rd':>6}{'warm':>8}{'x st':>7}")
    names = ["torch", "torch_mmap", "safetensors", "dcp_t8", "gdsfile", "ckptio_st", "ckptio_plan", "ckptio_st_16t",
             "ckptio_py_st", "ckptio_py_torch"]
    for n in names:
        if n + "_error" in res and n + "_save_GBps" not in res:
            print(f"{n:<16} failed: {res[n + '_error'][:90]}")
            continue
        s, cold, w = (res.get(f"{n}_save_GBps"), res.get(f"{n}_load_cold_GBps"), res.get(f"{n}_load_warm_GBps"))
        if s is None:
            continue
        print(f"{n:<16}{s:8.2f}{c.pct(s, wr):>6}{cold or 0:8.2f}{c.pct(cold or 0, rd):>6}{w or 0:8.2f}"
              f"{c.times(w or 0, st_warm):>7}")
    for n in ("ckptio_st",):
        a, b = res.get(n + "_save_to_adjacent_write_ceiling"), res.get(n + "_cold_to_adjacent_read_ceiling")
        if a and b:
            print(f"{n} against ceilings measured right before each run: save "
                  f"{', '.join(f'{100 * x:.0f}%' for x in a)} of O_DIRECT write; cold load "
                  f"{', '.join(f'{100 * x:.0f}%' for x in b)} of O_DIRECT read")
    print(f"pinned staging: reserved {res.get('ckptio_staging_reserved_MiB', 0):.0f} MiB "
          f"(16t run {res.get('ckptio_staging_reserved_MiB_16t', 0):.0f} MiB), peak in use "
          f"{res.get('ckptio_staging_peak_MiB', 0):.0f} MiB; GPU path {res.get('ckptio_gpu_path')}")
    c.print_notes()
    print("note: peers ran once (cold+warm), ckptio twice (best counted); DCP only with thread_count 8")


def main():
    global sd, NB
    os.makedirs(D, exist_ok=True)
    meta = c.machine(D)
    meta.update(size_bytes=SIZE, smoke=SMOKE, parts=PARTS, command=" ".join(sys.argv))
    print("machine:", meta, flush=True)
    for k, v in c.disk_ceilings(D, SIZE).items():
        res["ceil_" + k] = v
    if not SMOKE:
        for k, v in c.copy_ceilings().items():
            res["ceil_" + k] = v
    c.log("ceilings", {k: round(v, 2) for k, v in res.items()})
    sd, NB = c.state_dict(SIZE, DEV)
    c.log("state dict", len(sd), "tensors", NB / c.GiB, "GiB")
    if "ckptio" in PARTS:
        run_ckptio()  # first: the numbers that matter come before any time limit
    if "python" in PARTS:
        run_ckptio_python()
    if "peers" in PARTS:
        peers()
    if "checksums" in PARTS:
        run_checksums()
    table()
    res["seconds_total"] = time.perf_counter() - c.T_START
    print("wrote", c.write_result("bench_save_load_gpu.json", meta, res))


if __name__ == "__main__":
    main()
