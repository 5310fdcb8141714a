"""ckptio.Snapshots on the CPU: a snapshot holds the state at the take, bit for bit, while training goes on
(model, optimizer, extra values, odd tensor layouts); the pool is sized once, reused and held one snapshot at
a time; ckptio.dcp's async save and CheckpointManager write exactly the state of the step they were asked
for, also when a save is asked for while the previous one is still writing (it waits: never a mixed
checkpoint); DTensor shards of FSDP2 on one and two gloo ranks. The GPU side (copy stream, events, the
optimizer step waiting on the device) is tests/test_snapshot.c on the simulated device and
tests/python/test_snapshot_gpu.py on a real one."""
import gc
import io
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
import ckptio.dcp as cdcp
from ckptio.dcp import _writer


def _train_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.BatchNorm1d(48), torch.nn.Linear(48, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        model(torch.randn(16, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _step(model, opt):
    model(torch.randn(16, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, dict):
        return type(v)((k, _clone(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(x) for x in v)
    if isinstance(v, io.BytesIO):
        return io.BytesIO(v.getvalue())
    return v


def _assert_same(a, b, where="state"):
    assert type(a) is type(b) or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)), (where, type(a),
                                                                                                 type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b.view(torch.uint8)
                           if b.dtype == torch.bool else b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, io.BytesIO):
        assert a.getvalue() == b.getvalue(), where
    else:
        assert a == b, (where, a, b)


def test_snapshot_holds_the_state_at_the_take():
    model, opt = _train_state()
    base = torch.randn(40, 30)
    loader = {"epoch": 3, "seen": [1, 2, 3]}
    sd = {
        "model": model.state_dict(), "optim": opt.state_dict(), "step": 7, "rng": torch.get_rng_state(),
        "loader": loader, "blob": io.BytesIO(b"position 12"),
        "odd": {"t": base.t(), "cols": base[:, 3:9], "expanded": torch.arange(5.0).expand(4, 5),
                "empty": torch.empty(0, 7), "scalar": torch.tensor(2.5), "bf16": torch.randn(33).bfloat16(),
                "mask": torch.rand(17) > 0.5, "tuple": (torch.ones(3), "x")},
    }
    want = _clone(sd)
    with ckptio.Snapshots() as snaps:
        snaps.prepare(sd)
        snaps.wait_ready()
        snap = snaps.take(sd)
        # Training goes on: every tensor and value changes in place.
        _step(model, opt)
        with torch.no_grad():
            base.mul_(-1)
            sd["odd"]["scalar"].add_(1)
            sd["odd"]["mask"].logical_not_()
        loader["seen"].append(4)
        loader["epoch"] = 4
        sd["blob"].write(b"!")
        assert snap.copied()  # host copies are made during the take
        snap.wait()
        _assert_same(snap.state_dict, want)
        assert not snap.state_dict["odd"]["t"].is_contiguous()
        snap.release()


def test_pool_sized_once_and_reused(caplog):
    sd = {"a": torch.randn(1000, 100), "b": torch.randn(50)}
    with ckptio.Snapshots() as snaps:
        snaps.prepare(sd)
        info = snaps.info()
        assert info["nbytes"] >= 1000 * 100 * 4 + 4096 and not info["held"] and not info["pinned"]
        addresses = set()
        for i in range(3):
            with torch.no_grad():
                sd["a"].fill_(i)
            snap = snaps.take(sd)
            assert snaps.info()["held"]
            snap.wait()
            assert torch.equal(snap.state_dict["a"], torch.full((1000, 100), float(i)))
            addresses.add(snap.state_dict["a"].data_ptr())
            snap.release()
        assert len(addresses) == 1 and snaps.info()["address"] == info["address"]
        # A larger state: a new pool, said so.
        sd["c"] = torch.randn(2000, 1000)
        with caplog.at_level("WARNING", logger="ckptio.snapshot"):
            snaps.take(sd).release()
        assert "too small for this state" in caplog.text
        assert snaps.info()["nbytes"] >= 2000 * 1000 * 4


def test_one_snapshot_at_a_time():
    sd = {"a": torch.ones(100)}
    with ckptio.Snapshots() as snaps:
        first = snaps.take(sd)
        taken = threading.Event()
        second = []

        def take_again():
            second.append(snaps.take({"a": torch.full((100,), 2.0)}))
            taken.set()

        t = threading.Thread(target=take_again)
        t.start()
        assert not taken.wait(0.3)  # waits for the first to be released
        assert torch.equal(first.state_dict["a"], torch.ones(100))
        first.release()
        assert taken.wait(10)
        t.join()
        assert torch.equal(second[0].state_dict["a"], torch.full((100,), 2.0))
        # A snapshot dropped without release gives the pool back too.
        del second[:]
        gc.collect()
        snaps.take(sd).release()


def test_close_while_a_snapshot_is_held():
    sd = {"a": torch.arange(1000.0)}
    snaps = ckptio.Snapshots()
    snap = snaps.take(sd)
    snaps.close()  # returns at once; the pool stays while the snapshot shows it
    snap.wait()
    assert torch.equal(snap.state_dict["a"], torch.arange(1000.0)) and snaps.info()["held"]
    snap.release()  # now the pool goes
    assert snaps.info() == {}
    with pytest.raises(RuntimeError, match="closed"):
        snaps.take(sd)
    shared = ckptio.Snapshots.shared()
    assert shared is ckptio.Snapshots.shared() and cdcp.FileSystemWriter("x")._resolve_snapshots() is shared


def _slow_writes(monkeypatch):
    """Data writes wait for the returned event: a save stays in flight while the test trains on."""
    gate = threading.Event()
    real = _writer.FileSystemWriter._write

    def slow(self, plan, planner):
        assert gate.wait(60)
        return real(self, plan, planner)

    monkeypatch.setattr(_writer.FileSystemWriter, "_write", slow)
    return gate


def _load_into(template, path):
    out = _clone(template)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    return out


def test_async_save_writes_the_state_of_its_step(tmp_path, monkeypatch):
    model, opt = _train_state()
    gate = _slow_writes(monkeypatch)
    states, futures = [], []
    writer = cdcp.FileSystemWriter(tmp_path / "ckpt")
    sd = {"model": model.state_dict(), "step": torch.tensor(0)}
    writer.prepare(sd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(2):
            sd["step"].fill_(k)
            states.append(_clone(sd))
            if k == 1:  # asked while the first is still writing: waits for it (then the gate is open)
                threading.Timer(0.3, gate.set).start()
            futures.append(dcp.async_save(sd, checkpoint_id=tmp_path / f"ckpt{k}", storage_writer=writer,
                                          no_dist=True))
            _step(model, opt)  # training goes on while it writes
        for f in futures:
            f.result()
    for k in range(2):
        _assert_same(_load_into(states[k], tmp_path / f"ckpt{k}"), states[k], f"ckpt{k}")


def test_manager_saves_the_state_of_its_step(tmp_path, monkeypatch):
    model, opt = _train_state()
    gate = _slow_writes(monkeypatch)
    mgr = ckptio.CheckpointManager(tmp_path / "run", keep_last=3)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "extra": {"rng": torch.get_rng_state(), "pos": [0]}}
    assert mgr.load(state) is None  # nothing to resume: the pool is pinned for this state
    assert mgr._snapshots.info()["nbytes"] > 0
    wanted = {}
    for step in (10, 20, 30):
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "extra": {"rng": torch.get_rng_state(), "pos": [step]}}
        wanted[step] = _clone(state)
        if step == 20:
            threading.Timer(0.3, gate.set).start()  # step 20 waits for step 10's write
        t0 = time.monotonic()
        mgr.save(step, state)
        if step == 20:
            assert time.monotonic() - t0 >= 0.25
        _step(model, opt)
        state["extra"]["pos"].append(-1)
    mgr.wait()
    assert mgr.all_steps() == [10, 20, 30]
    for step in (10, 20, 30):
        got = _clone(wanted[step])
        assert mgr.load(got, step=step) == step
        _assert_same(got, wanted[step], f"step {step}")
    mgr.close()
    assert mgr._snapshots.info() == {}


def test_unsupported_tensors_stage_as_torch_does(tmp_path):
    class Marked(torch.Tensor):
        pass

    sd = {"w": torch.randn(10).as_subclass(Marked), "plain": torch.randn(4)}
    want = {"w": torch.Tensor(sd["w"]).clone(), "plain": sd["plain"].clone()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.async_save(sd, storage_writer=cdcp.FileSystemWriter(tmp_path / "c"), no_dist=True).result()
    got = _load_into({"w": torch.zeros(10), "plain": torch.zeros(4)}, tmp_path / "c")
    assert torch.equal(got["w"], want["w"]) and torch.equal(got["plain"], want["plain"])


_FSDP_WORKER = textwrap.dedent("""
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor
    import ckptio

    rank, world, store, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)

    def step():
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    msd, osd = get_state_dict(model, opt)
    # A snapshot of DTensor shards: host local tensors, the same placements.
    with ckptio.Snapshots() as snaps:
        snap = snaps.take({"model": msd})
        want = {k: v.to_local().clone() for k, v in msd.items()}
        step()
        snap.wait()
        for k, v in snap.state_dict["model"].items():
            assert isinstance(v, DTensor) and v.placements == msd[k].placements and v.shape == msd[k].shape, k
            assert torch.equal(v.to_local(), want[k]), k
        snap.release()
    mgr = ckptio.CheckpointManager(root, keep_last=2)
    full = {}
    for s in (1, 2):
        msd, osd = get_state_dict(model, opt)
        mgr.save(s, {"model": msd, "optim": osd, "step": s})
        full[s] = {k: v.full_tensor().clone() for k, v in msd.items()}
        step()  # training goes on while the save writes
    mgr.wait()
    for s in (1, 2):
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd, "step": -1}
        assert mgr.load(sd, step=s) == s and sd["step"] == s
        for k, v in sd["model"].items():
            assert torch.equal(v.full_tensor(), full[s][k]), (s, k)
    mgr.close()
    dist.barrier()
    dist.destroy_process_group()
    print("OK", rank, flush=True)
    os._exit(0)  # torch's gloo may abort in interpreter teardown after a clean run
""")


@pytest.mark.parametrize("world", [1, 2])
def test_fsdp2_shards_on_gloo(tmp_path, world):
    script = tmp_path / "fsdp.py"
    script.write_text(_FSDP_WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parent.parent)] + sys.path)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), str(tmp_path / "store"),
                               str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for r in range(world)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {r}" in out, f"rank {r} of {world}:\n{out[-3000:]}"
