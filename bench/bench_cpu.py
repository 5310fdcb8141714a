#!/usr/bin/env python3
"""bench_cpu.py - ckptio against the disk's raw ceilings and against its CPU
peers (safetensors.numpy, numpy tofile/fromfile), in one run, host memory only
(BENCHMARKS.md, "CPU only").

For each repetition, in this order:
  1. `ckptio bench --json` (the CLI): raw ceilings measured in that process -
     O_DIRECT 8 MiB-block write + fsync, O_DIRECT and buffered cold reads,
     page-cache read - and ckptio's own save / cold load / warm load of the
     same number of bytes, every load compared with what was saved;
  2. on one numpy state dict held by this process: the ckptio Python package
     (when `import ckptio` works), safetensors.numpy save_file/load_file and
     numpy tofile/fromfile; each saves durably (the timing includes fsync),
     loads cold (fsync, posix_fadvise(DONTNEED), and /proc/sys/vm/drop_caches
     when root) and warm (file read once beforehand), and every load is
     compared with the state dict.
Medians over the repetitions go into one table with GB/s (1e9 bytes/s),
ratios to the ceilings and ckptio / safetensors.

Usage: python3 bench/bench_cpu.py [--size 1G] [--tensors 16] [--repeat 3]
                                  [--dir /var/tmp] [--ckptio PATH] [--json FILE]
--json writes {"meta": the machine, "results": the samples, medians and ceilings}.
This is a benchmark, not a test: it is not run by scripts/test.sh.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _common as common
from _common import GB, fsync_path, parse_size

REPO = Path(__file__).resolve().parents[1]


def find_ckptio(explicit):
    candidates = [explicit] if explicit else []
    if os.environ.get("CKPTIO_TEST_BUILD_DIR"):
        candidates.append(os.path.join(os.environ["CKPTIO_TEST_BUILD_DIR"], "ckptio"))
    candidates += [str(REPO / "build" / "ckptio"), shutil.which("ckptio")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("bench_cpu.py: no ckptio binary (build it, or pass --ckptio / set CKPTIO_TEST_BUILD_DIR)")


# ---- page cache -----------------------------------------------------------------

DROP_METHOD = "posix_fadvise(DONTNEED)"


def drop_cache(path):
    """Make the next read of `path` come from the disk."""
    global DROP_METHOD
    DROP_METHOD = common.drop_caches(path)


def prime_cache(path):
    common.warm(path)


# ---- the peers ------------------------------------------------------------------
# Each: save(sd, path) must leave the bytes durable; load(path) -> dict.


def safetensors_save(sd, path):
    from safetensors.numpy import save_file

    save_file(sd, path)
    fsync_path(path)  # save_file does not fsync: durable save = write + fsync


def safetensors_load(path):
    from safetensors.numpy import load_file

    return load_file(path)


def numpy_save(sd, path):
    with open(path, "wb") as f:
        for a in sd.values():
            a.tofile(f)
        f.flush()
        os.fsync(f.fileno())


def numpy_load_fn(sd):
    layout = [(k, a.dtype, a.size) for k, a in sd.items()]

    def load(path):
        out = {}
        with open(path, "rb") as f:
            for k, dt, n in layout:
                out[k] = np.fromfile(f, dtype=dt, count=n)
        return out

    return load


def ckptio_python():
    """(save, load) of the ckptio Python package, or None if it is not importable."""
    try:
        try:
            import ckptio  # noqa: F401
        except ImportError:
            # Built in place in the checkout (build/ configured with -DCKPTIO_PYTHON=ON).
            sys.path.insert(0, str(REPO / "python"))
            import ckptio  # noqa: F401
    except Exception as e:  # not built / not installed
        print(f"# ckptio Python package not importable ({type(e).__name__}: {e}); using the CLI's numbers only",
              file=sys.stderr)
        return None

    def save(sd, path):
        ckptio.save(sd, path)  # atomic: temporary, fsync, rename, fsync dir

    def load(path):
        return ckptio.load(path, framework="numpy")

    def load_into(out):
        def load_out(path):
            return ckptio.load(path, framework="numpy", out=out)

        return load_out

    return save, load, load_into


def same(sd, loaded):
    if set(sd) != set(loaded):
        return False
    # Compare bits, not values: random bits include NaNs.
    return all(np.array_equal(sd[k].reshape(-1).view(np.uint16), np.asarray(loaded[k]).reshape(-1).view(np.uint16))
               for k in sd)


def measure_peer(name, save, load, sd, path, nbytes, results, prepare=None):
    t0 = time.perf_counter()
    save(sd, path)
    results.setdefault((name, "save"), []).append(nbytes / (time.perf_counter() - t0) / GB)
    for mode in ("cold", "warm"):
        if prepare:
            prepare()  # untimed
        if mode == "cold":
            drop_cache(path)
        else:
            prime_cache(path)
        t0 = time.perf_counter()
        loaded = load(path)
        el = time.perf_counter() - t0
        if not same(sd, loaded):
            sys.exit(f"bench_cpu.py: {name}: {mode} load returned different bytes than were saved")
        del loaded
        results.setdefault((name, f"load {mode}"), []).append(nbytes / el / GB)
    os.remove(path)


# ---- main -----------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="bytes of tensor data (default 1G)")
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp", help="a directory on the disk to measure (default /var/tmp)")
    ap.add_argument("--ckptio", help="the ckptio binary (default: $CKPTIO_TEST_BUILD_DIR, build/, $PATH)")
    ap.add_argument("--json", help="also write all samples and medians to this file")
    args = ap.parse_args()

    size = parse_size(args.size)
    per = size // args.tensors // 4096 * 4096
    if per == 0:
        sys.exit("bench_cpu.py: --size too small for --tensors")
    nbytes = per * args.tensors
    binary = find_ckptio(args.ckptio)
    py = ckptio_python()

    rng = np.random.default_rng(1234)
    # float16 has the size of the bf16 a training job would save; numpy has no bf16.
    sd = {f"layers.{i:06d}.weight": np.frombuffer(rng.bytes(per), dtype=np.float16).reshape(-1, 2048).copy()
          for i in range(args.tensors)}

    out = {k: np.empty_like(a) for k, a in sd.items()}

    def zero_out():
        # Zeroed before every load so that a load writing nothing fails the comparison.
        for a in out.values():
            a.fill(0)

    work = tempfile.mkdtemp(prefix="bench-cpu-", dir=args.dir)
    results = {}
    cli_runs = []
    try:
        for rep in range(args.repeat):
            print(f"# repetition {rep + 1}/{args.repeat}", file=sys.stderr)
            r = subprocess.run([binary, "bench", "--json", "--size", str(nbytes), "--tensors", str(args.tensors),
                                "--dir", work], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"bench_cpu.py: ckptio bench failed ({r.returncode}): {r.stderr.strip()}")
            doc = json.loads(r.stdout)
            cli_runs.append(doc)
            res = doc["results"]
            for key, (name, op) in {
                "raw_write_direct": ("ceiling: raw O_DIRECT", "save"),
                "raw_read_direct_cold": ("ceiling: raw O_DIRECT", "load cold"),
                "raw_read_buffered_cold": ("ceiling: raw buffered", "load cold"),
                "raw_read_page_cache": ("ceiling: raw page cache", "load warm"),
                "ckptio_save": ("ckptio (CLI bench)", "save"),
                "ckptio_load_cold": ("ckptio (CLI bench)", "load cold"),
                "ckptio_load_warm": ("ckptio (CLI bench)", "load warm"),
            }.items():
                results.setdefault((name, op), []).append(res[key]["gbps"])
            peers = []
            if py:
                peers.append(("ckptio (Python)", py[0], py[1], "ck.safetensors", None))
                # The same into arrays allocated and touched beforehand: the
                # transfer alone, without the kernel's cost of fresh pages.
                peers.append(("ckptio (Python, out=)", py[0], py[2](out), "ck2.safetensors", zero_out))
            peers += [
                ("safetensors.numpy", safetensors_save, safetensors_load, "st.safetensors", None),
                ("numpy tofile/fromfile", numpy_save, numpy_load_fn(sd), "np.bin", None),
            ]
            for name, save, load, fname, prepare in peers:
                measure_peer(name, save, load, sd, os.path.join(work, fname), nbytes, results, prepare)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in results.items()}
    ceiling = {
        "save": med[("ceiling: raw O_DIRECT", "save")],
        "load cold": max(med[("ceiling: raw O_DIRECT", "load cold")], med[("ceiling: raw buffered", "load cold")]),
        "load warm": med[("ceiling: raw page cache", "load warm")],
    }
    names = []
    for name, _ in results:
        if name not in names:
            names.append(name)

    eng = cli_runs[-1]["engine"]
    print(f"bench_cpu.py: {nbytes / (1 << 30):.2f} GiB in {args.tensors} tensors, median of {args.repeat}, "
          f"dir {args.dir}; ckptio engine: {eng['backend']}, {eng['threads']} threads, direct {eng['direct']}")
    print(f"cold = {DROP_METHOD} (ckptio bench: {cli_runs[-1]['cache']['method']})")
    print("save = write + fsync; ratios: to the ceiling of the same column, and ckptio / safetensors.numpy\n")
    ops = ["save", "load cold", "load warm"]
    head = f"{'':28}" + "".join(f"{op + ' GB/s':>16}" for op in ops)
    print(head)
    for name in names:
        cells = []
        for op in ops:
            v = med.get((name, op))
            cells.append(f"{v:16.2f}" if v is not None else f"{'-':>16}")
        print(f"{name:28}" + "".join(cells))
    print()
    st = "safetensors.numpy"
    for name in names:
        if not name.startswith("ckptio"):
            continue
        parts = []
        for op in ops:
            v = med[(name, op)]
            parts.append(f"{op}: {100 * v / ceiling[op]:.0f}% of ceiling, {v / med[(st, op)]:.2f}x safetensors")
        print(f"{name}: " + "; ".join(parts))

    if args.json:
        out = {
            "meta": dict(common.machine(args.dir), command=" ".join(sys.argv)),
            "size_bytes": nbytes,
            "tensors": args.tensors,
            "repeat": args.repeat,
            "cache_drop": DROP_METHOD,
            "engine": eng,
            "samples_gbps": {f"{n} | {op}": v for (n, op), v in results.items()},
            "median_gbps": {f"{n} | {op}": v for (n, op), v in med.items()},
            "ceiling_gbps": ceiling,
            "cli_bench": cli_runs,
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
