"""What checkpointing costs a real training loop: step times, not host-return times (docs/SNAPSHOTS.md).

The loop: a stack of DEPTH Linear(WIDTH, WIDTH) + GELU layers in fp32 with AdamW (the defaults, 14 x 8192,
are 0.94 B parameters and 11.3 GB of model and optimizer state), a batch of BATCH rows, every step
synchronised (torch.cuda.synchronize) and timed, the save call included in the step that makes it. Each
method runs in a process of its own, the same steps, saves at every EVERY-th step to tmpfs (/dev/shm) or to
disk:

  none                 no checkpoint
  torch                torch.distributed.checkpoint.async_save with torch's FileSystemWriter (FILES data
                       files per save, as the ckptio manager writes; default 8) and the staging
                       options of torch.distributed.checkpoint.staging that overlap most: DefaultStager(
                       StagingOptions(pinned, no shared memory, async staging on a stream of its own,
                       non-blocking copies)), one stager reused; before the next optimizer step the loop
                       waits for the staging to complete (torch's staging is not ordered against the training
                       stream), and before the next save for the previous upload (its staging is reused).
                       torch 2.11's DefaultStager closes its StateDictStager at the end of every stage, so a
                       reused one fails its second save (KeyError: <class 'type'>: the deepcopy dispatch it
                       cleared); later releases keep a stager the caller owns open. Here the per-stage close is
                       a no-op and the real one runs at the end (_reusable_stager), as those releases do.
  torch_cached         dcp.async_save with one torch FileSystemWriter(cache_staged_state_dict=True) reused
                       (the writer stages: pinned memory allocated once, copies that block the call; on the
                       CPU without the cache, which torch pins)
  torch_process        as `torch`, with async_checkpointer_type=PROCESS (the write in a process of torch's,
                       staging in shared memory; a 1-rank gloo group, which that executor needs)
  ckptio_main_manager  ckptio.CheckpointManager staging as torch does into one data file (writer_options=
                       {"snapshots": False, "thread_count": 1}): the manager as it was before snapshots
  ckptio_main_writer   dcp.async_save with one ckptio.dcp.FileSystemWriter(cache_staged_state_dict=True,
                       snapshots=False) reused: the writer as it was before snapshots
  ckptio_manager       ckptio.CheckpointManager with snapshots (the default, async_busy="wait": a save asked
                       for while the previous one writes waits for it), prepare() before the warm-up
  ckptio_manager_skip  the same with async_busy="skip": such a save is not started (never waits)
  ckptio_writer        dcp.async_save with a new ckptio.dcp.FileSystemWriter(thread_count=FILES) per save
                       (snapshots: the pool the process's writers share), prepare() before the warm-up

The state dict (get_state_dict of the model and optimizer, plus RNG states, a data-loader position and the
step) is built once after the warm-up: its tensors are the live ones. Each child reports the step times,
which steps saved, the host time of each save call, request-to-durable time of each save, the pinned memory
it holds, its CPU seconds (getrusage) in the loop and while draining; then it saves once more after the
last step, copies the state on the GPU right after that call as the reference, runs two more steps, waits
for the save and loads it (ckptio.dcp.FileSystemReader, onto the GPU, timed) to compare bit for bit.

usage: python bench/bench_training_loop.py OUTDIR [--runs "tmpfs:10:none,torch,...;disk:50:2:torch,..."]
         [--saves N] [--deadline SECONDS] [--width W --depth D --batch B] [--device cpu] [--smoke]
A run is TARGET:EVERY[:SAVES]:METHODS (EVERY * SAVES + 3 steps); the estimated time of each run is printed
first; runs that no longer fit in the deadline are skipped, in order, and said so. --smoke: every method on
a small model on the CPU (or the GPU when there is one), a save every 2 steps, in seconds: proves that each
method runs end to end.
Writes OUTDIR/training_loop.json (updated after each run) and OUTDIR/training_loop_*.png.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time

METHODS = ["none", "torch", "torch_cached", "torch_process", "ckptio_main_manager", "ckptio_main_writer",
           "ckptio_manager", "ckptio_manager_skip", "ckptio_writer"]
MANAGERS = ("ckptio_manager", "ckptio_manager_skip", "ckptio_main_manager")
SNAPSHOTS = ("ckptio_manager", "ckptio_manager_skip", "ckptio_writer")


# ---- the child: one method, one target, one cadence -------------------------------------------------------


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _flat(v, out):
    import torch

    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            _flat(x, out)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _flat(x, out)
    return out


def _reusable_stager(options):
    """A DefaultStager that can stage more than once on torch 2.11, whose DefaultStager._stage closes its
    StateDictStager after every stage (clearing the deepcopy dispatch the next stage needs: KeyError <class
    'type'>, and the cache of staging storages). Later releases leave a stager the caller owns open; so here:
    the per-stage close does nothing, and close_stager() runs the real one at the end."""
    from torch.distributed.checkpoint.staging import DefaultStager

    stager = DefaultStager(options)
    inner = getattr(stager, "_state_dict_stager", None)
    if inner is not None and hasattr(inner, "close"):
        inner.close = lambda: None  # an instance attribute: what DefaultStager._stage calls
    return stager


def _close_stager(stager) -> None:
    inner = getattr(stager, "_state_dict_stager", None)
    stager.close()
    if inner is not None and "close" in vars(inner):
        del inner.close
        inner.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Retention:
    """keep_last for the methods that are not the manager: older step directories removed once a newer save
    is durable, off the training thread."""

    def __init__(self, keep: int):
        self.keep, self.done, self.lock = keep, [], threading.Lock()

    def durable(self, path: str) -> None:
        with self.lock:
            self.done.append(path)
            old, self.done = self.done[:-self.keep], self.done[-self.keep:]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)


def child(args) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import ckptio
    import ckptio.dcp as cdcp

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    method = args.method
    if method == "torch_process":  # torch's process executor needs a process group: one rank of gloo
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width, device=dev), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randn(args.batch, args.width, device=dev)
    staging_wait = []  # torch: the staging of the last save, waited for before the next optimizer step

    def wait_staging(*_):
        while staging_wait:
            staging_wait.pop().result()

    opt.register_step_pre_hook(wait_staging)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    msd, osd = get_state_dict(model, opt)  # the optimizer's state made here (torch's _init_optim_state)
    extra = {"step": 0, "rng": torch.get_rng_state(), "loader": {"epoch": 0, "index": 0}}
    if cuda:
        extra["cuda_rng"] = torch.cuda.get_rng_state()
    state = {"model": dict(msd), "optim": osd, "extra": extra}
    state_bytes = sum(t.numel() * t.element_size() for t in _flat(state, []))
    root = os.path.join(args.root, f"{args.method}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    keep = args.keep_last
    durable, requested, futures, skipped = {}, {}, [], []
    retention = _Retention(keep)
    t_setup = time.perf_counter()
    mgr = writer = stager = None
    if method in MANAGERS:
        opts = {"snapshots": False, "thread_count": 1} if method == "ckptio_main_manager" else {}  # as before
        mgr = ckptio.CheckpointManager(root, keep_last=keep, writer_options=opts,
                                       async_busy="skip" if method == "ckptio_manager_skip" else "wait")
        if method in SNAPSHOTS:
            mgr.prepare(state)
    elif method == "ckptio_main_writer":
        writer = cdcp.FileSystemWriter(os.path.join(root, "w"), cache_staged_state_dict=True, snapshots=False)
    elif method == "ckptio_writer":
        cdcp.FileSystemWriter(root).prepare(state)
    elif method in ("torch", "torch_process"):
        from torch.distributed.checkpoint.staging import StagingOptions

        stager = _reusable_stager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=method == "torch_process",
                                                 use_async_staging=cuda, use_non_blocking_copy=cuda))
    elif method == "torch_cached":
        # torch pins the cached copy, which needs CUDA: the CPU smoke run stages without the cache.
        writer = dcp.FileSystemWriter(os.path.join(root, "w"), thread_count=args.files, cache_staged_state_dict=cuda)
    for _ in range(3):  # warm-up (the snapshot pool is pinned meanwhile, as a job's start would let it)
        step()
    sync()
    last_upload = []

    def save(i: int, final: bool = False) -> None:
        extra["step"] = i
        extra["loader"]["index"] = i * args.batch
        requested[i] = time.perf_counter()
        path = os.path.join(root, f"step_{i:08d}")

        def mark(f, i=i, path=path):
            if not f.exception() and isinstance(f.result(), ckptio.SkippedSave):
                skipped.append(i)
                return
            durable[i] = time.perf_counter()
            if mgr is None:
                retention.durable(path)

        if mgr is not None:
            f = mgr.save(i, state, async_busy="wait" if final else None)  # the exactness save is never skipped
        elif method in ("torch", "torch_process", "torch_cached"):
            while last_upload:
                last_upload.pop().result()  # its staging buffers are reused by this save
            if method == "torch_cached":
                resp = dcp.async_save(state, checkpoint_id=path, storage_writer=writer, no_dist=True)
            else:
                from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

                kind = AsyncCheckpointerType.PROCESS if method == "torch_process" else AsyncCheckpointerType.THREAD
                resp = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path, thread_count=args.files),
                                      async_stager=stager, async_checkpointer_type=kind,
                                      no_dist=method != "torch_process")
            if hasattr(resp, "staging_completion"):
                staging_wait.append(resp.staging_completion)
                f = resp.upload_completion
            else:
                f = resp
            last_upload.append(f)
        else:
            w = writer if writer is not None else cdcp.FileSystemWriter(path, thread_count=args.files)
            f = dcp.async_save(state, checkpoint_id=path, storage_writer=w, no_dist=True)
        f.add_done_callback(mark)
        futures.append(f)

    times, calls, save_steps = [], {}, []
    pool_ready_at = None
    cpu0 = _cpu_seconds()
    t_loop = time.perf_counter()
    for i in range(args.steps):
        t0 = time.perf_counter()
        if method != "none" and i > 0 and i % args.every == 0:
            save(i)
            calls[i] = time.perf_counter() - t0
            save_steps.append(i)
        step()
        sync()
        times.append(time.perf_counter() - t0)
        if pool_ready_at is None and method in SNAPSHOTS:
            snaps = mgr._snapshots if mgr is not None else ckptio._snapshot.shared()
            info = snaps.info()
            if info and info["ready_bytes"] >= info["nbytes"]:
                pool_ready_at = time.perf_counter() - t_setup
    loop_s = time.perf_counter() - t_loop
    cpu_loop = _cpu_seconds() - cpu0
    # Drain: every save durable.
    t0 = time.perf_counter()
    for f in futures:
        f.result()
    drain_s = time.perf_counter() - t0
    cpu_drain = _cpu_seconds() - cpu0 - cpu_loop
    pinned = None
    if method in SNAPSHOTS:
        snaps = mgr._snapshots if mgr is not None else ckptio._snapshot.shared()
        pinned = snaps.info().get("nbytes")
    elif method in ("torch", "torch_process", "torch_cached"):
        pinned = state_bytes if cuda else 0  # its stager (or writer) keeps a pinned copy of every tensor
    elif method in ("ckptio_main_manager", "ckptio_main_writer"):
        pinned = state_bytes  # torch's _create_cpu_state_dict, pinned (the writer's cache / each save)
    out = {"method": method, "target": args.target, "every": args.every, "steps": args.steps,
           "gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "state_bytes": state_bytes, "batch": args.batch, "width": args.width, "depth": args.depth,
           "step_ms": [round(t * 1e3, 3) for t in times], "save_steps": save_steps,
           "save_call_ms": {str(k): round(v * 1e3, 3) for k, v in calls.items()},
           "durable_s": {str(k): round(durable[k] - requested[k], 3) for k in requested if k in durable},
           "skipped_steps": sorted(skipped),
           "loop_s": round(loop_s, 3), "drain_s": round(drain_s, 3), "cpu_s_loop": round(cpu_loop, 3),
           "cpu_s_drain": round(cpu_drain, 3), "pinned_bytes": pinned,
           "pool_ready_s": None if pool_ready_at is None else round(pool_ready_at, 3)}
    # Exactness: one more save, the reference copied on the GPU right after the call, two more steps.
    if method != "none":
        final = args.steps
        save(final, final=True)
        ref = [t.detach().clone() for t in _flat(state, [])]
        step()
        step()
        sync()
        futures[-1].result()
        path = mgr.step_dir(final) if mgr is not None else os.path.join(root, f"step_{final:08d}")
        if method == "ckptio_main_writer":
            path = os.path.join(root, f"step_{final:08d}")
        if mgr is not None:
            mgr.wait()
        sync()
        t0 = time.perf_counter()
        dcp.load(state, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
        sync()
        load_s = time.perf_counter() - t0
        got = _flat(state, [])
        exact = len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(got, ref))
        out.update({"exact": exact, "load_s": round(load_s, 3), "load_gbps": round(state_bytes / load_s / 1e9, 2)})
    if mgr is not None:
        mgr.close()
    if stager is not None:
        _close_stager(stager)
    if method == "torch_process":
        import torch.distributed as dist

        dist.destroy_process_group()
    shutil.rmtree(root, ignore_errors=True)
    return out


# ---- the parent: runs, results, charts --------------------------------------------------------------------


def _stats(r: dict, base_ms: float) -> dict:
    ms = r["step_ms"]
    saves = r["save_steps"]
    plain = [t for i, t in enumerate(ms) if i not in saves and i - 1 not in saves]
    at = [ms[i] for i in saves]
    durable = [r["durable_s"][str(i)] for i in saves if str(i) in r["durable_s"]]
    mean = sum(ms) / len(ms)
    return {
        "mean_ms": round(mean, 2), "mean_overhead_pct": round((mean / base_ms - 1) * 100, 2),
        "worst_ms": round(max(ms), 2), "worst_over_plain_ms": round(max(ms) - base_ms, 2),
        "first_save_ms": at[0] if at else None, "first_save_over_plain_ms": round(at[0] - base_ms, 2) if at else None,
        "later_saves_ms": at[1:], "after_save_ms": [ms[i + 1] for i in saves if i + 1 < len(ms)],
        "plain_median_ms": round(sorted(plain)[len(plain) // 2], 2) if plain else None,
        "durable_s": durable, "cpu_s_loop": r["cpu_s_loop"], "cpu_s_drain": r["cpu_s_drain"],
        "pinned_gb": None if r.get("pinned_bytes") is None else round(r["pinned_bytes"] / 1e9, 2),
        "exact": r.get("exact"), "load_gbps": r.get("load_gbps"), "pool_ready_s": r.get("pool_ready_s"),
        "skipped_steps": r.get("skipped_steps", []),
    }


def _plot(results: list, outdir: str) -> list:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    files = []
    configs = sorted({(r["target"], r["every"]) for r in results if "step_ms" in r})
    for target, every in configs:
        runs = [r for r in results if r.get("target") == target and r.get("every") == every and "step_ms" in r]
        fig, ax = plt.subplots(figsize=(12, 5))
        for r in runs:
            ax.plot(range(len(r["step_ms"])), r["step_ms"], label=r["method"], linewidth=1.2)
            ax.scatter(r["save_steps"], [r["step_ms"][i] for i in r["save_steps"]], s=18)
        for i in sorted({i for r in runs for i in r["save_steps"]}):
            ax.axvline(i, color="grey", alpha=0.25, linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("step (grey lines: steps that save)")
        ax.set_ylabel("step time, ms (log)")
        ax.set_title(f"{runs[0]['gpu'] if runs else ''}: {runs[0]['state_bytes'] / 1e9:.1f} GB of state, "
                     f"a save every {every} steps to {target}")
        ax.legend(fontsize=8)
        name = os.path.join(outdir, f"training_loop_{target}_every{every}.png")
        fig.tight_layout()
        fig.savefig(name, dpi=110)
        plt.close(fig)
        files.append(name)
    return files


def _dd(path: str, files: int, total_gb: float, direct: bool) -> float:
    """GB/s of writing total_gb into `files` files side by side with dd (fsync'd; O_DIRECT on disk)."""
    os.makedirs(path, exist_ok=True)
    count = max(1, int(total_gb * 1e9 / files / (64 << 20)))
    t0 = time.monotonic()
    procs = [subprocess.Popen(["dd", "if=/dev/zero", f"of={path}/f{i}", "bs=64M", f"count={count}", "conv=fsync"]
                              + (["oflag=direct"] if direct else []), stderr=subprocess.DEVNULL)
             for i in range(files)]
    for p in procs:
        p.wait()
    gbps = files * count * (64 << 20) / (time.monotonic() - t0) / 1e9
    shutil.rmtree(path, ignore_errors=True)
    return round(gbps, 2)


def ceilings(args) -> dict:
    """Write ceilings of the targets, measured right before the runs: one file and FILES files side by side."""
    gb = args.state_gb
    out = {"tmpfs_1_file_fresh": _dd(args.tmpfs + "/dd", 1, gb, False),
           f"tmpfs_{args.files}_files": _dd(args.tmpfs + "/dd", args.files, gb, False),
           "disk_1_file_direct": _dd(args.disk + "/dd", 1, min(gb, 4.0), True),
           f"disk_{args.files}_files_direct": _dd(args.disk + "/dd", args.files, min(gb, 4.0), True)}
    print("write ceilings GB/s:", json.dumps(out), flush=True)
    return out


def parent(args) -> None:
    os.makedirs(args.outdir, exist_ok=True)
    out_json = os.path.join(args.outdir, "training_loop.json")
    roots = {"tmpfs": args.tmpfs, "disk": args.disk}
    results, t_start = [], time.monotonic()
    measured = ceilings(args) if args.ceilings else None
    runs = []
    for spec in args.runs.split(";"):
        parts = spec.split(":")  # target:every:methods or target:every:saves:methods
        target, every, methods = parts[0], int(parts[1]), parts[-1]
        saves = int(parts[2]) if len(parts) == 4 else args.saves
        runs += [(target, every, m, every * saves + 3) for m in methods.split(",")]
    estimate = sum(args.run_seconds + steps * args.step_seconds for *_, steps in runs)
    print(f"{len(runs)} runs, estimated {estimate:.0f} s (a run: {args.run_seconds:.0f} s + its steps at "
          f"{args.step_seconds} s), deadline {args.deadline:.0f} s:", flush=True)
    for target, every, method, steps in runs:
        cost = args.run_seconds + steps * args.step_seconds
        print(f"  {target:5} every {every:3} {method:20} {steps:4} steps  ~{cost:4.0f} s", flush=True)
    for target, every, method, steps in runs:
        left = args.deadline - (time.monotonic() - t_start)
        budget = args.run_seconds + steps * args.step_seconds
        if left < budget:
            results.append({"method": method, "target": target, "every": every, "skipped": "deadline"})
            print(f"skip {target} every {every} {method}: {left:.0f} s left", flush=True)
            continue
        root = roots[target]
        os.makedirs(root, exist_ok=True)
        free = shutil.disk_usage(root).free
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--method", method, "--target", target,
               "--every", str(every), "--steps", str(steps), "--root", root, "--device", args.device,
               "--width", str(args.width), "--depth", str(args.depth), "--batch", str(args.batch),
               "--files", str(args.files),
               "--keep-last", str(args.keep_last if free > (args.keep_last + 1.3) * args.state_gb * 1e9 else 1)]
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=max(10, int(min(left, 3 * budget + 30))))  # one hung run spends no more
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(line[-1]) if p.returncode == 0 and line else \
                {"method": method, "target": target, "every": every, "error": p.stderr[-3000:]}
        except subprocess.TimeoutExpired as e:
            r = {"method": method, "target": target, "every": every,
                 "error": f"killed after {e.timeout} s: {(e.stderr or b'')[-2000:]!r}"}
        r["wall_s"] = round(time.monotonic() - t0, 1)
        results.append(r)
        shutil.rmtree(os.path.join(root, method), ignore_errors=True)
        base = next((x for x in results if x.get("method") == "none" and "step_ms" in x), None)
        base_ms = args.base_ms
        if base is not None:
            ms = sorted(base["step_ms"])
            base_ms = ms[len(ms) // 2]
        for x in results:
            if "step_ms" in x:
                # Without a `none` run (or --base-ms) a run is measured against its own median step: a few
                # saving steps among many do not move a median.
                own = sorted(x["step_ms"])[len(x["step_ms"]) // 2]
                x["summary"] = _stats(x, base_ms or own)
        summary = r.get("summary", {})
        print(f"{target:5} every {every:3} {method:20} wall {r['wall_s']:6.1f} s  "
              + (json.dumps(summary) if summary else r.get("error", "")[-400:]), flush=True)
        with open(out_json, "w") as f:
            json.dump({"plain_step_ms": base_ms, "write_ceilings_gbps": measured, "results": results}, f, indent=1)
    charts = _plot(results, args.outdir) if args.charts else []
    print("charts:", charts, flush=True)
    print("\nmethod               target every  mean%   worst-plain  first-save  later saves (ms)        durable s"
          "        cpu s   pinned GB exact load GB/s skipped")
    failed = []
    for x in results:
        s = x.get("summary")
        if not s:
            if "error" in x or (x.get("method") != "none" and "skipped" not in x):
                failed.append(x)
            print(f"{x['method']:20} {x['target']:6} {x['every']:5} "
                  + (f"not run ({x['skipped']})" if "skipped" in x else "FAILED: " + x.get("error", "")[-300:]))
            continue
        if x["method"] != "none" and not s["exact"]:
            failed.append(x)
        print(f"{x['method']:20} {x['target']:6} {x['every']:5} {s['mean_overhead_pct']:6.2f} "
              f"{s['worst_over_plain_ms']:10.1f} {s['first_save_over_plain_ms'] or 0:10.1f}  "
              f"{str([round(v, 1) for v in s['later_saves_ms']]):24} {str([round(v, 1) for v in s['durable_s']]):16} "
              f"{s['cpu_s_loop']:6.1f}+{s['cpu_s_drain']:<5.1f} {s['pinned_gb']} {s['exact']} {s['load_gbps']} "
              f"{s['skipped_steps']}")
    return failed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", nargs="?", default="bench/results")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--method")
    ap.add_argument("--target", default="tmpfs")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--steps", type=int, default=33)
    ap.add_argument("--saves", type=int, default=3, help="saves per run (a run is every * saves + 3 steps)")
    ap.add_argument("--root")
    ap.add_argument("--tmpfs", default="/dev/shm/ckptio-bench")
    ap.add_argument("--disk", default=os.path.abspath("bench-disk"))
    ap.add_argument("--runs", default="tmpfs:10:" + ",".join(METHODS))
    ap.add_argument("--deadline", type=float, default=540.0)
    ap.add_argument("--run-seconds", type=float, default=25.0, help="a run's cost beside its steps (estimate)")
    ap.add_argument("--step-seconds", type=float, default=0.33)
    ap.add_argument("--state-gb", type=float, default=11.3)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--depth", type=int, default=14)
    ap.add_argument("--batch", type=int, default=3072)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--files", type=int, default=8, help="data files per save (thread_count) for torch and "
                    "ckptio_writer, as the manager writes")
    ap.add_argument("--ceilings", action="store_true", help="measure the targets' write ceilings with dd first")
    ap.add_argument("--base-ms", type=float, help="a plain step's time, when no 'none' run is in this call")
    ap.add_argument("--no-charts", dest="charts", action="store_false")
    ap.add_argument("--smoke", action="store_true", help="every method, a small model, seconds: runs end to end")
    args = ap.parse_args()
    if args.smoke and not args.child:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        args.width, args.depth, args.batch, args.state_gb = 256, 2, 32, 0.002
        args.runs = "tmpfs:2:2:" + ",".join(METHODS)
        args.run_seconds, args.step_seconds, args.ceilings = 15.0, 0.01, False
        args.tmpfs = args.tmpfs.rstrip("/") + "-smoke"
        failed, results = parent(args), []
        if os.path.exists(os.path.join(args.outdir, "training_loop.json")):
            with open(os.path.join(args.outdir, "training_loop.json")) as f:
                results = json.load(f)["results"]
        ran = [x["method"] for x in results if "step_ms" in x]
        missing = [m for m in METHODS if m not in ran]
        print("smoke:", f"{len(failed)} run(s) failed: {[x['method'] for x in failed]}" if failed else
              f"not run: {missing}" if missing else "every method ran end to end, every checkpoint exact", flush=True)
        sys.exit(1 if failed or missing else 0)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        os._exit(0)  # a thread of torch's executors may linger
    parent(args)


if __name__ == "__main__":
    main()
