"""bench_dcp_gpu.py - ckptio.dcp against torch.distributed.checkpoint on one GPU, in one run (BENCHMARKS.md, "DCP").

The state dict of bench_save_load_gpu.py (SIZE_GIB of bf16 on cuda:0: 18 tensors at 8 GiB), one process (no_dist).
Measured in the same run, on the same file system:
  ceilings  O_DIRECT write and read (16 threads, 2 GiB) right before every save and cold load ("adjacent": the
            virtio disks of the measured machines drift by tens of percent within minutes), pinned D2H
  torch     FileSystemWriter thread_count 1 and 8 (sync_files=True) + FileSystemReader
  ckptio    ckptio.dcp.FileSystemWriter thread_count 1 and 8 (checksum manifest on) + FileSystemReader
  async     dcp.async_save with each writer (thread_count 8, cache_staged_state_dict=True): the caller's stall
            (until async_save returns) against the D2H copy time of the state dict, and the time until the
            checkpoint is durable; three saves into one directory, the first allocates the staging
  pinned    ckptio saves of a pinned host copy (what an async save writes), with and without checksums
  bgclean   ckptio async saves with cleanup="background" (the old checkpoint's files unlinked off the critical
            path; the async rows overwrite the previous save in the same directory)
Save = durable (data fsynced by the writer, directory committed); cold = page cache dropped; warm = cached.

    python3 bench/bench_dcp_gpu.py        # prints a table, writes $OUT/bench_dcp_gpu.json
Environment: SIZE_GIB (8), DIR (/tmp/ckptio-bench), OUT, REPS (1), ONLY (comma-separated variant names, e.g.
ckptio_t8,torch_t8), SMOKE=1 (the same code on the CPU with 6 MiB: checks the driver, measures nothing).
"""
import os
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

import _common as c
import ckptio.dcp as cdcp

warnings.filterwarnings("ignore")
GiB = c.GiB
D = os.environ.get("DIR", "/tmp/ckptio-bench")
REPS = int(os.environ.get("REPS", "1"))
SMOKE = os.environ.get("SMOKE") == "1" or not torch.cuda.is_available()
SIZE = (6 << 20) if SMOKE else int(float(os.environ.get("SIZE_GIB", "8")) * GiB)
res = {}


class state:  # the run's state dict, shared by the variants
    sd, NB = None, 0


def timed(fn):
    return c.timed(fn, cuda=not SMOKE)[:2]


def ceilings():
    for k, v in c.disk_ceilings(D, 64 << 20 if SMOKE else SIZE).items():
        res["ceil_" + k] = v
    if SMOKE:
        res["ceil_d2h_pinned"] = 10.0  # no device: a placeholder so the stall ratio can be printed
    else:
        res.update({"ceil_" + k: v for k, v in c.copy_ceilings().items()})


def adjacent_write():
    p = D + "/adjacent.bin"
    v = c.io_ceiling(p, 16, True, True, (64 << 20) if SMOKE else 2 * GiB)
    c.rmf(p)
    return v


def adjacent_read(path):
    """O_DIRECT read ceiling on the checkpoint's own largest data file."""
    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".distcp")]
    big = max(files, key=os.path.getsize)
    size = min(2 * GiB, os.path.getsize(big) // c.BLOCK * c.BLOCK)
    if size == 0:
        return float("nan")
    c.drop_caches()
    return c.io_ceiling(big, 16, False, True, size)


def empty_like_sd():
    return {k: torch.empty_like(v) for k, v in state.sd.items()}


def check(out):
    for k in state.sd:
        assert torch.equal(state.sd[k], out[k]), k


def run_sync(name, make_writer, make_reader):
    path = D + "/" + name
    for rep in range(REPS):
        c.rmf(path)
        c.drop_caches()
        wc = adjacent_write()
        el, _ = timed(lambda: dcp.save(state.sd, storage_writer=make_writer(path), no_dist=True))
        save = state.NB / el / c.GB
        rc = adjacent_read(path)
        c.drop_caches()
        out = empty_like_sd()
        el, _ = timed(lambda: dcp.load(out, storage_reader=make_reader(path), no_dist=True))
        cold = state.NB / el / c.GB
        check(out)
        c.warm(path)
        el, _ = timed(lambda: dcp.load(out, storage_reader=make_reader(path), no_dist=True))
        warm = state.NB / el / c.GB
        check(out)
        del out
        row = {"save_GBps": save, "write_ceiling_GBps": wc, "save_pct_ceiling": 100 * save / wc,
               "cold_GBps": cold, "read_ceiling_GBps": rc, "cold_pct_ceiling": 100 * cold / rc, "warm_GBps": warm}
        best = res.get(name)
        if best is None or row["save_pct_ceiling"] + row["cold_pct_ceiling"] > \
                best["save_pct_ceiling"] + best["cold_pct_ceiling"]:
            res[name] = row
        c.log(name, f"rep {rep}", {k: round(v, 2) for k, v in row.items()})
    c.rmf(path)


def run_async(name, make_writer):
    """Three async saves of the same state dict with one writer (staging kept
    between saves): the stall of the caller and the time to durable."""
    path = D + "/" + name
    c.rmf(path)
    writer = make_writer(path)
    rows = []
    for i in range(3):
        c.drop_caches()
        wc = adjacent_write()
        if not SMOKE:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fut = dcp.async_save(state.sd, checkpoint_id=path, storage_writer=writer, no_dist=True)
        stall = time.perf_counter() - t0
        fut.result()
        total = time.perf_counter() - t0
        getattr(writer, "wait_cleanup", lambda: None)()  # cleanup="background": not part of the save
        rows.append({"stall_s": stall, "durable_s": total, "durable_GBps": state.NB / total / c.GB,
                     "write_ceiling_GBps": wc, "durable_pct_ceiling": 100 * state.NB / total / c.GB / wc})
        c.log(name, f"save {i}", {k: round(v, 3) for k, v in rows[-1].items()})
    out = empty_like_sd()
    dcp.load(out, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    check(out)
    del out
    d2h = state.NB / (res["ceil_d2h_pinned"] * 1e9)
    res[name] = {"saves": rows, "d2h_copy_s": d2h, "stall_after_first_s": min(r["stall_s"] for r in rows[1:]),
                 "stall_to_d2h": min(r["stall_s"] for r in rows[1:]) / d2h}
    c.rmf(path)


def run_pinned_save(name, make_writer):
    """A durable save of a pinned host copy of the state dict (what an async
    save writes after staging), against the adjacent write ceiling."""
    pinned = {k: v.cpu().pin_memory() if torch.cuda.is_available() else v.clone() for k, v in state.sd.items()}
    path = D + "/" + name
    rows = []
    for _ in range(2):
        c.rmf(path)
        c.drop_caches()
        wc = adjacent_write()
        el, _ = timed(lambda: dcp.save(pinned, storage_writer=make_writer(path), no_dist=True))
        rows.append({"save_GBps": state.NB / el / c.GB, "write_ceiling_GBps": wc,
                     "save_pct_ceiling": 100 * state.NB / el / c.GB / wc})
        c.log(name, {k: round(v, 2) for k, v in rows[-1].items()})
    res[name] = {"saves": rows}
    c.rmf(path)
    del pinned


def peer(name, fn):
    only = [x for x in os.environ.get("ONLY", "").split(",") if x]
    if only and name not in only:
        return
    try:
        fn()
    except Exception as e:  # a failing variant is a result, not the end of the run
        import traceback

        traceback.print_exc()
        res[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        c.log(name, "FAILED", res[name]["error"])


def table():
    print()
    print(f"{'GB/s':<14}{'save':>7}{'%wr':>6}{'cold':>7}{'%rd':>6}{'warm':>7}   (ceilings measured right before)")
    for n in ("torch_t1", "torch_t8", "ckptio_t1", "ckptio_t8"):
        r = res.get(n, {})
        if "error" in r or not r:
            print(f"{n:<14} failed: {r.get('error', 'not run')[:90]}")
            continue
        print(f"{n:<14}{r['save_GBps']:7.2f}{r['save_pct_ceiling']:5.0f}%{r['cold_GBps']:7.2f}"
              f"{r['cold_pct_ceiling']:5.0f}%{r['warm_GBps']:7.2f}")
    for n in ("torch_async_t8", "ckptio_async_t8", "ckptio_async_t8_bgclean"):
        r = res.get(n, {})
        if "error" in r or not r:
            print(f"{n:<16} failed: {r.get('error', 'not run')[:90]}")
            continue
        stalls = ", ".join(f"{x['stall_s']:.2f}" for x in r["saves"])
        durable = ", ".join(f"{x['durable_s']:.1f} ({x.get('durable_pct_ceiling', 0):.0f}%)" for x in r["saves"])
        print(f"{n:<16} stall {stalls} s (D2H copy of the state dict {r['d2h_copy_s']:.2f} s: "
              f"{100 * r['stall_to_d2h']:.0f}% after the first save); durable in {durable} s")
    for n in ("ckptio_pinned_t8", "ckptio_pinned_t8_nohash"):
        r = res.get(n, {})
        if "saves" in r:
            print(f"{n:<24} save from pinned host memory: " + ", ".join(
                f"{x['save_GBps']:.2f} GB/s ({x['save_pct_ceiling']:.0f}%)" for x in r["saves"]))
    c8, t8 = res.get("ckptio_t8", {}), res.get("torch_t8", {})
    if "save_GBps" in c8:
        print(f"goals (ckptio_t8): save >= 90% of the write ceiling: "
              f"{'MET' if c8['save_pct_ceiling'] >= 90 else 'NOT MET'} ({c8['save_pct_ceiling']:.0f}%); "
              f"load >= 95% of the read ceiling: {'MET' if c8['cold_pct_ceiling'] >= 95 else 'NOT MET'} "
              f"({c8['cold_pct_ceiling']:.0f}%)")
    a = res.get("ckptio_async_t8", {})
    if "stall_to_d2h" in a:
        print(f"goal: async stall <= D2H copy time: {'MET' if a['stall_to_d2h'] <= 1.0 else 'NOT MET'} "
              f"({100 * a['stall_to_d2h']:.0f}%)")
    if "save_GBps" in c8 and "save_GBps" in t8:
        print(f"ckptio_t8 / torch_t8: save {c8['save_GBps'] / t8['save_GBps']:.2f}x, cold load "
              f"{c8['cold_GBps'] / t8['cold_GBps']:.2f}x, warm {c8['warm_GBps'] / t8['warm_GBps']:.2f}x")
    c.print_notes()


def main():
    os.makedirs(D, exist_ok=True)
    meta = c.machine(D)
    meta.update(size_bytes=SIZE, smoke=SMOKE, command=" ".join(sys.argv))
    print("machine:", meta, flush=True)
    ceilings()
    state.sd, state.NB = c.state_dict(SIZE, "cpu" if SMOKE else "cuda")
    c.log("state dict", len(state.sd), "tensors", round(state.NB / GiB, 2), "GiB")
    # ckptio first: the numbers that matter come before any time limit.
    for t in (8, 1):
        peer(f"ckptio_t{t}", lambda t=t: run_sync(
            f"ckptio_t{t}", lambda p: cdcp.FileSystemWriter(p, thread_count=t, sync_files=True),
            lambda p: cdcp.FileSystemReader(p)))
    peer("ckptio_async_t8", lambda: run_async(
        "ckptio_async_t8", lambda p: cdcp.FileSystemWriter(p, thread_count=8, cache_staged_state_dict=True)))
    peer("ckptio_async_t8_bgclean", lambda: run_async(
        "ckptio_async_t8_bgclean", lambda p: cdcp.FileSystemWriter(p, thread_count=8, cache_staged_state_dict=True,
                                                                  cleanup="background")))
    peer("ckptio_pinned_t8", lambda: run_pinned_save(
        "ckptio_pinned_t8", lambda p: cdcp.FileSystemWriter(p, thread_count=8, sync_files=True)))
    peer("ckptio_pinned_t8_nohash", lambda: run_pinned_save(
        "ckptio_pinned_t8_nohash", lambda p: cdcp.FileSystemWriter(p, thread_count=8, sync_files=True,
                                                                  checksums=False)))
    for t in (8, 1):
        peer(f"torch_t{t}", lambda t=t: run_sync(
            f"torch_t{t}", lambda p: dcp.FileSystemWriter(p, thread_count=t, sync_files=True),
            lambda p: dcp.FileSystemReader(p)))
    peer("torch_async_t8", lambda: run_async(
        "torch_async_t8", lambda p: dcp.FileSystemWriter(p, thread_count=8, cache_staged_state_dict=True)))
    table()
    res["seconds_total"] = time.perf_counter() - c.T_START
    print("wrote", c.write_result("bench_dcp_gpu.json", meta, res))


if __name__ == "__main__":
    main()
