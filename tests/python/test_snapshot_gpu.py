"""Snapshots of GPU training state in a real training loop (skipped without a GPU).

What a snapshot holds for step k is compared, bit for bit, with a copy of every tensor made on the training
stream right after step k (a synchronous reference), while steps k+1 and k+2 run at once without any host
wait; a BatchNorm's running statistics (changed by the next forward, so copied first) included. The same
check with the optimizer hook taken away must see the race, or it would prove nothing. Then the
CheckpointManager and dcp.async_save round trip on the GPU.
"""
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import ckptio
import ckptio.dcp as cdcp
from conftest import requires_cuda

pytestmark = requires_cuda


def _model(width=2048, depth=8, seed=0):
    torch.manual_seed(seed)
    layers = []
    for i in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        if i == depth // 2:
            layers.append(torch.nn.BatchNorm1d(width))
    return torch.nn.Sequential(*layers).cuda()


def _flat(v, out):
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            _flat(x, out)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _flat(x, out)
    return out


class _Loop:
    def __init__(self):
        self.model = _model()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(512, 2048, device="cuda")
        for _ in range(2):
            self.step()
        msd, osd = get_state_dict(self.model, self.opt)
        self.state = {"model": msd, "optim": osd}

    def step(self):
        self.model(self.x).square().mean().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _mismatches(loop, snaps, rounds):
    """Takes a snapshot after each of `rounds` steps and runs two more steps at once; returns the tensors that
    differ from the reference and whether the copies were seen running after the take."""
    bad, overlapped = [], False
    for k in range(rounds):
        loop.step()
        snap = snaps.take(loop.state)
        ref = [t.detach().clone() for t in _flat(loop.state, [])]  # on the training stream: step k's values
        overlapped |= not snap.copied()
        loop.step()
        loop.step()
        snap.wait()
        got = _flat(snap.state_dict, [])
        assert len(got) == len(ref)
        for i, (g, r) in enumerate(zip(got, ref)):
            if g.device.type != "cpu" or not torch.equal(g, r.cpu()):
                bad.append((k, i))
        snap.release()
    torch.cuda.synchronize()
    return bad, overlapped


def test_snapshot_equals_a_synchronous_copy_while_training_goes_on():
    loop = _Loop()
    with ckptio.Snapshots() as snaps:
        snaps.prepare(loop.state)
        snaps.wait_ready()
        assert snaps.info()["pinned"]
        bad, overlapped = _mismatches(loop, snaps, 6)
        assert bad == [], f"tensors that differ from step k's: {bad[:10]}"
        assert overlapped, "the copies never ran beside the steps that followed"


def test_the_check_sees_a_missing_wait(monkeypatch):
    loop = _Loop()
    with ckptio.Snapshots() as snaps:
        snaps.prepare(loop.state)
        snaps.wait_ready()
        monkeypatch.setattr(snaps, "_before_update_current", lambda: None)  # the optimizer no longer waits
        bad, _ = _mismatches(loop, snaps, 3)
        assert bad, "without the wait the next optimizer step should overwrite tensors before their copy"


def test_manager_and_async_save_round_trip_on_the_gpu(tmp_path):
    loop = _Loop()
    with ckptio.CheckpointManager(tmp_path / "run", keep_last=2) as mgr:
        mgr.prepare(loop.state)
        want = {}
        for s in (1, 2):
            loop.step()
            msd, osd = get_state_dict(loop.model, loop.opt)
            mgr.save(s, {"model": msd, "optim": osd, "step": s})
            want[s] = {k: v.detach().clone() for k, v in msd.items()}
            loop.step()
        mgr.wait()
        fresh = _model(seed=1)
        fopt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        msd, osd = get_state_dict(fresh, fopt)
        sd = {"model": msd, "optim": osd, "step": -1}
        assert mgr.load(sd, step=1) == 1 and sd["step"] == 1
        set_state_dict(fresh, fopt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        for k, v in get_state_dict(fresh, fopt)[0].items():
            assert torch.equal(v, want[1][k]), k
    writer = cdcp.FileSystemWriter(tmp_path / "w")
    writer.prepare(loop.state)
    ref = {k: v.detach().clone() for k, v in loop.state["model"].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fut = dcp.async_save({"model": loop.state["model"]}, storage_writer=writer, no_dist=True)
        loop.step()
        fut.result()
        out = {"model": {k: torch.zeros_like(v) for k, v in ref.items()}}
        dcp.load(out, storage_reader=cdcp.FileSystemReader(tmp_path / "w"), no_dist=True)
    for k, v in ref.items():
        assert torch.equal(out["model"][k], v), k


@pytest.mark.parametrize("early", [False, True])
def test_tensors_outside_the_optimizer_copied_first(early):
    """A buffer the next forward changes is exact too; with a frozen weight marked guarded the copy of it
    overlaps (the caller's promise)."""
    loop = _Loop()
    bn = [m for m in loop.model if isinstance(m, torch.nn.BatchNorm1d)][0]
    with ckptio.Snapshots() as snaps:
        state = {"stats": bn.running_mean, "var": bn.running_var}
        if not early:
            snaps.guard([bn.running_mean, bn.running_var])
        loop.step()
        snap = snaps.take(state)
        want = [bn.running_mean.clone(), bn.running_var.clone()]
        if not early:
            snaps.before_update()  # the caller's promise: it waits before changing them
        loop.step()
        snap.wait()
        assert torch.equal(snap.state_dict["stats"], want[0].cpu()) and torch.equal(snap.state_dict["var"],
                                                                                      want[1].cpu())
        snap.release()
