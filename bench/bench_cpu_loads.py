#!/usr/bin/env python3
"""bench_cpu_loads.py - CPU loads and small checkpoints, ckptio beside its peers (BENCHMARKS.md, "CPU only").

Cases (--cases, comma-separated; default all):
  model   a Hugging Face directory of about --model-gib GiB (a Llama config with random bf16 weights, written
          locally by transformers' save_pretrained: no download), loaded cold and warm to the CPU by
          ckptio.load (full copy), ckptio.load(mmap=True), safetensors.torch.load_file per shard,
          torch.load(mmap=True) and torch.load (a copy, as ckptio.load's) of the same state dict saved by
          torch.save, and transformers' from_pretrained;
          each also "and read": the time until every page of every tensor was touched once (a sum over one
          element per 4 KiB), which is what a mapped load defers.
  tiny    --tiny tensors of 1 KiB each (2 KiB bf16: an MoE's experts), saved by ckptio; loaded warm by ckptio
          (copy, mmap), safetensors load_file, torch.load(mmap=True) of a torch.save file of the same tensors.
  files   single safetensors files of 16 KiB to 64 MiB (--sizes): durable save (ckptio.save; safetensors
          save_file and torch.save followed by fsync) and warm load by each.
  bytes   the same state dicts as bytes: ckptio.save(sd) / ckptio.load(data) against safetensors.torch.save /
          load and torch.save / torch.load through io.BytesIO. The loads run interleaved (one of each peer in
          turn, --repeat rounds), so every peer meets the same allocator state. A load makes new tensors, and
          what their memory costs depends on glibc's malloc, not on the loader: sizes of 64 MiB or more are
          measured last, in two states set with mallopt (through ctypes) for all peers alike:
            fresh   M_MMAP_THRESHOLD = 1 MiB: every large tensor is a new mapping, each 4 KiB page faults on
                    its first touch (a process's first load, or one after its memory went back to the system);
            reused  M_MMAP_THRESHOLD and M_TRIM_THRESHOLD = 1 GiB: freed memory stays in the heap and the next
                    load reuses it without a fault (a process that loads again after dropping a checkpoint).
          Minor page faults per load (median) show which state a row ran in. Without mallopt (not glibc) those
          sizes run in the default state, and a note says so.
  cache   a save, then at once a load that reads every byte, for a 64 MiB and a 1 GiB file (the cache after a
          save: ckptio's default against write_cache="off", and safetensors).
Every time is the median of --repeat runs (a fresh process is not used: warm means the page cache holds the
files); CPU is the process's user + system seconds of the same runs (median). Ratios are to the fastest peer.

Usage: python3 bench/bench_cpu_loads.py [--cases model,tiny,files,bytes,cache] [--dir /var/tmp] [--repeat 5]
                                        [--model-gib 1.25] [--tiny 100000] [--sizes 16K,256K,4M,64M]
Writes $OUT/cpuvm_DATE_cpu_loads.json ({"meta": ..., "results": ...}, _common.py) and prints the tables.
This is a benchmark, not a test: it is not run by scripts/test.sh.
"""
import argparse
import gc
import io
import os
import shutil
import statistics
import sys
import tempfile
import time

import _common as common
from _common import MiB, parse_size

import torch  # noqa: E402

try:
    import ckptio
except ImportError:  # a build tree: PYTHONPATH=python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import ckptio
import safetensors.torch as st  # noqa: E402
from safetensors import safe_open  # noqa: E402

RESULTS = {}


def measure(case, name, fn, repeat, prepare=None, check=None):
    """Median seconds and CPU seconds of fn() over `repeat` runs; prepare() (untimed) before each."""
    secs, cpus = [], []
    for _ in range(repeat):
        if prepare:
            prepare()
        gc.collect()
        s, out, c = common.timed(fn)
        if check:
            check(out)
        del out
        secs.append(s)
        cpus.append(c)
    row = {"seconds": statistics.median(secs), "cpu_seconds": statistics.median(cpus), "samples": secs}
    RESULTS.setdefault(case, {})[name] = row
    return row


def touch(obj):
    """Reads one element per 4 KiB of every tensor in obj (a dict or a model): every page once."""
    tensors = obj.values() if isinstance(obj, dict) else [p for p in obj.state_dict().values()]
    s = 0.0
    for t in tensors:
        if t.numel():
            s += float(t.reshape(-1).view(torch.uint8)[::4096].sum())
    return s


def table(case, title, unit_bytes=None):
    rows = RESULTS.get(case, {})
    if not rows:
        return
    print(f"\n{title}")
    best = min(r["seconds"] for r in rows.values())
    for name, r in rows.items():
        extra = f"  {unit_bytes / r['seconds'] / 1e9:6.2f} GB/s" if unit_bytes else ""
        if "minor_faults" in r:
            extra += f"  {r['minor_faults']:8.0f} faults"
        print(f"  {name:52} {r['seconds'] * 1e3:10.2f} ms  CPU {r['cpu_seconds'] * 1e3:9.1f} ms  "
              f"{r['seconds'] / best:5.2f}x{extra}")


# ---- a Hugging Face directory --------------------------------------------------------------------------------

def case_model(work, gib, repeat):
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    transformers.utils.logging.disable_progress_bar()
    layers = max(1, int(round(gib * (1 << 30) / (2 * 51.4e6))))  # bf16 layers of hidden 2048 / MLP 5632
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=16,
                      num_key_value_heads=16, vocab_size=8000, tie_word_embeddings=False)
    d = os.path.join(work, "model")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(d, max_shard_size="400MB")
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del model
    pt = os.path.join(work, "model.pt")
    torch.save(sd, pt)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    shards = common.shard_files(d)
    common.log(f"model: {nbytes / 1e9:.2f} GB in {len(sd)} tensors, {len(shards)} shards")

    def check(out):
        got = out if isinstance(out, dict) else out.state_dict()
        assert all(torch.equal(got[k].view(torch.uint8), sd[k].view(torch.uint8)) for k in ("model.norm.weight",
                                                                                            "lm_head.weight"))

    def st_dir():
        out = {}
        for f in shards:
            out.update(st.load_file(f))
        return out

    loaders = [
        ("ckptio.load (copy)", lambda: ckptio.load(d)),
        ("ckptio.load(mmap=True)", lambda: ckptio.load(d, mmap=True)),
        ("safetensors load_file (every shard)", st_dir),
        ("torch.load(mmap=True) of model.pt", lambda: torch.load(pt, mmap=True, weights_only=True)),
        ("torch.load of model.pt (copy)", lambda: torch.load(pt, weights_only=True)),
        ("transformers from_pretrained", lambda: AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)),
    ]
    for mode in ("cold", "warm"):
        def prepare():
            if mode == "cold":
                common.drop_caches(d, pt)
            else:
                common.warm(d, pt)
        for name, fn in loaders:
            measure(f"model {mode}", name, fn, repeat, prepare, check)
            measure(f"model {mode}", name + " and read", lambda: touch(fn()), repeat, prepare)
    return nbytes


# ---- 100,000 tiny tensors -------------------------------------------------------------------------------------

def case_tiny(work, n, repeat):
    torch.manual_seed(0)
    sd = {f"model.layers.{i // 1000}.experts.{i % 1000}.w": torch.randn(32, 32).to(torch.bfloat16) for i in range(n)}
    p = os.path.join(work, "tiny.safetensors")
    pt = os.path.join(work, "tiny.pt")
    s, _, _ = common.timed(lambda: ckptio.save(sd, p))
    RESULTS.setdefault("tiny save", {})["ckptio.save"] = {"seconds": s, "cpu_seconds": 0, "samples": [s]}
    torch.save(sd, pt)
    common.warm(p, pt)
    key = next(iter(sd))

    def check(out):
        assert len(out) == n and torch.equal(out[key], sd[key])

    for name, fn in [("ckptio.load (copy)", lambda: ckptio.load(p)),
                     ("ckptio.load(mmap=True)", lambda: ckptio.load(p, mmap=True)),
                     ("safetensors load_file", lambda: st.load_file(p)),
                     ("torch.load(mmap=True) of tiny.pt", lambda: torch.load(pt, mmap=True, weights_only=True)),
                     ("torch.load of tiny.pt", lambda: torch.load(pt, weights_only=True))]:
        measure("tiny warm", name, fn, repeat, None, check)
    return sum(t.numel() * t.element_size() for t in sd.values())


# ---- single files and bytes -----------------------------------------------------------------------------------

def state(size):
    torch.manual_seed(1)
    n = max(1, min(16, size // (4 * 1024)))
    return {f"layer.{i}.w": torch.randn(max(1, size // n // 4)) for i in range(n)}


def durable(fn, path):
    def run():
        fn()
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return run


def case_files(work, sizes, repeat):
    for size in sizes:
        sd = state(size)
        label = f"{size >> 10} KiB" if size < MiB else f"{size >> 20} MiB"
        p, sp, tp = (os.path.join(work, f) for f in ("f.safetensors", "s.safetensors", "t.pt"))
        measure(f"file {label} save", "ckptio.save (durable)", lambda: ckptio.save(sd, p), repeat)
        measure(f"file {label} save", "safetensors save_file + fsync", durable(lambda: st.save_file(sd, sp), sp),
                repeat)
        measure(f"file {label} save", "torch.save + fsync", durable(lambda: torch.save(sd, tp), tp), repeat)
        common.warm(p, sp, tp)
        for name, fn in [("ckptio.load (copy)", lambda: ckptio.load(p)),
                         ("ckptio.load(mmap=True)", lambda: ckptio.load(p, mmap=True)),
                         ("safetensors load_file", lambda: st.load_file(sp)),
                         ("torch.load", lambda: torch.load(tp, weights_only=True)),
                         ("torch.load(mmap=True)", lambda: torch.load(tp, mmap=True, weights_only=True))]:
            measure(f"file {label} load", name, fn, repeat)


STATES = {  # mallopt parameter -> value, per allocator state of case_bytes (M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3)
    "fresh": {-3: 1 << 20},
    "reused": {-3: 1 << 30, -1: 1 << 30},
}
STATES_MIN = 64 * MiB  # case_bytes: sizes from this one on run in each of STATES


def set_malloc_state(state):
    """Sets glibc's malloc to `state` (STATES) for the whole process; False where mallopt is not available."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all(mallopt(param, value) == 1 for param, value in STATES[state].items())


def minor_faults():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def interleaved(case, loads, repeat):
    """Medians of `repeat` rounds, each one load of every peer in turn (after an untimed round): the peers
    share the allocator's state. Rows as measure()'s, with minor page faults per load."""
    samples = {name: ([], [], []) for name, _ in loads}
    for r in range(repeat + 1):
        for name, fn in loads:
            gc.collect()
            f0 = minor_faults()
            s, out, c = common.timed(fn)
            faults = minor_faults() - f0
            del out
            if r:
                for into, value in zip(samples[name], (s, c, faults)):
                    into.append(value)
    for name, (secs, cpus, faults) in samples.items():
        RESULTS.setdefault(case, {})[name] = {"seconds": statistics.median(secs),
                                              "cpu_seconds": statistics.median(cpus),
                                              "minor_faults": statistics.median(faults), "samples": secs}


def case_bytes(sizes, repeat):
    later = []
    for size in sizes:
        sd = state(size)
        label = f"{size >> 10} KiB" if size < MiB else f"{size >> 20} MiB"
        data, sdata = ckptio.save(sd), st.save(sd)
        buf = io.BytesIO()
        torch.save(sd, buf)
        tdata = buf.getvalue()

        def torch_save():
            b = io.BytesIO()
            torch.save(sd, b)
            return b.getvalue()

        measure(f"bytes {label} save", "ckptio.save(sd)", lambda: ckptio.save(sd), repeat)
        measure(f"bytes {label} save", "safetensors.torch.save", lambda: st.save(sd), repeat)
        measure(f"bytes {label} save", "torch.save to BytesIO", torch_save, repeat)
        loads = [("ckptio.load(bytes)", lambda data=data: ckptio.load(data)),
                 ("safetensors.torch.load", lambda sdata=sdata: st.load(sdata)),
                 ("torch.load(BytesIO)", lambda tdata=tdata: torch.load(io.BytesIO(tdata), weights_only=True))]
        if size >= STATES_MIN:
            later.append((label, loads))
        else:
            interleaved(f"bytes {label} load", loads, repeat)
        del sd
    # Last: the states hold for the rest of the process.
    for name in STATES:
        if not set_malloc_state(name):
            common.notes.append(f"mallopt not available: bytes loads of {STATES_MIN >> 20} MiB or more ran in the "
                                "default malloc state, not fresh and reused")
            for label, loads in later:
                interleaved(f"bytes {label} load", loads, repeat)
            break
        for label, loads in later:
            interleaved(f"bytes {label} load ({name})", loads, repeat)


# ---- the load right after a save ------------------------------------------------------------------------------

def case_cache(work, repeat):
    """Save, then at once load and read every page: what the page cache kept decides the load."""
    for size in (64 * MiB, 1 << 30):
        sd = state(size)
        label = f"{size >> 20} MiB"
        p = os.path.join(work, "c.safetensors")
        off, on = ckptio.Engine(write_cache="off"), ckptio.Engine(write_cache="on")
        for name, save, load in [
                ("ckptio.save (write_cache=auto), ckptio.load", lambda: ckptio.save(sd, p), lambda: ckptio.load(p)),
                ("ckptio.save (write_cache=auto), ckptio.load(mmap=True) and read", lambda: ckptio.save(sd, p),
                 lambda: touch(ckptio.load(p, mmap=True))),
                ("ckptio.save (write_cache=off), ckptio.load", lambda: ckptio.save(sd, p, engine=off),
                 lambda: ckptio.load(p)),
                ("ckptio.save (write_cache=on), ckptio.load(mmap=True) and read",
                 lambda: ckptio.save(sd, p, engine=on), lambda: touch(ckptio.load(p, mmap=True))),
                ("safetensors save_file + fsync, load_file and read", durable(lambda: st.save_file(sd, p), p),
                 lambda: touch(st.load_file(p)))]:
            saves, loads, cpus = [], [], []
            for _ in range(repeat):
                common.rmf(p)
                s, _, _ = common.timed(save)
                t, out, c = common.timed(load)
                del out
                saves.append(s)
                loads.append(t)
                cpus.append(c)
            RESULTS.setdefault(f"save then load {label}", {})[name] = {
                "seconds": statistics.median(loads), "cpu_seconds": statistics.median(cpus),
                "save_seconds": statistics.median(saves), "samples": loads}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="model,tiny,files,bytes,cache")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--model-gib", type=float, default=1.25)
    ap.add_argument("--tiny", type=int, default=100_000)
    ap.add_argument("--sizes", default="16K,256K,4M,64M")
    args = ap.parse_args()
    cases = args.cases.split(",")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="bench-cpu-loads-", dir=args.dir)
    model_bytes = tiny_bytes = None
    try:
        if "model" in cases:
            model_bytes = case_model(work, args.model_gib, args.repeat)
        if "tiny" in cases:
            tiny_bytes = case_tiny(work, args.tiny, args.repeat)
        if "files" in cases:
            case_files(work, sizes, args.repeat)
        if "bytes" in cases:
            case_bytes(sizes, args.repeat)
        if "cache" in cases:
            case_cache(work, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = dict(common.machine(args.dir), command=" ".join(sys.argv), repeat=args.repeat,
                torch_threads=torch.get_num_threads())
    for case in RESULTS:
        unit = model_bytes if case.startswith("model") else tiny_bytes if case.startswith("tiny") else None
        table(case, case, unit)
    for case, rows in RESULTS.items():
        if case.startswith("save then load"):
            for name, r in rows.items():
                print(f"  ({case}: {name} took {r['save_seconds'] * 1e3:.1f} ms to save)")
    common.print_notes()
    path = common.write_result(f"cpuvm_{meta['date']}_cpu_loads.json", meta, RESULTS)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
