"""gpu_checksum_cost.py - what integrity costs on a save from GPU memory.

Alternates durable saves of one 8 GiB bf16 state dict on cuda:0 with and
without checksums, in both formats: safetensors with/without the XXH3
manifest (checksums=True), torch.save with/without CRC-32 (crc=True/False).
Both are computed on the pinned staging copy while the data is written.
Prints the median GB/s of each and the cost in percent.

Run on the GPU machine: PYTHONPATH=python python3 bench/gpu_checksum_cost.py
Env: SIZE_GIB (8), DIR (/var/tmp/ckptio-cksum), REPEAT (3).
"""
import os, shutil, statistics, time

import torch

import ckptio

GiB = 1 << 30
SIZE = int(float(os.environ.get("SIZE_GIB", "8")) * GiB)
D = os.environ.get("DIR", "/var/tmp/ckptio-cksum")
REPEAT = int(os.environ.get("REPEAT", "3"))
os.makedirs(D, exist_ok=True)
n = 16
sd = {f"layers.{i}.weight": torch.randn((SIZE // n // 2 // 8192, 8192), dtype=torch.bfloat16, device="cuda")
      for i in range(n)}
nb = sum(v.nbytes for v in sd.values())
torch.cuda.synchronize()
variants = {
    "safetensors": dict(format="safetensors"),
    "safetensors + XXH3 manifest": dict(format="safetensors", checksums=True),
    "torch.save, crc=False": dict(format="torch", crc=False),
    "torch.save, CRC-32": dict(format="torch", crc=True),
}
samples = {k: [] for k in variants}
for rep in range(REPEAT):
    for name, kw in variants.items():
        p = os.path.join(D, "m.pt" if kw["format"] == "torch" else "m.safetensors")
        t0 = time.perf_counter()
        ckptio.save(sd, p, **kw)
        samples[name].append(nb / (time.perf_counter() - t0) / 1e9)
        if kw.get("checksums"):
            with ckptio.open(p) as f:
                assert f.verify()["tensors"] == n
        if kw["format"] == "torch" and kw["crc"]:
            with ckptio.open(p) as f:
                r = f.verify()
                assert r["crc_absent"] == 0, r
        os.remove(p)
        if os.path.exists(p + ".ckptio-manifest.json"):
            os.remove(p + ".ckptio-manifest.json")
med = {k: statistics.median(v) for k, v in samples.items()}
for k, v in samples.items():
    print(f"{k:30s} median {med[k]:5.2f} GB/s   runs {' '.join(f'{x:.2f}' for x in v)}")
print(f"cost of the XXH3 manifest: {100 * (1 - med['safetensors + XXH3 manifest'] / med['safetensors']):.1f}%")
print(f"cost of CRC-32 in torch.save files: {100 * (1 - med['torch.save, CRC-32'] / med['torch.save, crc=False']):.1f}%")
shutil.rmtree(D, ignore_errors=True)
