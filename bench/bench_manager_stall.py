"""The stall a training job pays for ckptio.CheckpointManager's async saves
from GPU memory (BENCHMARKS.md, "Checkpoint manager in a training loop").

A GPU model (a stack of Linear + GELU layers, fp32, AdamW) trains STEPS
steps without saves, then STEPS steps with ``manager.save`` (async) every
EVERY steps; each step is timed with a CUDA synchronize at its end (so a
step's time includes whatever the save blocked on the GPU's stream or the
host). Prints one JSON line: the model's parameter and state bytes, the
median and mean step time without saves, with saves, and of the steps that
called save; then resumes from the newest step and checks the model equals
what was saved.

usage: python bench/bench_manager_stall.py [ROOT] (env: WIDTH, DEPTH, STEPS, EVERY)
"""
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import ckptio


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ckptio-stall-")
    width, depth = int(os.environ.get("WIDTH", "4096")), int(os.environ.get("DEPTH", "8"))
    steps, every = int(os.environ.get("STEPS", "60")), int(os.environ.get("EVERY", "10"))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, width, device=dev)

    def step() -> float:
        t0 = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optim.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(5):  # warm-up, optimizer state allocated
        step()
    plain = [step() for _ in range(steps)]
    mgr = ckptio.CheckpointManager(root, keep_last=3, async_save=True)
    with_saves, at_save = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        if i % every == 0:
            msd, osd = get_state_dict(model, optim)
            mgr.save(i, {"model": msd, "optim": osd, "step": i})
        step()
        t = time.perf_counter() - t0  # the save call and the step
        with_saves.append(t)
        if i % every == 0:
            at_save.append(t)
    t0 = time.perf_counter()
    mgr.wait()
    drain = time.perf_counter() - t0
    last = (steps - 1) // every * every
    saved = {k: v.detach().clone() for k, v in get_state_dict(model, optim)[0].items()}
    # Resume: the model equals what was saved at the newest step only if
    # training stopped there; compare against a fresh save instead.
    msd, osd = get_state_dict(model, optim)
    mgr.save(steps, {"model": msd, "optim": osd, "step": steps})
    mgr.wait()
    fresh = torch.nn.Sequential(*[m.__class__(width, width) if isinstance(m, torch.nn.Linear) else m
                                  for m in layers]).to(dev)
    fopt = torch.optim.AdamW(fresh.parameters(), lr=1e-4)
    fmsd, fosd = get_state_dict(fresh, fopt)
    sd = {"model": fmsd, "optim": fosd, "step": -1}
    t0 = time.perf_counter()
    got = mgr.load(sd)
    load_s = time.perf_counter() - t0
    set_state_dict(fresh, fopt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    equal = got == steps and all(torch.equal(saved[k], v) for k, v in get_state_dict(fresh, fopt)[0].items())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    ms = lambda v: round(v * 1e3, 2)  # noqa: E731
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(), "param_bytes": params, "state_bytes": 3 * params,
        "steps": steps, "save_every": every, "last_save": last,
        "step_ms_no_saves": {"median": ms(statistics.median(plain)), "mean": ms(statistics.mean(plain))},
        "step_ms_with_saves": {"median": ms(statistics.median(with_saves)), "mean": ms(statistics.mean(with_saves))},
        "step_ms_at_save": {"median": ms(statistics.median(at_save)), "max": ms(max(at_save)),
                            "each": [ms(v) for v in at_save]},
        "drain_s": round(drain, 3), "load_full_check_s": round(load_s, 3), "resumed_equal": equal,
        "steps_kept": mgr.all_steps()}), flush=True)
    mgr.close()
    if not equal:
        sys.exit(1)


if __name__ == "__main__":
    main()
