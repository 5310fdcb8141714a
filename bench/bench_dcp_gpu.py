"""bench_dcp_gpu.py - ckptio.dcp against torch.distributed.checkpoint on a GPU machine, in one run.

The state dict of bench_gpu.py (SIZE_GIB of bf16 on cuda:0, 18 tensors at 8 GiB), one process (no_dist).
Measured in the same run, on the same file system:
  ceilings  O_DIRECT write and read (16 threads, 2 GiB) right before every save and cold load
            ("adjacent": the virtio disks here drift by tens of percent within minutes), pinned D2H
  torch     FileSystemWriter thread_count 1 and 8 (sync_files=True) + FileSystemReader
  ckptio    ckptio.dcp.FileSystemWriter thread_count 1 and 8 (checksum manifest on) + FileSystemReader
  async     dcp.async_save with each writer (thread_count 8, cache_staged_state_dict=True): the caller's
            stall (until async_save returns) against the D2H copy time of the state dict, and the time
            until the checkpoint is durable; three saves, the first allocates the staging
Save = durable (data fsynced by the writer, directory committed); cold = page cache dropped; warm = cached.
  pinned    ckptio saves of a pinned host copy (what an async save writes), with and without checksums
  bgclean   ckptio async saves with cleanup="background" (the old checkpoint's files unlinked off the
            critical path; the async rows overwrite the previous save in the same directory)
Env: SIZE_GIB (8), DIR (/tmp/ckptio-bench), OUT (writes bench_dcp_gpu.json there), REPS (1),
ONLY (comma-separated variant names, e.g. ckptio_t8,torch_t8).
"""
import json
import os
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu as bg  # noqa: E402  (ceiling helpers, state dict, page-cache control)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402

warnings.filterwarnings("ignore")
GiB = bg.GiB
res = bg.res
REPS = int(os.environ.get("REPS", "1"))
# SMOKE=1: a tiny CPU-only run of the same code (checks the driver without a GPU).
SMOKE = os.environ.get("SMOKE") == "1" or not torch.cuda.is_available()
if SMOKE:
    torch.cuda.synchronize = lambda *a: None


def make_state_dict():
    if not SMOKE:
        return bg.make_state_dict()
    g = torch.Generator().manual_seed(0)
    sd = {f"layers.{i}.w": torch.randn(512, 1024, generator=g).to(torch.bfloat16) for i in range(6)}
    return sd, sum(v.nbytes for v in sd.values())


def ceilings():
    if not SMOKE:
        return bg.ceilings()
    f = bg.D + "/ceiling.bin"
    res["ceil_odirect_write_16t"] = bg.par_io(f, 4, True, True, size=64 << 20)
    bg.rmf(f)
    res["ceil_d2h_pinned"] = 10.0  # no device: a placeholder so the stall ratio can be printed


def adjacent_write():
    p = bg.D + "/adjacent.bin"
    v = bg.par_io(p, 16, True, True, size=(64 << 20) if SMOKE else 2 * GiB)
    bg.rmf(p)
    return v


def adjacent_read(path):
    """O_DIRECT read ceiling on the checkpoint's own largest data file."""
    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".distcp")]
    big = max(files, key=os.path.getsize)
    size = min(2 * GiB, os.path.getsize(big) // bg.BS * bg.BS)
    if size == 0:
        return float("nan")
    bg.drop()
    return bg.par_io(big, 16, False, True, size=size)


def empty_like_sd():
    return {k: torch.empty_like(v) for k, v in bg.sd.items()}


def check(out):
    for k in bg.sd:
        assert torch.equal(bg.sd[k], out[k]), k


def run_sync(name, make_writer, make_reader):
    path = bg.D + "/" + name
    for rep in range(REPS):
        bg.rmf(path)
        bg.drop()
        wc = adjacent_write()
        el, _ = bg.timed(lambda: dcp.save(bg.sd, storage_writer=make_writer(path), no_dist=True))
        save = bg.NB / el / 1e9
        rc = adjacent_read(path)
        bg.drop()
        out = empty_like_sd()
        el, _ = bg.timed(lambda: dcp.load(out, storage_reader=make_reader(path), no_dist=True))
        cold = bg.NB / el / 1e9
        check(out)
        bg.prewarm(path)
        el, _ = bg.timed(lambda: dcp.load(out, storage_reader=make_reader(path), no_dist=True))
        warm = bg.NB / el / 1e9
        check(out)
        del out
        row = {"save_GBps": save, "write_ceiling_GBps": wc, "save_pct_ceiling": 100 * save / wc,
               "cold_GBps": cold, "read_ceiling_GBps": rc, "cold_pct_ceiling": 100 * cold / rc, "warm_GBps": warm}
        best = res.get(name)
        if best is None or row["save_pct_ceiling"] + row["cold_pct_ceiling"] > \
                best["save_pct_ceiling"] + best["cold_pct_ceiling"]:
            res[name] = row
        bg.log(name, f"rep {rep}", {k: round(v, 2) for k, v in row.items()})
    bg.rmf(path)


def run_async(name, make_writer):
    """Three async saves of the same state dict with one writer (staging kept
    between saves): the stall of the caller and the time to durable."""
    path = bg.D + "/" + name
    bg.rmf(path)
    writer = make_writer(path)
    rows = []
    for i in range(3):
        bg.drop()
        wc = adjacent_write()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fut = dcp.async_save(bg.sd, checkpoint_id=path, storage_writer=writer, no_dist=True)
        stall = time.perf_counter() - t0
        fut.result()
        total = time.perf_counter() - t0
        getattr(writer, "wait_cleanup", lambda: None)()  # cleanup="background": not part of the save
        rows.append({"stall_s": stall, "durable_s": total, "durable_GBps": bg.NB / total / 1e9,
                     "write_ceiling_GBps": wc, "durable_pct_ceiling": 100 * bg.NB / total / 1e9 / wc})
        bg.log(name, f"save {i}", {k: round(v, 3) for k, v in rows[-1].items()})
    out = empty_like_sd()
    dcp.load(out, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    check(out)
    del out
    d2h = bg.NB / (res["ceil_d2h_pinned"] * 1e9)
    res[name] = {"saves": rows, "d2h_copy_s": d2h, "stall_after_first_s": min(r["stall_s"] for r in rows[1:]),
                 "stall_to_d2h": min(r["stall_s"] for r in rows[1:]) / d2h}
    bg.rmf(path)


def run_pinned_save(name, make_writer):
    """A durable save of a pinned host copy of the state dict (what an async
    save writes after staging), against the adjacent write ceiling."""
    pinned = {k: v.cpu().pin_memory() if torch.cuda.is_available() else v.clone() for k, v in bg.sd.items()}
    path = bg.D + "/" + name
    rows = []
    for _ in range(2):
        bg.rmf(path)
        bg.drop()
        wc = adjacent_write()
        el, _ = bg.timed(lambda: dcp.save(pinned, storage_writer=make_writer(path), no_dist=True))
        rows.append({"save_GBps": bg.NB / el / 1e9, "write_ceiling_GBps": wc,
                     "save_pct_ceiling": 100 * bg.NB / el / 1e9 / wc})
        bg.log(name, {k: round(v, 2) for k, v in rows[-1].items()})
    res[name] = {"saves": rows}
    bg.rmf(path)
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
        bg.log(name, "FAILED", res[name]["error"])


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
    for n in bg.notes:
        print("note:", n)


def main():
    print("machine:", subprocess.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc",
                                     shell=True, capture_output=True, text=True).stdout.replace("\n", " "))
    print("torch", torch.__version__, "ckptio", ckptio.__version__ if hasattr(ckptio, "__version__") else "?")
    ceilings()
    bg.sd, bg.NB = make_state_dict()
    bg.log("state dict", len(bg.sd), "tensors", round(bg.NB / GiB, 2), "GiB")
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
    res["seconds_total"] = time.perf_counter() - bg.T_START
    print("RESULTS", json.dumps(res))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_dcp_gpu.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
