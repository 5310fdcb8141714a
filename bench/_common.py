"""What every benchmark in bench/ shares: the machine's description, the page cache, raw ceilings, timing, the
result file and ratios. One place, so that every table in BENCHMARKS.md means the same by "cold", "warm",
"ceiling" and "GB/s".

- GB/s is 10^9 bytes per second of tensor data.
- cold: the files' pages were dropped first (fsync, posix_fadvise(DONTNEED), and /proc/sys/vm/drop_caches
  when the process may write it); warm: every page was read once beforehand.
- A ceiling is measured in the same run as what it bounds, on the same file system: the virtio disks of the
  measured machines drift by tens of percent within minutes, so a ratio to a ceiling of another run says more
  about the disk than about the loader.
- A result file is one JSON document {"meta": machine() plus the run's settings, "results": ...} written to
  $OUT (default: the current directory).

Nothing here imports torch at module level: bench_cpu.py runs with numpy alone.
"""
import json
import mmap
import os
import platform
import shutil
import subprocess
import threading
import time

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
GB = 1e9
BLOCK = 8 * MiB  # the raw ceilings' request size
T_START = time.perf_counter()
notes = []  # said once at the end of a run: a cache that could not be dropped, a peer that is missing


def log(*args):
    print(f"[{time.perf_counter() - T_START:6.1f}s]", *args, flush=True)


def gbps(nbytes, seconds):
    return nbytes / seconds / GB if seconds > 0 else float("inf")


def parse_size(text):
    """'1G', '512M', '8GiB', '4096' -> bytes."""
    units = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in units else ""
    return int(float(t[: len(t) - len(unit)]) * units[unit])


# ---- the machine ---------------------------------------------------------------------------------------------

def _sh(command):
    try:
        return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(directory=None):
    """What the run measured on: date, CPU, memory, kernel, the file system under `directory`, the GPUs and their
    link, nvidia-fs, and the versions of torch, safetensors and ckptio that are importable."""
    m = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "cpus": os.cpu_count(), "kernel": platform.release(),
         "python": platform.python_version()}
    try:
        with open("/proc/meminfo") as f:
            m["memory_GiB"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    if directory:
        m["file_system"] = " ".join(_sh(f"df -T {directory} | tail -1").split()[:2])
    gpus = _sh("nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max "
               "--format=csv,noheader")
    if gpus:
        m["gpus"] = gpus.splitlines()
        m["nvidia_fs"] = os.path.exists("/proc/driver/nvidia-fs")
    for mod in ("torch", "safetensors", "numpy", "ckptio"):
        try:
            m[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - not installed here: not part of the description
            pass
    return m


def write_result(name, meta, results):
    """{"meta": meta, "results": results} as $OUT/NAME (default: the current directory); returns the path."""
    path = os.path.join(os.environ.get("OUT", "."), name)
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    return path


# ---- files and the page cache ----------------------------------------------------------------------------------

def files_of(path):
    if os.path.isdir(path):
        return sorted(os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs)
    return [path] if os.path.exists(path) else []


def rmf(path):
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def fsync_path(path):
    """fsync a file, or every file of a directory and the directory itself."""
    for p in files_of(path) + ([path] if os.path.isdir(path) else []):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_caches(*paths):
    """Make the next read of every file under `paths` come from the disk; without paths, of every file.
    Returns how: posix_fadvise alone leaves pages a writer dirtied meanwhile, drop_caches needs root."""
    os.sync()
    for p in paths:
        for f in files_of(p):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n" if not paths else "1\n")
        return "fsync, posix_fadvise(DONTNEED), /proc/sys/vm/drop_caches"
    except OSError as e:
        note = f"cannot write /proc/sys/vm/drop_caches ({e.strerror}): cold reads may be partly warm"
        if note not in notes:
            notes.append(note)
        return "fsync, posix_fadvise(DONTNEED)"


def warm(*paths, threads=16):
    """Read every file under `paths` once through the page cache (ckptio's O_DIRECT loads leave files uncached, so
    a warm case warms them itself, the same for every loader)."""
    files = [f for p in paths for f in files_of(p)]

    def read_all(batch):
        for f in batch:
            with open(f, "rb", buffering=0) as fh:
                while fh.read(64 * MiB):
                    pass
    ts = [threading.Thread(target=read_all, args=(files[i::threads],)) for i in range(min(threads, len(files)))]
    [t.start() for t in ts]
    [t.join() for t in ts]


# ---- raw ceilings --------------------------------------------------------------------------------------------

def io_ceiling(path, threads, write, direct, size, block=BLOCK):
    """GB/s of `threads` threads moving `size` bytes of one file in `block` requests (writes end with fsync)."""
    flags = (os.O_RDWR | os.O_CREAT) if write else os.O_RDONLY
    if direct:
        flags |= os.O_DIRECT
    fd = os.open(path, flags, 0o644)
    if write:
        os.ftruncate(fd, size)
    nblk = size // block

    def worker(i):
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
        if write:
            buf.write(os.urandom(MiB) * (block // MiB))
        for b in range(i, nblk, threads):
            (os.pwritev if write else os.preadv)(fd, [buf], b * block)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    if write:
        os.fsync(fd)
    seconds = time.perf_counter() - t0
    os.close(fd)
    return gbps(nblk * block, seconds)


def read_files_ceiling(files, direct, threads=16, block=BLOCK):
    """(bytes, seconds) of `threads` threads reading the 4 KiB-aligned part of every file in `block` requests,
    O_DIRECT or through the page cache: what a loader of these files could reach."""
    sizes = {f: os.path.getsize(f) // 4096 * 4096 for f in files}
    jobs = [(f, o) for f in files for o in range(0, sizes[f], block)]
    total = sum(min(block, sizes[f] - o) for f, o in jobs)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        buf = mmap.mmap(-1, block)
        fds = {}
        while True:
            with lock:
                if nxt[0] >= len(jobs):
                    break
                f, o = jobs[nxt[0]]
                nxt[0] += 1
            if f not in fds:
                fds[f] = os.open(f, os.O_RDONLY | (os.O_DIRECT if direct else 0))
            os.preadv(fds[f], [memoryview(buf)[:min(block, sizes[f] - o)]], o)
        for fd in fds.values():
            os.close(fd)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return total, time.perf_counter() - t0


def disk_ceilings(directory, size, threads=(4, 16)):
    """O_DIRECT write and read, a buffered cold read and a page-cache read of one file of `size` bytes in
    `directory`: {name: GB/s}."""
    f = os.path.join(directory, "ceiling.bin")
    out = {}
    for nt in threads:
        out[f"odirect_write_{nt}t"] = io_ceiling(f, nt, True, True, size)
        drop_caches(f)
        out[f"odirect_read_{nt}t"] = io_ceiling(f, nt, False, True, size)
    drop_caches(f)
    out["buffered_read_cold_16t"] = io_ceiling(f, 16, False, False, size)
    out["page_cache_read_16t"] = io_ceiling(f, 16, False, False, size)
    rmf(f)
    return out


def copy_ceilings(size=2 * GiB):
    """torch's copies between host and GPU memory, best of 3: pinned host-to-device and device-to-host, pageable
    host-to-device, {name: GB/s}."""
    import torch
    g = torch.empty(size, dtype=torch.uint8, device="cuda")
    hp = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    hu = torch.empty(size, dtype=torch.uint8)
    hu.fill_(1)
    out = {}
    for name, src, dst in [("h2d_pinned", hp, g), ("d2h_pinned", g, hp), ("h2d_pageable", hu, g)]:
        dst.copy_(src)
        out[name] = max(gbps(size, timed(lambda: dst.copy_(src, non_blocking=True), cuda=True)[0]) for _ in range(3))
    del g, hp, hu
    torch.cuda.empty_cache()
    return out


# ---- timing --------------------------------------------------------------------------------------------------

def timed(fn, cuda=False):
    """(seconds, result, CPU seconds of the process) of fn(); cuda: the device is synchronised before and after."""
    sync = None
    if cuda:
        import torch
        sync = torch.cuda.synchronize
        sync()
    c0 = os.times()
    t0 = time.perf_counter()
    result = fn()
    if sync:
        sync()
    seconds = time.perf_counter() - t0
    c1 = os.times()
    return seconds, result, (c1.user - c0.user) + (c1.system - c0.system)


def pct(value, ceiling):
    return f"{100 * value / ceiling:.0f}%" if ceiling else "-"


def times(value, base):
    return f"{value / base:.1f}x" if base else "-"


def print_notes():
    for n in notes:
        print("note:", n)


# ---- the state dicts and models the GPU benchmarks share ----------------------------------------------------

STATE_DICT_SHAPES = [(8192, 8192), (8192, 28672), (28672, 8192), (8192,), (1024, 8192), (128256, 8192)]


def state_dict(size, device="cuda", seed=0):
    """A bf16 state dict of `size` bytes in a Llama-70B's tensor shapes (8 GiB: 18 tensors), on `device`."""
    import torch
    torch.manual_seed(seed)
    sd, total, i = {}, 0, 0
    while total < size:
        s = STATE_DICT_SHAPES[i % len(STATE_DICT_SHAPES)]
        if total + 2 * (s[0] * (s[1] if len(s) > 1 else 1)) > size and len(s) > 1:
            s = (max(1, (size - total) // (2 * s[-1])), s[-1])
        x = torch.randn(*s, dtype=torch.bfloat16, device=device)
        sd[f"layers.{i}.w"] = x
        total += x.nbytes
        i += 1
    return sd, total


def make_model(d, total_gib, shards=4):
    """A Hugging Face directory of a Llama-70B-like layer stack (hidden 8192, MLP 28672) cut to total_gib, bf16,
    written by safetensors.torch.save_file (so its data is not 4 KiB aligned) with its index. 16 GiB: 14.21 GB of
    tensors, 74 tensors in 4 shards."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)
    hidden, inter = 8192, 28672
    per_layer = (4 * hidden * hidden + 3 * hidden * inter) * 2 + 2 * hidden * 2
    layers = max(1, int(total_gib * GiB // per_layer))
    names = [("model.embed_tokens.weight", (32000, hidden))]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        names += [(p + "self_attn.q_proj.weight", (hidden, hidden)),
                  (p + "self_attn.k_proj.weight", (hidden // 8, hidden)),
                  (p + "self_attn.v_proj.weight", (hidden // 8, hidden)),
                  (p + "self_attn.o_proj.weight", (hidden, hidden)),
                  (p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
                  (p + "mlp.down_proj.weight", (hidden, inter)), (p + "input_layernorm.weight", (hidden,)),
                  (p + "post_attention_layernorm.weight", (hidden,))]
    names += [("model.norm.weight", (hidden,))]
    per = (len(names) + shards - 1) // shards
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        sd = {n: torch.randn(shape, dtype=torch.bfloat16, device=dev, generator=g).cpu()
              for n, shape in names[s * per:(s + 1) * per]}
        save_file(sd, os.path.join(d, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in sd})
        del sd
    total = sum(os.path.getsize(f) for f in shard_files(d))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    os.sync()


def shard_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors")) if os.path.isdir(d) else []


def safetensors_header(path):
    import struct
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        return {k: v for k, v in json.loads(fh.read(n)).items() if k != "__metadata__"}


def tensor_bytes(files):
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for f in files for v in safetensors_header(f).values())
