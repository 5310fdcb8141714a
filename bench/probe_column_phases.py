"""Where one rank's column-slice load spends its time: Python's planning, the engine, the waits on copies.

    python3 bench/probe_column_phases.py DIR      # one JSON line per load
For TP 2 and 8, rank 0's column slices of every matrix of DIR (as bench/probe_column_slices.py cuts them), 3
loads each: `plan_slices` (the requests as boxes, in Python), then `read_slices` to cuda:0 with the engine's
counters around it: `seconds_io` (the engine's time for the plan) and `seconds_copy` (workers' waits on GPU
copies, summed over workers).
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_column_slices import requests_for  # noqa: E402


def main():
    import ckptio
    d = sys.argv[1]
    torch.zeros(1, device="cuda:0")
    whole = ckptio.load(d, device="cuda:0")
    shapes = {k: tuple(v.shape) for k, v in whole.items()}
    del whole
    eng = ckptio.default_engine()
    for tp in (2, 8):
        req = requests_for(shapes, tp, 0, "cols")
        for _ in range(3):
            with ckptio.open(d, device="cuda:0") as f:
                t0 = time.perf_counter()
                plan = f.plan_slices(req)
                t1 = time.perf_counter()
                s0 = eng.stats()
                out = f.read_slices(plan, device="cuda:0")
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                s1 = eng.stats()
            print(json.dumps({"tp": tp, "plan_s": round(t1 - t0, 4), "read_s": round(t2 - t1, 4),
                              "engine_seconds_io": round(s1["seconds_io"] - s0["seconds_io"], 4),
                              "seconds_copy": round(s1["seconds_copy"] - s0["seconds_copy"], 4)}), flush=True)
            del out


if __name__ == "__main__":
    main()
