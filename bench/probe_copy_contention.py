"""What bounds a staged load from the page cache: the host's memory, the PCIe link, or pinning?

A load from the page cache copies each byte twice on the host (page cache -> pinned staging by the CPU,
staging -> GPU by DMA). This probe measures each part alone and together, on the model files of
bench_model_gpu.py (MODEL_DIR, read into the page cache first):

  h2d                  pinned host-to-device copies alone (torch, one stream)
  read-hot             16 threads pread 2 MiB pieces into one 2 MiB buffer each (stays in the CPU caches)
  read-ring            the same into a 32 MiB ring per thread (leaves the caches: written to DRAM)
  h2d+read-hot/-ring   both at once: how much each slows the other
  pin                  cuMemHostAlloc of 64 x 4 MiB on 1 thread, and on 16 threads at once (does pinning
                       scale with threads? the first load of a process pays it); 128 MiB pinned as
                       64 x 2 MiB, as one cuMemHostAlloc, and as anonymous memory (transparent huge
                       pages or not) touched then cuMemHostRegister'ed, and as 64 x 2 MiB of anonymous
                       memory populated by mmap (MAP_POPULATE) then registered (ckptio's slots)
  register             one thread registering (cuMemHostRegister, read-only) then unregistering 64 MiB pieces
                       of the model files mmapped and populated: the zero-copy path's pinning, alone
  h2d+register         both at once: does registering stall other threads' copies (the driver serialises
                       pinning: does it serialise copies too)?
  h2d+read-hot+register  a staged load's two copies with registration beside: what a mix of zero-copy
                       and staged windows would meet
  windows              ckptio's read pipeline rebuilt in Python: THREADS workers, each with its own stream
                       and 4 pinned 2 MiB slots, copy 2 MiB windows to the GPU (an event per slot, waited
                       before the slot is reused); "windows-dma" without the CPU copy (what 2 MiB copies
                       from 16 streams reach), "windows-staged" with a pread of the page cache into each
                       slot first (what the pipeline's structure allows, beside ckptio's own numbers).
                       Never run: 16 Python threads issuing a copy per 2 MiB window contend for the GIL;
                       bench/probe_pipeline.c does the same in C, with its geometry as parameters.

    MODEL_DIR=/var/tmp/ckptio-model python3 bench/probe_copy_contention.py   # prints one line per probe,
                                                                           # $OUT/probe_copy_contention.json
    PROBES=pin,read,register,windows (default: all), REGISTER_MiB=64
"""
import ctypes
import glob
import json
import mmap
import os
import threading
import time

import torch

OUT = os.environ.get("OUT", ".")
MiB = 1 << 20
SECONDS = float(os.environ.get("SECONDS_EACH", "2.0"))
THREADS = int(os.environ.get("THREADS", "16"))
rows = []


def log_row(name, **kw):
    rows.append({"probe": name, **kw})
    print(f"{name:22s} " + "  ".join(f"{k} {v}" for k, v in kw.items()), flush=True)


def files_and_pieces(d, piece=2 * MiB):
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    pieces = [(f, o) for f in files for o in range(0, os.path.getsize(f) - piece, piece)]
    return files, pieces


class Reader:
    """THREADS threads reading the pieces round-robin until stopped; counts bytes."""

    def __init__(self, pieces, ring_bytes):
        self.pieces, self.ring = pieces, ring_bytes
        self.bytes = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def worker(self, k):
        buf = mmap.mmap(-1, self.ring)
        view = memoryview(buf)
        fds = {}
        pos, done, i = 0, 0, k
        while not self.stop.is_set():
            f, o = self.pieces[i % len(self.pieces)]
            i += THREADS
            if f not in fds:
                fds[f] = os.open(f, os.O_RDONLY)
            done += os.preadv(fds[f], [view[pos:pos + 2 * MiB]], o)
            pos = (pos + 2 * MiB) % self.ring
        with self.lock:
            self.bytes += done
        for fd in fds.values():
            os.close(fd)
        view.release()
        buf.close()

    def start(self):
        self.threads = [threading.Thread(target=self.worker, args=(k,)) for k in range(THREADS)]
        self.t0 = time.perf_counter()
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        return self.bytes / (time.perf_counter() - self.t0) / 1e9


def libc_mmap():
    """libc with mmap typed (its result is a pointer); mmap() raising on MAP_FAILED."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    raw = libc.mmap

    def mmap_checked(*args):
        addr = raw(*args)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap{args[1:3]} failed")
        return addr
    libc.mmap = mmap_checked
    return libc


def h2d_for(seconds, src, dst):
    """Copies src -> dst (one stream) for about `seconds`; GB/s."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        n += src.numel()
    return n / (time.perf_counter() - t0) / 1e9


def pin_probe():
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    cuda.cuCtxGetCurrent(ctypes.byref(ctx))

    def alloc(n, out):
        cuda.cuCtxSetCurrent(ctx)
        for _ in range(n):
            p = ctypes.c_void_p()
            rc = cuda.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(4 * MiB), ctypes.c_uint(0))
            if rc == 0:
                out.append(p)

    for threads in (1, THREADS):
        ptrs = []
        per = 64 // threads
        th = [threading.Thread(target=alloc, args=(per, ptrs)) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        secs = time.perf_counter() - t0
        log_row(f"pin {threads} thread(s)", allocations=len(ptrs), MiB=len(ptrs) * 4, seconds=round(secs, 4),
                s_per_GiB=round(secs / (len(ptrs) * 4 / 1024), 3))
        for p in ptrs:
            cuda.cuMemFreeHost(p)

    def timed_pin(name, fn):
        t0 = time.perf_counter()
        undo = fn()
        secs = time.perf_counter() - t0
        log_row(name, MiB=128, seconds=round(secs, 4), s_per_GiB=round(secs * 8, 3))
        undo()

    def host_alloc(n, each):
        ptrs = []
        for _ in range(n):
            p = ctypes.c_void_p()
            if cuda.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(each), ctypes.c_uint(3)) == 0:
                ptrs.append(p)
        return lambda: [cuda.cuMemFreeHost(p) for p in ptrs]

    def register(huge):
        libc = libc_mmap()
        n = 128 * MiB
        addr = libc.mmap(None, n, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
        if huge:
            libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(n), 14)  # MADV_HUGEPAGE
        ctypes.memset(addr, 0, n)
        rc = cuda.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(n), ctypes.c_uint(3))
        if rc != 0:
            print("cuMemHostRegister failed", rc)

        def undo():
            cuda.cuMemHostUnregister(ctypes.c_void_p(addr))
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(n))
        return undo

    def populate_register(n, each):
        """ckptio's slots since 2026-11-26: mmap(MAP_POPULATE) + cuMemHostRegister, one per slot."""
        libc = libc_mmap()
        ptrs = []
        for _ in range(n):
            addr = libc.mmap(None, each, 3, 0x8022, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS|POPULATE
            if cuda.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(each), ctypes.c_uint(3)) == 0:
                ptrs.append(addr)

        def undo():
            for addr in ptrs:
                cuda.cuMemHostUnregister(ctypes.c_void_p(addr))
                libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(each))
        return undo

    timed_pin("pin 64 x 2 MiB", lambda: host_alloc(64, 2 * MiB))
    timed_pin("pin populate+register 64 x 2 MiB", lambda: populate_register(64, 2 * MiB))
    timed_pin("pin 1 x 128 MiB", lambda: host_alloc(1, 128 * MiB))
    timed_pin("pin register 4K pages", lambda: register(False))
    timed_pin("pin register THP", lambda: register(True))


class Registrar:
    """One thread registering and unregistering REGISTER_MiB pieces of the mmapped files until stopped."""

    def __init__(self, files, piece=int(os.environ.get("REGISTER_MiB", "64")) * MiB):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.ctx = ctypes.c_void_p()
        self.cuda.cuCtxGetCurrent(ctypes.byref(self.ctx))
        libc = libc_mmap()
        self.pieces, self.maps = [], []
        for f in files:
            size = os.path.getsize(f)
            fd = os.open(f, os.O_RDONLY)
            addr = libc.mmap(None, size, 1, 0x8001, fd, 0)  # PROT_READ, MAP_SHARED|MAP_POPULATE
            os.close(fd)
            self.maps.append((addr, size))
            self.pieces += [addr + o for o in range(0, size - piece, piece)]
        self.libc, self.piece = libc, piece
        self.bytes, self.failures = 0, 0
        self.stop = threading.Event()

    def worker(self):
        self.cuda.cuCtxSetCurrent(self.ctx)
        i = 0
        while not self.stop.is_set():
            p = ctypes.c_void_p(self.pieces[i % len(self.pieces)])
            i += 1
            if self.cuda.cuMemHostRegister_v2(p, ctypes.c_size_t(self.piece), ctypes.c_uint(0x0B)) != 0:
                self.failures += 1
                continue
            self.cuda.cuMemHostUnregister(p)
            self.bytes += self.piece

    def start(self):
        self.thread = threading.Thread(target=self.worker)
        self.t0 = time.perf_counter()
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join()
        for addr, size in self.maps:
            self.libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        return round(self.bytes / (time.perf_counter() - self.t0) / 1e9, 2), self.failures


def register_probes(files, src, dst, pieces):
    r = Registrar(files)
    r.start()
    time.sleep(SECONDS)
    gbps, fails = r.finish()
    log_row("register", GBps=gbps, failures=fails, piece_MiB=r.piece // MiB)
    r = Registrar(files)
    r.start()
    h = h2d_for(SECONDS, src, dst)
    gbps, fails = r.finish()
    log_row("h2d+register", h2d_GBps=round(h, 2), register_GBps=gbps, failures=fails)
    r, reader = Registrar(files), Reader(pieces, 2 * MiB)
    r.start()
    reader.start()
    h = h2d_for(SECONDS, src, dst)
    gbps, fails = r.finish()
    log_row("h2d+read-hot+register", h2d_GBps=round(h, 2), read_GBps=round(reader.finish(), 2),
            register_GBps=gbps, failures=fails)


def windows_probe(pieces, staged):
    """THREADS workers x 4 pinned 2 MiB slots, one stream each, for SECONDS; GB/s to the GPU."""
    dst = torch.empty(THREADS * 64 * MiB, dtype=torch.uint8, device="cuda:0")
    slots = [[torch.empty(2 * MiB, dtype=torch.uint8, pin_memory=True) for _ in range(4)] for _ in range(THREADS)]
    done = [0] * THREADS
    stop = threading.Event()

    def worker(k):
        stream = torch.cuda.Stream()
        events = [None] * 4
        fds = {}
        views = [memoryview(s.numpy()) for s in slots[k]]
        i, n, moved = k, 0, 0
        region = dst[k * 64 * MiB:(k + 1) * 64 * MiB]
        while not stop.is_set():
            s = n % 4
            if events[s] is not None:
                events[s].synchronize()
            if staged:
                f, o = pieces[i % len(pieces)]
                i += THREADS
                if f not in fds:
                    fds[f] = os.open(f, os.O_RDONLY)
                os.preadv(fds[f], [views[s]], o)
            off = (n % 32) * 2 * MiB
            with torch.cuda.stream(stream):
                region[off:off + 2 * MiB].copy_(slots[k][s], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
            events[s] = ev
            n += 1
            moved += 2 * MiB
        stream.synchronize()
        done[k] = moved
        for fd in fds.values():
            os.close(fd)

    th = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in th:
        t.join()
    return round(sum(done) / (time.perf_counter() - t0) / 1e9, 2)


def main():
    d = os.environ.get("MODEL_DIR", "/var/tmp/ckptio-model")
    files, pieces = files_and_pieces(d)
    for f in files:  # into the page cache
        with open(f, "rb") as fh:
            while fh.read(64 * MiB):
                pass
    torch.zeros(1, device="cuda:0")
    probes = os.environ.get("PROBES", "pin,read,register,windows").split(",")
    if "pin" in probes:
        pin_probe()
    src = torch.empty(2 << 30, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty_like(src, device="cuda:0")
    h2d_for(0.3, src, dst)
    log_row("h2d", GBps=round(h2d_for(SECONDS, src, dst), 2))
    if "register" in probes:
        register_probes(files, src, dst, pieces)
    if "windows" in probes:
        log_row("windows-dma", GBps=windows_probe(pieces, False), threads=THREADS)
        log_row("windows-staged", GBps=windows_probe(pieces, True), threads=THREADS)
    if "read" not in probes:
        probes = []
    for name, ring in (("read-hot", 2 * MiB), ("read-ring8", 8 * MiB), ("read-ring", 32 * MiB)):
        if not probes:
            break
        r = Reader(pieces, ring)
        r.start()
        time.sleep(SECONDS)
        log_row(name, GBps=round(r.finish(), 2))
    for name, ring in (("h2d+read-hot", 2 * MiB), ("h2d+read-ring8", 8 * MiB), ("h2d+read-ring", 32 * MiB)):
        if not probes:
            break
        r = Reader(pieces, ring)
        r.start()
        h = h2d_for(SECONDS, src, dst)
        log_row(name, h2d_GBps=round(h, 2), read_GBps=round(r.finish(), 2))
    with open(os.path.join(OUT, "probe_copy_contention.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "threads": THREADS, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
