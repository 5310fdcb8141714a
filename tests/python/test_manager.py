"""ckptio.CheckpointManager (docs/MANAGER.md): saves, steps, retention, resume
from the newest step that verifies under damage, failures that name the
step and the operation, two gloo ranks, and the CLI on a root."""
import errno
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import ckptio  # noqa: E402
from ckptio import _manager  # noqa: E402

CLI = Path(ckptio.__file__).parent / "bin" / "ckptio"


def _state(value: float, step: int):
    return {"w": torch.full((64, 32), value), "b": torch.arange(10, dtype=torch.int64) * step, "step": step}


def _blank():
    return {"w": torch.zeros(64, 32), "b": torch.zeros(10, dtype=torch.int64), "step": -1}


def _data_file(step_dir: str) -> str:
    return os.path.join(step_dir, sorted(n for n in os.listdir(step_dir) if n.endswith(".distcp"))[0])


def _states(root):
    return [(s[0], s[1]) for s in ckptio._ckptio.steps_scan(root)]


@pytest.mark.parametrize("async_save", [True, False])
def test_save_load_retention(tmp_path, async_save):
    root = tmp_path / "run"
    with ckptio.CheckpointManager(root, keep_last=2, keep_every=30, async_save=async_save) as mgr:
        assert mgr.latest_step() is None and mgr.all_steps() == []
        assert mgr.load(_blank()) is None
        futures = [mgr.save(s, _state(float(s), s)) for s in range(0, 60, 10)]
        mgr.wait()
        assert [f.result() for f in futures] == list(range(0, 60, 10))
        # keep_last 2 (40, 50), keep_every 30 (0, 30)
        assert mgr.all_steps() == [0, 30, 40, 50]
        assert mgr.latest_step() == 50
        assert sorted(os.listdir(root)) == [".ckptio-dcp.lock", ".ckptio-dcp.queue", "step_00000000",
                                            "step_00000030", "step_00000040", "step_00000050"]
        sd = _blank()
        assert mgr.load(sd) == 50
        assert sd["step"] == 50 and torch.equal(sd["w"], torch.full((64, 32), 50.0))
        assert torch.equal(sd["b"], torch.arange(10) * 50)
        sd = _blank()
        assert mgr.load(sd, step=30) == 30 and sd["step"] == 30
        # A step is never saved twice.
        with pytest.raises(ckptio.CkptioError, match=r"step 50 \(.*begin.*never overwritten"):
            mgr.save(50, _state(0.0, 50))
        assert mgr.all_steps() == [0, 30, 40, 50]
    with pytest.raises(RuntimeError, match="closed"):
        mgr.save(60, _state(0.0, 60))


def test_options_checked(tmp_path):
    for bad in ({"keep_last": 0}, {"keep_every": -1}, {"async_busy": "drop"}, {"check": "quick"}):
        with pytest.raises(ValueError):
            ckptio.CheckpointManager(tmp_path, **bad)
    mgr = ckptio.CheckpointManager(tmp_path)
    with pytest.raises(ValueError):
        mgr.save(-1, _state(0.0, 0))
    with pytest.raises(ValueError):
        mgr.load(_blank(), check="none")


def test_damage_falls_back_and_says_why(tmp_path, caplog):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=3, async_save=False)
    for s in (10, 20, 30):
        mgr.save(s, _state(float(s), s))
    # A flipped byte in the newest step's data: the full check skips it.
    path = _data_file(mgr.step_dir(30))
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x40
    Path(path).write_bytes(bytes(data))
    sd = _blank()
    with caplog.at_level(logging.WARNING, logger="ckptio.manager"):
        assert mgr.load(sd) == 20
    assert sd["step"] == 20 and torch.equal(sd["w"], torch.full((64, 32), 20.0))
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1 and "skipping step 30 (damaged)" in skipped[0] and "XXH3-64" in skipped[0]
    # Asked for explicitly, the damaged step is refused with the reason.
    with pytest.raises(ckptio.CkptioError, match=r"step 30 .* is damaged: .*XXH3-64"):
        mgr.load(_blank(), step=30)
    # The job goes on from 20 and saves 30 again: the damaged step is replaced.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ckptio.manager"):
        mgr.save(30, _state(31.0, 30))
    assert any("replacing damaged step 30" in r.getMessage() for r in caplog.records)
    sd = _blank()
    assert mgr.load(sd) == 30 and torch.equal(sd["w"], torch.full((64, 32), 31.0))
    path = _data_file(mgr.step_dir(30))
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x40
    Path(path).write_bytes(bytes(data))
    # A truncated file: the fast check sees it.
    Path(_data_file(mgr.step_dir(20))).open("r+b").truncate(100)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ckptio.manager"):
        assert mgr.load(_blank(), check="fast") == 30  # the flipped byte is no size change
        assert mgr.load(_blank()) == 10
    assert any("skipping step 20 (damaged)" in r.getMessage() and "truncated" in r.getMessage()
               for r in caplog.records)
    # A deleted marker: partial, skipped too.
    os.unlink(os.path.join(mgr.step_dir(10), ckptio._ckptio.STEP_MARKER))
    assert mgr.load(_blank()) is None
    assert mgr.all_steps() == [20, 30]
    # The next save removes the partial 10; retention (keep 1) the older steps.
    mgr.keep_last = 1
    mgr.save(40, _state(40.0, 40))
    assert _states(root) == [(40, "complete")]
    assert mgr.load(_blank()) == 40


def test_newest_good_step_survives_retention(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=3, async_save=False)
    for s in (1, 2, 3):
        mgr.save(s, _state(float(s), s))
    os.unlink(os.path.join(mgr.step_dir(2), ".metadata"))
    Path(_data_file(mgr.step_dir(3))).open("r+b").truncate(10)
    # A job restarted with keep_last=2 applies retention at once: 2 and 3
    # are the newest two but damaged, so 1, the last good step, stays.
    mgr = ckptio.CheckpointManager(root, keep_last=2, async_save=False)
    assert [s for s, _ in _states(root)] == [1, 2, 3]
    sd = _blank()
    assert mgr.load(sd, check="fast") == 1 and sd["step"] == 1
    mgr.save(4, _state(4.0, 4))  # now 4 is good: 1 goes
    assert [s for s, _ in _states(root)] == [3, 4]


def test_async_busy_error(tmp_path):
    mgr = ckptio.CheckpointManager(tmp_path / "run", async_busy="error")
    big = {"w": torch.randn(4 << 20)}
    mgr.save(1, big)
    with pytest.raises(RuntimeError, match="still in flight"):
        for s in range(2, 200):  # one of these finds the previous save running
            mgr.save(s, big)
    mgr.wait()
    assert mgr.latest_step() is not None


class _Failing:
    """ckptio._ckptio with one steps_* call failing as a full disk would."""

    def __init__(self, name: str, err: int):
        self.name, self.err = name, err

    def __getattr__(self, attr):
        real = getattr(ckptio._ckptio, attr)
        if attr != self.name:
            return real

        def fail(root, step, *a, **k):
            raise OSError(self.err, f"step {step} ({root}): {self.name[6:]}: {os.strerror(self.err)}")

        return fail


@pytest.mark.parametrize("name,err", [("steps_commit", errno.ENOSPC), ("steps_commit", errno.EIO),
                                      ("steps_begin", errno.ENOSPC)])
@pytest.mark.parametrize("async_save", [True, False])
def test_failure_names_step_and_root_stays_resumable(tmp_path, monkeypatch, name, err, async_save):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=2, async_save=async_save)
    mgr.save(1, _state(1.0, 1))
    mgr.wait()
    monkeypatch.setattr(_manager, "_ckptio", _Failing(name, err))
    with pytest.raises(OSError) as info:
        mgr.save(2, _state(2.0, 2))
        mgr.wait()
    assert info.value.errno == err and "step 2 (" in str(info.value)
    monkeypatch.undo()
    assert mgr.all_steps() == [1]
    sd = _blank()
    assert mgr.load(sd) == 1 and sd["step"] == 1
    mgr.save(3, _state(3.0, 3))  # the next save removes what the failed one left
    mgr.wait()
    assert _states(root) == [(1, "complete"), (3, "complete")]


def test_cli_on_a_root(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=3, async_save=False)
    for s in (5, 10, 15):
        mgr.save(s, _state(float(s), s))
    os.mkdir(root / "step_00000020")  # a save that crashed before anything
    path = _data_file(mgr.step_dir(15))
    data = bytearray(Path(path).read_bytes())
    data[-20] ^= 1
    Path(path).write_bytes(bytes(data))

    def cli(*args):
        return subprocess.run([str(CLI), *args], capture_output=True, text=True)

    r = cli("inspect", str(root))
    assert r.returncode == 0, r.stderr
    assert "4 steps (3 complete, 1 partial, 0 damaged, 0 foreign)" in r.stdout
    assert "empty: a save that stopped before its first file" in r.stdout
    r = cli("inspect", "--json", str(root))
    import json

    doc = json.loads(r.stdout)
    assert [(s["step"], s["state"]) for s in doc["steps"]] == [(5, "complete"), (10, "complete"), (15, "complete"),
                                                               (20, "partial")]
    r = cli("verify", str(root))
    assert r.returncode == 1 and "step 15: damaged" in r.stderr and "XXH3-64" in r.stderr
    assert "step 5: ok" in r.stdout and "step 20: partial" in r.stdout
    r = cli("verify", "--latest", str(root))
    assert r.returncode == 0 and "step 10 is the newest complete step" in r.stdout
    assert "step 20 skipped (partial)" in r.stderr and "step 15 skipped (damaged)" in r.stderr
    r = cli("verify", "--latest", str(mgr.step_dir(5)))
    assert r.returncode == 1 and "--latest applies to a checkpoint manager's root" in r.stderr
    # clean: refused while a save holds the root, done after.
    lock = ckptio._ckptio.dcp_lock_acquire(str(root), None, False, -1.0, None)
    r = cli("clean", str(root))
    ckptio._ckptio.dcp_lock_release(lock)
    assert r.returncode == 1 and os.path.isdir(root / "step_00000020")
    r = cli("clean", str(root))
    assert r.returncode == 0 and "removed 1 partial step (20)" in r.stdout
    assert _states(root) == [(5, "complete"), (10, "complete"), (15, "complete")]


_TWO_RANKS = textwrap.dedent("""
    import os, sys, logging
    import torch, torch.distributed as dist
    import ckptio
    rank, init, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    logging.basicConfig(level=logging.WARNING, format=f"rank{rank}: %(message)s")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    mgr = ckptio.CheckpointManager(root, keep_last=2, async_save=True)
    for s in (1, 2, 3):
        mgr.save(s, {"x": torch.full((100,), float(s)), f"rank{rank}": torch.full((50,), float(s + rank)), "step": s})
    mgr.wait()
    assert mgr.all_steps() == [2, 3], mgr.all_steps()
    if rank == 0:  # damage step 3 on one rank's view: both must agree on 2
        d = mgr.step_dir(3)
        f = sorted(n for n in os.listdir(d) if n.startswith("__1_"))[0]
        b = bytearray(open(os.path.join(d, f), "rb").read()); b[-30] ^= 1
        open(os.path.join(d, f), "wb").write(bytes(b))
    dist.barrier()
    sd = {"x": torch.zeros(100), f"rank{rank}": torch.zeros(50), "step": -1}
    got = mgr.load(sd)
    assert got == 2 and sd["step"] == 2 and torch.equal(sd["x"], torch.full((100,), 2.0)), (got, sd)
    assert torch.equal(sd[f"rank{rank}"], torch.full((50,), 2.0 + rank)), sd
    try:
        mgr.load(sd, step=3)
    except ckptio.CkptioError as e:
        print(f"RAISED {'step 3' in str(e)}", flush=True)
    # The step being loaded goes away (removed on rank 0 by something that ignores pins): both ranks
    # follow rank 0 to the newest step left.
    for s in (4, 5):
        mgr.save(s, {"x": torch.full((100,), float(s)), f"rank{rank}": torch.full((50,), float(s + rank)), "step": s})
    mgr.wait()
    import shutil
    import ckptio.dcp
    real, removed = ckptio.dcp.FileSystemReader, []

    class Reader(real):
        def read_metadata(self, *a, **k):
            if rank == 0 and not removed:
                removed.append(str(self.path))
                shutil.rmtree(self.path)
            return super().read_metadata(*a, **k)

    ckptio.dcp.FileSystemReader = Reader
    dist.barrier()
    sd = {"x": torch.zeros(100), f"rank{rank}": torch.zeros(50), "step": -1}
    got = mgr.load(sd)
    ckptio.dcp.FileSystemReader = real
    assert got == 4 and sd["step"] == 4 and torch.equal(sd[f"rank{rank}"], torch.full((50,), 4.0 + rank)), (got, sd)
    print("RETRIED", got, flush=True)
    mgr.close()
    dist.destroy_process_group()
    print("OK", flush=True)
    # Skip interpreter teardown, as the other multi-rank workers do: torch's
    # gloo group now and then aborts in it ("terminate called without an
    # active exception") after every check has passed.
    os._exit(0)
""")


def test_two_gloo_ranks(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(_TWO_RANKS)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parent.parent)] + sys.path)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "init"), str(tmp_path / "run")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert "RAISED True" in out and "RETRIED 4" in out and "OK" in out, out
    assert "skipping step 3 (damaged)" in outs[0]
    assert "step 5 was removed while it was being loaded" in outs[0]
    # Only rank 0 decided, logged and committed.
    assert "skipping" not in outs[1]
