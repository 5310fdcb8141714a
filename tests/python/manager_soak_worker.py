"""One rank of the checkpoint manager's soak job (test_manager_soak.py).

A small real training loop: an MLP with AdamW on batches made from the step
number (so a rerun of a step computes the same values), async saves through
ckptio.CheckpointManager every SAVE_EVERY steps, keep_last=3. Before each
save, rank 0 writes what it saves (torch.save of a copy, atomically) as
REFS/step_N.pt; the save cannot be "newer" than its reference.

On start the job resumes with manager.load() and checks, printing one line
that the driver reads:
  - the step loaded is the newest complete step of the root;
  - model and optimizer state equal the reference of that step, byte for byte
    (every tensor's dtype, shape and bytes; every other value ==);
  - the state's own step counter is that step, and training continues at +1;
  - the root holds at most keep_last complete steps and at most one partial.
Any violation exits with status 3 and a message. Then it prints READY and
trains until killed (or until TOTAL steps, then DONE).

CKPTIO_TEST_SOAK_DEVICE=cuda trains on the GPU (async saves from GPU memory).

usage: manager_soak_worker.py - - RANK WORLD INIT_FILE TOTAL SAVE_EVERY, then on stdin the lines
GO, ROOT, REFS (the driver starts ranks ahead of time and lets them go)
"""
import os
import sys

import torch

KEEP = 3


def fail(msg: str) -> None:
    print(f"SOAK-FAIL {msg}", flush=True)
    sys.exit(3)


def same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            fail(f"{where}: tensor vs {type(b).__name__}")
        if a.dtype != b.dtype or a.shape != b.shape:
            fail(f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
        if a.contiguous().reshape(-1).view(torch.uint8).tolist() != b.contiguous().reshape(-1).view(torch.uint8).tolist():
            fail(f"{where}: bytes differ")
    elif isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            fail(f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b)) if isinstance(b, dict) else b}")
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            fail(f"{where}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif a != b:
        fail(f"{where}: {a!r} vs {b!r}")


def copy(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, dict):
        return {k: copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [copy(x) for x in v]
    return v


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, 16, generator=g)
    return x, (x.sum(dim=1, keepdim=True) > 0).float()


def main() -> None:
    root, refs, rank, world, init_file, total, save_every = sys.argv[1:8]
    rank, world, total, save_every = int(rank), int(world), int(total), int(save_every)
    torch.set_num_threads(1)
    import logging

    logging.basicConfig(level=logging.WARNING, format=f"[rank {rank}] %(message)s")
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import ckptio

    # Started ahead of time by the driver (imports done): wait for the go,
    # which comes once the previous job was killed.
    if sys.stdin.readline().strip() != "GO":
        return
    root, refs = sys.stdin.readline().rstrip("\n"), sys.stdin.readline().rstrip("\n")
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    device = torch.device(os.environ.get("CKPTIO_TEST_SOAK_DEVICE", "cpu"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 1)).to(device)
    train = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mgr = ckptio.CheckpointManager(root, keep_last=KEEP, async_save=True)

    def state(step: int):
        msd, osd = get_state_dict(model, optim)
        return {"model": msd, "optim": osd, "step": step}

    sd = state(-1)
    newest = mgr.latest_step()
    resumed = mgr.load(sd)
    if resumed != newest:
        fail(f"resumed from step {resumed}, the newest complete step is {newest}")
    start = 0
    if resumed is not None:
        set_state_dict(model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        if sd["step"] != resumed:
            fail(f"the state's step counter is {sd['step']}, the step loaded {resumed}")
        ref = torch.load(os.path.join(refs, f"step_{resumed}.pt"), weights_only=True)
        same(ref, copy(state(resumed)), f"step {resumed}")
        start = resumed + 1
    if rank == 0:
        states = [s[1] for s in ckptio._ckptio.steps_scan(root)]
        if states.count("complete") > KEEP or states.count("partial") > 1 or "damaged" in states:
            fail(f"the root holds {states}")
    print(f"READY {resumed} {start}", flush=True)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(start, total):
        x, y = (t.to(device) for t in batch(step * world + rank))
        optim.zero_grad()
        loss_fn(train(x), y).backward()
        optim.step()
        if step % save_every == 0:
            sd = state(step)
            if rank == 0:
                path = os.path.join(refs, f"step_{step}.pt")
                torch.save(copy(sd), path + ".tmp")
                os.replace(path + ".tmp", path)
            mgr.save(step, sd)
    mgr.close()
    if world > 1:
        dist.destroy_process_group()
    print("DONE", flush=True)
    # Skip interpreter teardown: torch's gloo group now and then aborts in it
    # ("terminate called without an active exception") after all was done.
    os._exit(0)


if __name__ == "__main__":
    main()
