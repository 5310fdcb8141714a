"""sweep_gpu_save.py - durable save from GPU memory: ckptio settings against the
O_DIRECT write ceiling measured between them (the virtio disk drifts), plus
the torch.save format through ckptio, on the same 8 GiB bf16 state dict.

Run on the GPU machine: PYTHONPATH=python python3 bench/sweep_gpu_save.py
Env: SIZE_GIB (8), DIR (/var/tmp/ckptio-sweep).
"""
import json, mmap, os, shutil, threading, time

import torch

import ckptio

GiB = 1 << 30
SIZE = int(float(os.environ.get("SIZE_GIB", "8")) * GiB)
D = os.environ.get("DIR", "/var/tmp/ckptio-sweep")
os.makedirs(D, exist_ok=True)
BS = 8 << 20
res = []


def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def raw_write(nthreads):
    """O_DIRECT 8 MiB blocks, nthreads, file sized first, then fsync."""
    p = D + "/raw.bin"
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
    os.ftruncate(fd, SIZE)
    nblk = SIZE // BS

    def worker(i):
        buf = mmap.mmap(-1, BS)
        buf.write(os.urandom(1 << 20) * (BS >> 20))
        for b in range(i, nblk, nthreads):
            os.pwritev(fd, [buf], b * BS)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(nthreads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    os.fsync(fd)
    el = time.perf_counter() - t0
    os.close(fd)
    os.remove(p)
    return SIZE / el / 1e9


n = 16
shape = (SIZE // n // 2 // 8192, 8192)
sd = {f"layers.{i}.weight": torch.randn(shape, dtype=torch.bfloat16, device="cuda") for i in range(n)}
nb = sum(v.nbytes for v in sd.values())
torch.cuda.synchronize()


def timed_save(fmt, **settings):
    p = D + ("/m.safetensors" if fmt == "safetensors" else "/m.pt")
    if os.path.exists(p):
        os.remove(p)
    drop()
    eng = ckptio.Engine(**settings)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ckptio.save(sd, p, format=fmt, engine=eng)
    el = time.perf_counter() - t0
    gbps = nb / el / 1e9
    drop()
    t0 = time.perf_counter()
    out = ckptio.load(p, device="cuda", engine=eng)
    torch.cuda.synchronize()
    cold = nb / (time.perf_counter() - t0) / 1e9
    ok = all(torch.equal(out[k], sd[k]) for k in sd)
    del out
    os.remove(p)
    return gbps, cold, ok


configs = [
    ("safetensors", {}),
    ("safetensors", {"threads": 8}),
    ("safetensors", {"threads": 4}),
    ("safetensors", {"threads": 16, "staging_bytes": 1 << 30}),
    ("safetensors", {"threads": 16, "chunk_bytes": 32 << 20, "staging_bytes": 1 << 30}),
    ("safetensors", {"threads": 32, "staging_bytes": 1 << 30}),
    ("safetensors", {"backend": "pread"}),
    ("torch", {}),
]
ceil = raw_write(16)
print(f"ceiling O_DIRECT write 16t {ceil:.2f} GB/s; 4t {raw_write(4):.2f}", flush=True)
for i, (fmt, cfg) in enumerate(configs):
    try:
        s, c, ok = timed_save(fmt, **cfg)
    except Exception as e:  # a setting out of bounds is a result too
        print(fmt, cfg, "FAILED", e, flush=True)
        continue
    if i % 3 == 2:
        ceil = raw_write(16)
        print(f"ceiling O_DIRECT write 16t {ceil:.2f} GB/s", flush=True)
    res.append({"format": fmt, "settings": cfg, "save": s, "cold": c, "ok": ok, "ceiling": ceil})
    print(f"{fmt:12s} {json.dumps(cfg):60s} save {s:5.2f} GB/s ({s / ceil:4.0%} of ceiling)  load cold {c:5.2f}  bytes ok {ok}", flush=True)
print("RESULTS", json.dumps(res))
shutil.rmtree(D, ignore_errors=True)
