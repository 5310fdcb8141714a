"""A process's first save of GPU tensors, then its second (issue 17's saves with huge-page slots).

Saves pin their staging slots on demand like loads (4 per worker, 2 x a load's); huge-page slots became
the default for both (docs/GPU.md) after first *loads* were measured. This times the save side: a fresh
process makes an 8 GiB bf16 state dict on the GPU (16 tensors of 512 MiB; CUDA initialised and the
tensors made before the clock), then `ckptio.save(sd, DIR/first.safetensors)` (durable: written, fsynced,
renamed) and a second save to another file in the same process.

    python3 bench/probe_first_save.py DIR          # prints one JSON line
Env: SIZE_GIB (8), DEVICE (cuda:0; cpu: a smoke test of this script without a GPU),
CKPTIO_GPU_HUGE_SLOTS (the knob under test). Each save: seconds, GB/s, CPU seconds; after the first, the
staging pinned and this process's anonymous memory on huge pages.
"""
import json
import os
import sys
import time

import torch
from probe_first_load import anon_huge_mib  # bench/ is the script's directory

DEV = os.environ.get("DEVICE", "cuda:0")
SIZE = int(float(os.environ.get("SIZE_GIB", "8")) * (1 << 30))


def timed(fn, nbytes):
    """Runs fn(); its seconds, GB/s of `nbytes`, and the process's CPU seconds (user + system) and per GB."""
    c0, t0 = os.times(), time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    c1 = os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {"bytes": nbytes, "seconds": round(dt, 3), "GBps": round(nbytes / dt / 1e9, 2), "cpu_s": round(cpu, 3),
            "cpu_s_per_GB": round(cpu / (nbytes / 1e9), 2)}


def timed_save(ckptio, sd, path, engine=None):
    return timed(lambda: ckptio.save(sd, path, engine=engine), sum(t.numel() * t.element_size() for t in sd.values()))


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    n = 16
    per = SIZE // n // 2  # bf16 elements per tensor
    sd = {f"layer{i}.weight": torch.full((per,), float(i) + 0.5, dtype=torch.bfloat16, device=DEV) for i in range(n)}
    if DEV != "cpu":
        torch.cuda.synchronize()
    import ckptio
    eng = ckptio.default_engine()
    row = {"threads": eng.get("threads"), "huge_knob": os.environ.get("CKPTIO_GPU_HUGE_SLOTS")}
    row["first"] = timed_save(ckptio, sd, os.path.join(d, "first.safetensors"))
    row["first"]["staging_reserved_MiB"] = eng.stats()["staging_reserved"] >> 20
    row["first"]["anon_huge_MiB"] = anon_huge_mib()
    row["second"] = timed_save(ckptio, sd, os.path.join(d, "second.safetensors"))
    back = ckptio.load(os.path.join(d, "second.safetensors"), device=DEV)
    row["equal"] = all(torch.equal(back[k], sd[k]) for k in sd)
    for f in ("first.safetensors", "second.safetensors"):
        os.unlink(os.path.join(d, f))
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
