"""CheckpointManager while a save is still writing (docs/SNAPSHOTS.md, docs/MANAGER.md): async_busy="skip"
never holds the caller, says which step was not saved (the Future's SkippedSave, a WARNING line) and the
next save after the write proceeds; the saves it does start hold exactly the state of their step; retention
and markers only ever see the steps saved; ranks skip together; "wait" saves every step; a per-call
override; the save-time check of values the reader would refuse costs a training loop's state no pickling on
the caller's thread; the caller's thread takes only the snapshot."""
import argparse
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402

import ckptio  # noqa: E402
from test_snapshot import _assert_same, _clone, _slow_writes as _gated_writes  # noqa: E402


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.GELU(), torch.nn.Linear(24, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train(model, opt)
    return model, opt


def _train(model, opt):
    model(torch.randn(8, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _state(model, opt, step):
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "extra": {"step": step, "rng": torch.get_rng_state(), "pos": [step, 0]}}


def _loaded(mgr, template, step):
    got = _clone(template)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert mgr.load(got, step=step) == step
    return got


def test_skip_never_waits_and_saves_exactly_the_steps_it_starts(tmp_path, monkeypatch, caplog):
    model, opt = _model()
    gate = _gated_writes(monkeypatch)
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=2, async_busy="skip")
    assert mgr.load(_state(model, opt, 0)) is None  # the pool pinned for this state
    wanted, results = {}, {}
    caplog.set_level(logging.WARNING, logger="ckptio.manager")
    for step in (10, 20, 30, 40, 50):
        state = _state(model, opt, step)
        wanted[step] = _clone(state)
        t0 = time.monotonic()
        results[step] = mgr.save(step, state)
        assert time.monotonic() - t0 < 5  # never waits for the gate (a wait would last until it opens)
        _train(model, opt)  # training changes the live state right after the call
        state["extra"]["pos"].append(-1)
        if step == 20:
            # 10 is still writing: 20 was skipped, at once, with a result that says so.
            skipped = results[20].result(timeout=0)
            assert isinstance(skipped, ckptio.SkippedSave) and (skipped.step, skipped.writing) == (20, 10)
            assert str(skipped) == "skipped: step 10's save was still writing; step 20 was not saved"
            assert any("skipped: step 10's save was still writing" in r.getMessage() and str(root) in r.getMessage()
                       for r in caplog.records)
            gate.set()
            assert results[10].result(timeout=60) == 10
        if step == 30:
            assert results[30].result(timeout=60) == 30  # the first save after the write: proceeds
            gate.clear()  # closed before 40 is asked for, so 40 stays in flight and 50 is skipped
        if step == 50:
            assert isinstance(results[50].result(timeout=0), ckptio.SkippedSave)
            gate.set()
    mgr.wait()
    assert [results[s].result() for s in (10, 30, 40)] == [10, 30, 40]
    # Retention counted only the steps saved (keep_last=2); nothing of a skipped step is on disk.
    assert mgr.all_steps() == [30, 40]
    assert sorted(n for n in os.listdir(root) if n.startswith("step_")) == ["step_00000030", "step_00000040"]
    assert [(s[0], s[1]) for s in ckptio._ckptio.steps_scan(str(root))] == [(30, "complete"), (40, "complete")]
    for step in (30, 40):  # each the state at its request, bit for bit, though training went on
        _assert_same(_loaded(mgr, wanted[step], step), wanted[step], f"step {step}")
    mgr.close()


def test_wait_saves_every_step_and_a_call_overrides_the_policy(tmp_path, monkeypatch):
    model, opt = _model()
    gate = _gated_writes(monkeypatch)
    mgr = ckptio.CheckpointManager(tmp_path / "run", async_busy="skip")
    mgr.prepare(_state(model, opt, 0))
    first = _state(model, opt, 1)
    wanted = {1: _clone(first)}
    f1 = mgr.save(1, first)
    _train(model, opt)
    # The last save of a run must not be skipped: "wait" for this call.
    second = _state(model, opt, 2)
    wanted[2] = _clone(second)
    threading.Timer(0.3, gate.set).start()
    t0 = time.monotonic()
    f2 = mgr.save(2, second, async_busy="wait")
    assert time.monotonic() - t0 >= 0.25 and f1.done() and f1.result() == 1
    _train(model, opt)
    assert f2.result(timeout=60) == 2
    assert mgr.all_steps() == [1, 2]
    for step in (1, 2):
        _assert_same(_loaded(mgr, wanted[step], step), wanted[step], f"step {step}")
    # A manager that waits, skipping for one call.
    gate.clear()
    waiting = ckptio.CheckpointManager(tmp_path / "run2")
    waiting.prepare(_state(model, opt, 0))
    g1 = waiting.save(1, _state(model, opt, 1))
    g2 = waiting.save(2, _state(model, opt, 2), async_busy="skip")
    assert isinstance(g2.result(timeout=0), ckptio.SkippedSave)
    with pytest.raises(ValueError, match="async_busy"):
        waiting.save(3, _state(model, opt, 3), async_busy="later")
    gate.set()
    assert g1.result(timeout=60) == 1
    waiting.close()
    assert waiting.all_steps() == [1]
    mgr.close()


def test_skip_in_a_synchronous_manager_saves_every_step(tmp_path):
    model, opt = _model()
    mgr = ckptio.CheckpointManager(tmp_path / "run", async_save=False, async_busy="skip")
    for step in (1, 2, 3):
        assert mgr.save(step, _state(model, opt, step)).result() == step
    assert mgr.all_steps() == [1, 2, 3]


def test_the_save_time_check_pickles_nothing_of_a_training_state(tmp_path, monkeypatch):
    """A training loop's state (tensors, optimizer hyper-parameters, ints, strs, RNG state as a tensor) is
    checked without pickling anything on the caller's thread; a value the reader would refuse is still
    refused there, before the root exists."""
    model, opt = _model()
    caller = threading.get_ident()
    pickled = []
    real = torch.save

    def counting(obj, f, *a, **k):
        if threading.get_ident() == caller:
            pickled.append(type(obj).__name__)
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", counting)
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, async_busy="wait")
    state = _state(model, opt, 5)
    state["extra"]["name"] = "run-1"
    state["extra"]["sched"] = {"milestones": (10, 20), "gamma": 0.5, "last": None}
    mgr.save(5, state)
    assert pickled == []
    mgr.wait()
    # Refused values still fail at the call, nothing written, also inside a tuple of plain values.
    for bad, key in ((argparse.Namespace(lr=0.1), "args"), ((1, "a", argparse.Namespace(lr=0.1)), "cfg")):
        other = tmp_path / f"bad-{key}"
        with pytest.raises(TypeError, match=f"cannot save '{key}'"):
            ckptio.CheckpointManager(other).save(1, {"w": torch.ones(2), key: bad})
        assert not os.path.exists(other)
    mgr.close()


def test_an_async_save_holds_the_caller_only_for_the_snapshot(tmp_path, monkeypatch):
    """In one process the caller's thread takes the snapshot; the root's lock, the step's begin (directory,
    begun mark, fsyncs), the commit and retention all run on the save thread; the Future resolves to the
    step and every step saved loads back."""
    model, opt = _model()
    on_caller = []
    for name in ("dcp_lock_acquire", "steps_begin", "steps_commit", "steps_retain"):
        real = getattr(ckptio._ckptio, name)

        def spy(*a, _real=real, _name=name, **k):
            on_caller.append((_name, threading.current_thread() is threading.main_thread()))
            return _real(*a, **k)

        monkeypatch.setattr(ckptio._ckptio, name, spy)
    mgr = ckptio.CheckpointManager(tmp_path / "run", keep_last=1)
    mgr.prepare(_state(model, opt, 0))
    wanted = {}
    for step in (1, 2):
        state = _state(model, opt, step)
        wanted[step] = _clone(state)
        assert mgr.save(step, state).result(timeout=60) == step
        _train(model, opt)
    mgr.wait()
    assert {name for name, _ in on_caller} == {"dcp_lock_acquire", "steps_begin", "steps_commit", "steps_retain"}
    assert [name for name, caller in on_caller if caller] == []
    assert mgr.all_steps() == [2]
    _assert_same(_loaded(mgr, wanted[2], 2), wanted[2], "step 2")
    mgr.close()



_TWO_RANKS_SKIP = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    import ckptio
    from ckptio import _manager
    rank, init, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    if rank == 0:  # rank 0's commit is slow: its save of step 1 is still in flight when rank 1's is done
        real = _manager._ckptio

        class Slow:
            def __getattr__(self, name):
                if name != "steps_commit":
                    return getattr(real, name)
                return lambda *a, **k: (time.sleep(2.0), real.steps_commit(*a, **k))[1]

        _manager._ckptio = Slow()
    mgr = ckptio.CheckpointManager(root, async_busy="skip")
    state = lambda s: {"x": torch.full((100,), float(s)), f"r{rank}": torch.full((10,), float(rank)), "step": s}
    f1 = mgr.save(1, state(1))
    if rank == 1:
        assert f1.result(timeout=60) == 1  # done here; still committing on rank 0
    f2 = mgr.save(2, state(2))  # every rank skips, or a lone rank would start a save the other never joins
    r2 = f2.result(timeout=0)
    print("SKIPPED", type(r2).__name__, getattr(r2, "step", None), getattr(r2, "writing", None), flush=True)
    mgr.wait()
    assert mgr.save(3, state(3)).result(timeout=60) == 3
    assert mgr.all_steps() == [1, 3], mgr.all_steps()
    mgr.close()
    dist.destroy_process_group()
    print("OK", flush=True)
    os._exit(0)  # as the other multi-rank workers: gloo's teardown now and then aborts after the checks
""")


def test_ranks_skip_together(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(_TWO_RANKS_SKIP)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parent.parent)] + sys.path)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "init"), str(tmp_path / "run")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0 and "SKIPPED SkippedSave 2 1" in out and "OK" in out, out
