"""nccl_checks.py - the PASS/FAIL and timing harness the multi-rank GPU checks share
(dcp_nccl_check.py, model_nccl_check.py; run by torchrun, which puts this directory on sys.path).

Every rank runs every check; a check passes when it passed on every rank (one all_reduce of a flag), rank 0
prints "PASS name" / "FAIL name", a rank whose own check failed prints its reason.
"""
import time
import traceback

import torch
import torch.distributed as dist


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def summed(value, device):
    """value summed over the ranks (an int)."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return int(t.item())


class Checks:
    def __init__(self, rank, device, unit=""):
        self.rank, self.device, self.unit = rank, device, unit  # unit: what the GB/s of "time" lines count
        self.results = {}
        self.times = {}

    def check(self, name, fn):
        """Runs fn on every rank; the check passes when it passed everywhere (fn returns anything but False or
        a str, which is the reason it failed, and raises nothing)."""
        err = None
        try:
            ok = fn()
            if isinstance(ok, str):
                err = ok
            elif ok is False:
                err = "returned False"
        except Exception as e:  # noqa: BLE001 - reported as FAIL, the run goes on
            err = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        flag = torch.tensor([0 if err is None else 1], device=self.device)
        dist.all_reduce(flag)
        passed = flag.item() == 0
        self.results[name] = passed
        if err is not None:
            print(f"FAIL {name} (rank {self.rank}): {err[:2000]}", flush=True)
        elif self.rank == 0:
            print(f"{'PASS' if passed else 'FAIL'} {name}" + ("" if passed else " (failed on another rank)"),
                  flush=True)
        return passed

    def timed(self, name, nbytes, fn, again=False):
        """Times fn on every rank (barriers around it); with `again`, a second time too: the first scatter of a
        process pays NCCL's lazy set-up of its point-to-point connections (all_to_all_single), which is NCCL's
        once per group, not the load's."""
        out = None
        for label in (name, name + ", again") if again else (name,):
            del out
            sync(self.device)
            dist.barrier()
            t0 = time.perf_counter()
            out = fn()
            sync(self.device)
            dist.barrier()
            dt = time.perf_counter() - t0
            self.times[label] = dt
            if self.rank == 0:
                print(f"time {label}: {dt:.3f} s, {nbytes / dt / 1e9:.2f} GB/s{self.unit} ({nbytes / 1e6:.0f} MB)",
                      flush=True)
        return out
