"""How long ckptio.CheckpointManager.save (async) holds the caller's thread, for a CPU state (BENCHMARKS.md,
"Checkpoint manager in a training loop"): the time from the call to its return, each save waited for before
the next call (not counted), against a plain torch.save of the same state to the same file system. The first
save (which sizes and pins the snapshot pool) is reported apart. Prints one JSON line.

usage: python bench/bench_manager_save_call.py [ROOT] (env: MB (default 16), SAVES (default 20))
"""
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import ckptio


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ckptio-save-call-")
    mb, saves = int(os.environ.get("MB", "16")), int(os.environ.get("SAVES", "20"))
    n = mb * (1 << 20) // 4 // 4
    state = {"model": {f"w{i}": torch.randn(n) for i in range(4)}, "step": 0}
    ms = lambda v: round(v * 1e3, 2)  # noqa: E731
    plain = []
    for i in range(saves):
        t0 = time.perf_counter()
        torch.save(state, os.path.join(root, "plain.pt"))
        plain.append(time.perf_counter() - t0)
    os.remove(os.path.join(root, "plain.pt"))
    calls, durable = [], []
    with ckptio.CheckpointManager(os.path.join(root, "run"), keep_last=2) as mgr:
        mgr.prepare(state)
        for step in range(saves + 1):
            state["step"] = step
            t0 = time.perf_counter()
            f = mgr.save(step, state)
            calls.append(time.perf_counter() - t0)
            f.result()
            durable.append(time.perf_counter() - t0)
            mgr.wait()
        steps = mgr.all_steps()
    print(json.dumps({
        "state_mb": mb, "saves": saves, "root": root,
        "torch_save_ms": {"median": ms(statistics.median(plain)), "min": ms(min(plain)), "max": ms(max(plain))},
        "first_save_call_ms": ms(calls[0]),
        "save_call_ms": {"median": ms(statistics.median(calls[1:])), "min": ms(min(calls[1:])),
                         "max": ms(max(calls[1:]))},
        "call_to_committed_ms": {"median": ms(statistics.median(durable[1:]))},
        "steps_kept": steps}), flush=True)


if __name__ == "__main__":
    main()
