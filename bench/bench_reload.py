#!/usr/bin/env python3
"""bench_reload.py - loading the same checkpoint twice (BENCHMARKS.md, "Loading
the same file twice"): ckptio (default read policy, and CKPTIO_READ_CACHE=off:
O_DIRECT every time) beside torch.load and safetensors.torch.load_file.

For each repetition and each loader: the file is evicted from the page cache
(fsync, posix_fadvise(DONTNEED), and /proc/sys/vm/drop_caches when root),
then loaded twice ("first", "second"); every load is compared with the state
dict. The files are written once by each format's own writer (ckptio.save for
ckptio, torch.save, safetensors.torch.save_file). Medians over repetitions;
GB/s = 1e9 bytes/s of tensor data.

--device cuda loads to the GPU instead (ckptio.load(device="cuda"),
torch.load(map_location="cuda"), safetensors load_file(device="cuda")), each
timed to torch.cuda.synchronize().

Usage: python3 bench/bench_reload.py [--size 2G] [--tensors 32] [--repeat 3]
                                     [--dir /var/tmp] [--device cpu|cuda] [--json FILE]
This is a benchmark, not a test: it is not run by scripts/test.sh.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import _common as common
import ckptio
from _common import GB, parse_size


def evict(path):
    common.drop_caches(path)


def state_dict(size, tensors):
    g = torch.Generator().manual_seed(0)
    per = size // tensors // 2  # bf16 elements
    return {f"layers.{i}.weight": torch.randn(per, generator=g).to(torch.bfloat16) for i in range(tensors)}


def check(got, sd):
    assert got.keys() == sd.keys()
    for k, v in sd.items():
        assert torch.equal(got[k], v), k


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="2G")
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = args.device
    import safetensors.torch as st

    sd = state_dict(parse_size(args.size), args.tensors)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    work = Path(tempfile.mkdtemp(prefix="bench_reload.", dir=args.dir))
    files = {"ckptio": work / "m.safetensors", "torch": work / "m.pt", "safetensors": work / "ref.safetensors"}
    ckptio.save(sd, files["ckptio"])
    torch.save(sd, files["torch"])
    st.save_file(sd, files["safetensors"])
    default_engine = ckptio.Engine()
    direct_engine = ckptio.Engine(read_cache="off")
    loaders = {
        "ckptio.load (read_cache=auto)": (files["ckptio"],
                                          lambda p: ckptio.load(p, device=dev, engine=default_engine)),
        "ckptio.load (read_cache=off)": (files["ckptio"], lambda p: ckptio.load(p, device=dev, engine=direct_engine)),
        "torch.load": (files["torch"], lambda p: torch.load(p, map_location=dev, weights_only=True)),
        "safetensors load_file": (files["safetensors"], lambda p: st.load_file(p, device=dev)),
    }
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    times = {name: {"first": [], "second": []} for name in loaders}
    try:
        for _ in range(args.repeat):
            for name, (path, load) in loaders.items():
                evict(path)
                for which in ("first", "second"):
                    sync()
                    t0 = time.perf_counter()
                    got = load(path)
                    sync()
                    times[name][which].append(time.perf_counter() - t0)
                    print(f"  {name} {which}: {times[name][which][-1]:.3f} s", file=sys.stderr, flush=True)
                    check({k: v.cpu() for k, v in got.items()}, sd)
                    del got
    finally:
        for p in files.values():
            p.unlink(missing_ok=True)
        work.rmdir()
    rows = {}
    print(f"{nbytes / GB:.2f} GB in {args.tensors} bf16 tensors to {dev}, {args.repeat} repetitions (median), "
          f"{os.cpu_count()} CPUs, ckptio {ckptio.__version__} from {os.path.dirname(ckptio.__file__)}")
    print(f"{'loader':34s} {'first s':>8s} {'GB/s':>6s} {'second s':>9s} {'GB/s':>6s}")
    for name, t in times.items():
        first, second = statistics.median(t["first"]), statistics.median(t["second"])
        rows[name] = {"first_s": first, "second_s": second, "first_gbs": nbytes / first / GB,
                      "second_gbs": nbytes / second / GB, "runs": t}
        print(f"{name:34s} {first:8.3f} {nbytes / first / GB:6.2f} {second:9.3f} {nbytes / second / GB:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": common.machine(args.dir), "bytes": nbytes, "tensors": args.tensors,
                       "repeat": args.repeat, "device": dev, "results": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
