"""bench_gpu.py - ckptio against its ceilings and peers on a GPU machine, in one run.

8 GiB bf16 state dict of 18 tensors on cuda:0 (the shapes of shared/bench/peers_gpu.py).
Measured in the same run, same file system:
  ceilings   O_DIRECT write/read with 8 MiB blocks at 4 and 16 threads, buffered cold read
             (16 threads), page-cache read (16 threads), pinned and pageable H2D/D2H (torch)
  peers      torch.save / torch.load(map_location=cuda), torch.load(mmap=True)+.cuda(),
             safetensors save_file / load_file(device=cuda), torch DCP (thread_count 8 only, to
             keep the run short), torch.cuda.gds.GdsFile (expected to fail without nvidia-fs)
  ckptio     through ctypes over libckptio.so (CKPTIO_TEST_LIB): safetensors save from GPU (atomic,
             fsynced) and load to GPU cold and warm; the same bytes as one raw plan; the GDS API;
             and the ckptio Python package (`import ckptio`: save/load in safetensors and
             torch.save formats) when it is importable
Save = write + fsync; cold = page cache dropped (needs root); warm = file in page cache.
Slow peers run once (cold then warm); ckptio runs twice and the better run counts.
Env: SIZE_GIB (8), DIR (/tmp/ckptio-bench), CKPTIO_TEST_LIB, OUT (writes bench_gpu.json there).
"""
import ctypes, glob, json, os, shutil, subprocess, threading, time, mmap

import torch

GiB = 1 << 30
MiB = 1 << 20
SIZE = int(float(os.environ.get("SIZE_GIB", "8")) * GiB)
D = os.environ.get("DIR", "/tmp/ckptio-bench")
os.makedirs(D, exist_ok=True)
T_START = time.perf_counter()
res = {}
notes = []


def log(*a):
    print(f"[{time.perf_counter() - T_START:6.1f}s]", *a, flush=True)


def drop():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        notes.append(f"cannot drop the page cache ({e}): 'cold' numbers are warm")
        return False


def rmf(p):
    if os.path.isdir(p):
        shutil.rmtree(p, ignore_errors=True)
    elif os.path.exists(p):
        os.remove(p)


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, r


def fsync_path(p):
    files = glob.glob(p + "/*") + glob.glob(p + "/.*") if os.path.isdir(p) else [p]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


# ---------------------------------------------------------------- ceilings
BS = 8 * MiB


def par_io(path, nthreads, write, direct, size=SIZE):
    flags = (os.O_RDWR | os.O_CREAT) if write else os.O_RDONLY
    if direct:
        flags |= os.O_DIRECT
    fd = os.open(path, flags, 0o644)
    if write:
        os.ftruncate(fd, size)
    nblk = size // BS

    def worker(i):
        buf = mmap.mmap(-1, BS)
        if write:
            buf.write(os.urandom(MiB) * (BS // MiB))
            buf.seek(0)
        for b in range(i, nblk, nthreads):
            (os.pwritev if write else os.preadv)(fd, [buf], b * BS)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(nthreads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    if write:
        os.fsync(fd)
    el = time.perf_counter() - t0
    os.close(fd)
    return nblk * BS / el / 1e9


def ceilings():
    f = D + "/ceiling.bin"
    for nt in (4, 16):
        res[f"ceil_odirect_write_{nt}t"] = par_io(f, nt, True, True)
        drop()
        res[f"ceil_odirect_read_{nt}t"] = par_io(f, nt, False, True)
    drop()
    res["ceil_buffered_read_cold_16t"] = par_io(f, 16, False, False)
    res["ceil_pagecache_read_16t"] = par_io(f, 16, False, False)
    rmf(f)
    dev = torch.device("cuda")
    g = torch.empty(2 * GiB, dtype=torch.uint8, device=dev)
    hp = torch.empty(2 * GiB, dtype=torch.uint8, pin_memory=True)
    hu = torch.empty(2 * GiB, dtype=torch.uint8)
    hu.fill_(1)
    for name, src, dst in [("h2d_pinned", hp, g), ("d2h_pinned", g, hp), ("h2d_pageable", hu, g)]:
        dst.copy_(src)
        best = min(timed(lambda: dst.copy_(src, non_blocking=True))[0] for _ in range(3))
        res["ceil_" + name] = 2 * GiB / best / 1e9
    del g, hp, hu
    torch.cuda.empty_cache()
    log("ceilings", {k: round(v, 2) for k, v in res.items()})


# ---------------------------------------------------------------- state dict
def make_state_dict():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    sd, tot, i = {}, 0, 0
    shapes = [(8192, 8192), (8192, 28672), (28672, 8192), (8192,), (1024, 8192), (128256, 8192)]
    while tot < SIZE:
        s = shapes[i % len(shapes)]
        x = torch.randn(*s, dtype=torch.bfloat16, device=dev)
        if tot + x.nbytes > SIZE and len(s) > 1:
            x = torch.randn(max(1, (SIZE - tot) // (2 * s[-1])), s[-1], dtype=torch.bfloat16, device=dev)
        sd[f"layers.{i}.w"] = x
        tot += x.nbytes
        i += 1
    return sd, tot


sd = None
NB = 0


def prewarm(path):
    """Warm = the file is in the page cache. ckptio's O_DIRECT loads leave it
    uncached (by design: no cache pollution), so read every file of the
    checkpoint once through the page cache, the same for every peer."""
    files = [path] if os.path.isfile(path) else [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    def read_all(p):
        with open(p, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass
    ts = [threading.Thread(target=read_all, args=(p,)) for p in files]
    [t.start() for t in ts]
    [t.join() for t in ts]


def check(loaded):
    for k in list(sd)[:5] + list(sd)[-3:]:
        assert torch.equal(sd[k], loaded[k].to("cuda")), k


def bench(name, save, load, path, reps=1, adjacent=False):
    """adjacent: also measure the raw O_DIRECT write (16 threads) and read
    ceilings right before each save and cold load. The virtio disk's speed
    drifts by tens of percent within a minute, so a ratio to a ceiling taken
    minutes earlier says more about the drift than about ckptio."""
    best = {}
    ratios = {"save": [], "cold": []}
    for _ in range(reps):
        rmf(path)
        drop()
        if adjacent:
            wc = par_io(D + "/adjacent.bin", 16, True, True, size=2 * GiB)
            rmf(D + "/adjacent.bin")
        el, _ = timed(lambda: (save(path), fsync_path(path)))
        best["save"] = max(best.get("save", 0), NB / el / 1e9)
        if adjacent:
            ratios["save"].append(NB / el / 1e9 / wc)
        for v in ("cold", "warm"):
            if v == "cold":
                if adjacent:
                    drop()
                    rc = max(par_io(path, 16, False, True, size=2 * GiB), par_io(path, 4, False, True, size=2 * GiB))
                drop()
            else:
                prewarm(path)
            el, out = timed(lambda: load(path))
            check(out)
            del out
            best[v] = max(best.get(v, 0), NB / el / 1e9)
            if adjacent and v == "cold":
                ratios["cold"].append(NB / el / 1e9 / rc)
    if adjacent:
        res[name + "_save_to_adjacent_write_ceiling"] = ratios["save"]
        res[name + "_cold_to_adjacent_read_ceiling"] = ratios["cold"]
        log(name, "ratios to adjacent ceilings", {k: [round(x, 3) for x in v] for k, v in ratios.items()})
    rmf(path)
    res[name + "_save_GBps"] = best["save"]
    res[name + "_load_cold_GBps"] = best["cold"]
    res[name + "_load_warm_GBps"] = best["warm"]
    log(name, {k: round(v, 2) for k, v in best.items()})


def run_peer(name, fn):
    try:
        fn()
    except Exception as e:  # a peer failing is a result, not the end of the run
        import traceback
        traceback.print_exc()
        res[name + "_error"] = f"{type(e).__name__}: {e}"[:400]
        log(name, "FAILED:", res[name + "_error"])


def peers():
    run_peer("torch", lambda: bench("torch", lambda p: torch.save(sd, p),
                                    lambda p: torch.load(p, map_location="cuda", weights_only=True), D + "/t.pt"))
    run_peer("torch_mmap", lambda: bench(
        "torch_mmap", lambda p: torch.save(sd, p),
        lambda p: {k: v.to("cuda") for k, v in torch.load(p, mmap=True, weights_only=True).items()}, D + "/tm.pt"))

    def st():
        import safetensors.torch as sst
        bench("safetensors", lambda p: sst.save_file(sd, p), lambda p: sst.load_file(p, device="cuda"),
              D + "/s.safetensors")
    run_peer("safetensors", st)

    def dcp8():
        import torch.distributed.checkpoint as dcp

        def dsave(p):
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(p, thread_count=8, sync_files=True))

        def dload(p):
            out = {k: torch.empty_like(v) for k, v in sd.items()}
            dcp.load(out, storage_reader=dcp.FileSystemReader(p))
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
            off = 0
            t0 = time.perf_counter()
            for v in sd.values():
                f.save_storage(v.untyped_storage(), off)
                off += v.nbytes
            res["gdsfile_save_GBps"] = NB / (time.perf_counter() - t0) / 1e9
        finally:
            rmf(p)
    run_peer("gdsfile", gds)


# ---------------------------------------------------------------- ckptio via ctypes
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
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "bytes_read", "bytes_written", "bytes_direct", "bytes_buffered", "bytes_bounced", "bytes_h2d", "bytes_d2h",
        "bytes_cufile", "staging_reserved", "staging_in_use", "staging_peak", "io_requests", "retries")] + [
        ("seconds_io", ctypes.c_double), ("seconds_fsync", ctypes.c_double), ("seconds_copy", ctypes.c_double)]


MEM_CUDA, DTYPE_BF16 = 2, 10
OPT_THREADS, OPT_STAGING, OPT_GPU_PATH = 1, 4, 8
OPEN_READ, OPEN_WRITE = 1, 2


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
            arr[i] = TensorSource(k.encode(), DTYPE_BF16, v.dim(), shape, v.data_ptr(), v.nbytes, MEM_CUDA)
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
            shape = [info.shape[j] for j in range(info.ndim)]
            t = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
            out[info.name.decode()] = t
            targets[i] = TensorTarget(i, t.data_ptr(), t.nbytes, MEM_CUDA)
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
                e = Extent(f, off, v.nbytes, v.data_ptr(), MEM_CUDA)
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
        for cand in ("build-gpu/lib/libckptio.so", "build/libckptio.so"):
            if os.path.exists(cand):
                libpath = cand
                break
    try:
        ck = Ckptio(libpath)
    except Exception as e:
        res["ckptio_error"] = f"cannot load libckptio ({libpath!r}): {e}"
        log(res["ckptio_error"])
        return
    log("libckptio", ck.lib.ckptio_version().decode(), libpath)
    ck.set(OPT_GPU_PATH, 0)  # AUTO: what a user gets
    run_peer("ckptio_st", lambda: bench("ckptio_st", lambda p: ck.st_save(p, sd), ck.st_load,
                                        D + "/c.safetensors", reps=2, adjacent=True))
    s = ck.stats()
    res["ckptio_staging_reserved_MiB"] = s.staging_reserved / MiB
    res["ckptio_staging_peak_MiB"] = s.staging_peak / MiB
    res["ckptio_gpu_path"] = ck.gpu_path()

    def interop():
        # safetensors must read what ckptio wrote (spot check of 3 tensors)
        from safetensors import safe_open
        p = D + "/interop.safetensors"
        ck.st_save(p, sd)
        with safe_open(p, framework="pt", device="cpu") as f:
            for k in list(sd)[:2] + list(sd)[-1:]:
                assert torch.equal(f.get_tensor(k).to("cuda"), sd[k]), k
        rmf(p)
        res["ckptio_safetensors_interop"] = "ok"
    run_peer("ckptio_interop", interop)

    def raw():
        out = {k: torch.empty_like(v) for k, v in sd.items()}
        bench("ckptio_plan", lambda p: ck.plan_io(p, sd, True), lambda p: (ck.plan_io(p, out, False), out)[1],
              D + "/c.raw", reps=2)
    run_peer("ckptio_plan", raw)

    def threads16():
        ck.set(OPT_THREADS, 16)
        ck.set(OPT_STAGING, 512 * MiB)
        bench("ckptio_st_16t", lambda p: ck.st_save(p, sd), ck.st_load, D + "/c16.safetensors", reps=1)
    run_peer("ckptio_st_16t", threads16)
    s = ck.stats()
    res["ckptio_staging_reserved_MiB_16t"] = s.staging_reserved / MiB
    res["ckptio_seconds_copy_wait"] = s.seconds_copy
    ck.lib.ckptio_engine_destroy(ck.engine)


def run_ckptio_python():
    """What a PyTorch user calls: the ckptio package's save/load, in both formats."""
    try:
        import ckptio as ckpy
    except Exception as e:  # the package is optional for this driver
        notes.append(f"ckptio Python package not importable ({e}); its rows are missing")
        return
    run_peer("ckptio_py_st", lambda: bench("ckptio_py_st", lambda p: ckpy.save(sd, p),
                                           lambda p: ckpy.load(p, device="cuda"), D + "/py.safetensors"))
    run_peer("ckptio_py_torch", lambda: bench("ckptio_py_torch", lambda p: ckpy.save(sd, p, format="torch"),
                                              lambda p: ckpy.load(p, device="cuda"), D + "/py.pt"))


def table():
    wr = max(v for k, v in res.items() if k.startswith("ceil_odirect_write"))
    rd = max(res.get("ceil_odirect_read_4t", 0), res.get("ceil_odirect_read_16t", 0),
             res.get("ceil_buffered_read_cold_16t", 0))
    st_warm = res.get("safetensors_load_warm_GBps", 0)
    print()
    print(f"ceilings: O_DIRECT write {wr:.2f} GB/s, raw read (best of O_DIRECT/buffered cold) {rd:.2f} GB/s, "
          f"page cache 16t {res.get('ceil_pagecache_read_16t', 0):.1f} GB/s, pinned H2D "
          f"{res.get('ceil_h2d_pinned', 0):.1f} GB/s, D2H {res.get('ceil_d2h_pinned', 0):.1f} GB/s, pageable H2D "
          f"{res.get('ceil_h2d_pageable', 0):.1f} GB/s")
    print(f"{'GB/s':<16}{'save':>8}{'%wr':>6}{'cold':>8}{'%rd':>6}{'warm':>8}{'x st':>7}")
    names = ["torch", "torch_mmap", "safetensors", "dcp_t8", "gdsfile", "ckptio_st", "ckptio_plan", "ckptio_st_16t",
             "ckptio_py_st", "ckptio_py_torch"]
    for n in names:
        if n + "_error" in res and n + "_save_GBps" not in res:
            print(f"{n:<16} failed: {res[n + '_error'][:90]}")
            continue
        s, c, w = (res.get(f"{n}_save_GBps"), res.get(f"{n}_load_cold_GBps"), res.get(f"{n}_load_warm_GBps"))
        if s is None:
            continue
        print(f"{n:<16}{s:8.2f}{100 * s / wr:5.0f}%{c or 0:8.2f}{100 * (c or 0) / rd:5.0f}%{w or 0:8.2f}"
              f"{(w or 0) / st_warm if st_warm else 0:7.1f}")
    g = res.get("ckptio_st_save_GBps", 0), res.get("ckptio_st_load_cold_GBps", 0), res.get("ckptio_st_load_warm_GBps", 0)
    print(f"goals (ckptio_st): save >= 90% of write ceiling: {'MET' if g[0] >= 0.9 * wr else 'NOT MET'}; "
          f"cold >= 95% of read ceiling: {'MET' if g[1] >= 0.95 * rd else 'NOT MET'}; "
          f"warm >= 35 GB/s: {'MET' if g[2] >= 35 else 'NOT MET'}")
    for n in ("ckptio_st",):
        a, b = res.get(n + "_save_to_adjacent_write_ceiling"), res.get(n + "_cold_to_adjacent_read_ceiling")
        if a and b:
            print(f"{n} against ceilings measured right before each run: save "
                  f"{', '.join(f'{100 * x:.0f}%' for x in a)} of O_DIRECT write; cold load "
                  f"{', '.join(f'{100 * x:.0f}%' for x in b)} of O_DIRECT read")
    print(f"pinned staging: reserved {res.get('ckptio_staging_reserved_MiB', 0):.0f} MiB "
          f"(16t run {res.get('ckptio_staging_reserved_MiB_16t', 0):.0f} MiB), peak in use "
          f"{res.get('ckptio_staging_peak_MiB', 0):.0f} MiB; GPU path {res.get('ckptio_gpu_path')}")
    for n in notes:
        print("note:", n)
    print("note: peers ran once (cold+warm), ckptio twice (best counted); DCP only with thread_count 8")


if __name__ == "__main__":
    print("machine:", subprocess.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc",
                                     shell=True, capture_output=True, text=True).stdout.replace("\n", " "))
    ceilings()
    sd, NB = make_state_dict()
    log("state dict", len(sd), "tensors", NB / GiB, "GiB")
    run_ckptio()  # first: the numbers that matter come before any time limit
    run_ckptio_python()
    peers()
    table()
    res["seconds_total"] = time.perf_counter() - T_START
    print("RESULTS", json.dumps(res))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_gpu.json"), "w") as f:
            json.dump(res, f, indent=1)
