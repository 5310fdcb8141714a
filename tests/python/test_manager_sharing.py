"""ckptio.CheckpointManager beside what it did not write and beside other processes (docs/MANAGER.md
"What the manager removes", "Readers and other managers"):

* step directories saved by torch's own DCP writer survive `ckptio clean`, a manager's saves and its
  retention byte for byte, stay loadable by torch, are listed as foreign and loaded only when asked for;
* a partial step holding a subdirectory or a file the manager does not make loses nothing, and the
  messages say what was left and why;
* a load whose step another process's retention (or anything else) removes while it is read takes
  the newest step left, or, for a step asked for, raises an error naming it;
* two managers saving in a loop on one root both make progress.
"""
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as tdcp  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp  # noqa: E402
from ckptio import _manager  # noqa: E402
from conftest import CKPTIO_CLI, requires_cli  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(ckptio.__file__).parent.parent)] + sys.path))


def _state(value: float, step: int):
    return {"w": torch.full((64, 32), value), "b": torch.arange(10, dtype=torch.int64) * step, "step": step}


def _blank():
    return {"w": torch.zeros(64, 32), "b": torch.zeros(10, dtype=torch.int64), "step": -1}


def _files(d: Path):
    """Every entry of d: name -> bytes (regular files) or its kind."""
    out = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else ("dir" if p.is_dir() else "other")
    return out


def _cli(*args):
    return subprocess.run([CKPTIO_CLI, *args], capture_output=True, text=True, timeout=120)


def _states(root):
    return [(s[0], s[1]) for s in ckptio._ckptio.steps_scan(root)]


# ---- what the manager did not write ------------------------------------------------------------

@requires_cli
def test_torch_written_steps_survive_clean_saves_and_retention(tmp_path, caplog):
    root = tmp_path / "run"
    for step in (100, 200):  # torch's own writer, under the manager's names
        tdcp.save(_state(float(step), step), checkpoint_id=str(root / f"step_{step:08d}"))
    before = {s: _files(root / f"step_{s:08d}") for s in (100, 200)}
    assert ckptio._ckptio.STEP_MARKER not in before[100]

    r = _cli("clean", str(root))
    assert r.returncode == 0, r.stderr
    assert "removed 0 partial steps" in r.stdout
    assert "left step 100 alone (foreign)" in r.stdout and "left step 200 alone (foreign)" in r.stdout
    assert "not started by this manager" in r.stdout
    r = _cli("inspect", "--json", str(root))
    assert r.returncode == 0, r.stderr
    assert [(s["step"], s["state"]) for s in json.loads(r.stdout)["steps"]] == [(100, "foreign"), (200, "foreign")]
    r = _cli("verify", str(root))
    assert r.returncode == 0 and "step 100: foreign" in r.stdout, r.stdout + r.stderr

    mgr = ckptio.CheckpointManager(root, keep_last=1, async_save=False)
    for step in (300, 400, 500):
        mgr.save(step, _state(float(step), step))
    assert mgr.all_steps() == [500]
    assert _states(root) == [(100, "foreign"), (200, "foreign"), (500, "complete")]
    for s in (100, 200):
        assert _files(root / f"step_{s:08d}") == before[s]
        sd = _blank()
        tdcp.load(sd, checkpoint_id=str(root / f"step_{s:08d}"))
        assert sd["step"] == s and torch.equal(sd["w"], torch.full((64, 32), float(s)))
    # Resume never picks them (nothing says their save finished) ...
    sd = _blank()
    assert mgr.load(sd) == 500 and sd["step"] == 500
    # ... but a step asked for by number loads, with a warning.
    with caplog.at_level(logging.WARNING, logger="ckptio.manager"):
        assert mgr.load(sd, step=200) == 200
    assert sd["step"] == 200 and torch.equal(sd["b"], torch.arange(10) * 200)
    assert any("did not write" in r.getMessage() for r in caplog.records)
    # Their numbers are not reused.
    with pytest.raises(ckptio.CkptioError, match=r"step 100 \(.*begin: .*not the manager's"):
        mgr.save(100, _state(1.0, 100))
    assert _files(root / "step_00000100") == before[100]


@requires_cli
@pytest.mark.parametrize("alien", ["subdir", "file"])
def test_partial_step_holding_something_else_loses_nothing(tmp_path, alien):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, async_save=False)
    mgr.save(10, _state(10.0, 10))
    # A save of step 20 that crashed after its data files, with something of the user's in it.
    step20 = root / "step_00000020"
    ckptio._ckptio.steps_begin(str(root), 20)
    for name in os.listdir(root / "step_00000010"):
        if name != ckptio._ckptio.STEP_MARKER:
            shutil.copyfile(root / "step_00000010" / name, step20 / name)
    if alien == "subdir":
        (step20 / "zz-extra").mkdir()
        (step20 / "zz-extra" / "data.txt").write_text("keep me")
    else:
        (step20 / "notes.txt").write_text("keep me")
    before = _files(step20)

    r = _cli("clean", str(root))
    assert r.returncode == 0, r.stderr
    assert "removed 0 partial steps" in r.stdout
    what = "'zz-extra' (a directory)" if alien == "subdir" else "'notes.txt' (a name neither the manager"
    assert "left step 20 alone (partial)" in r.stdout and what in r.stdout, r.stdout
    assert "nothing inside it is removed" not in r.stdout + r.stderr
    assert _files(step20) == before
    # A save (whose begin cleans) and an explicit removal leave it whole too, and say why.
    mgr.save(30, _state(30.0, 30))
    assert _files(step20) == before
    with pytest.raises(ckptio.CkptioError, match=r"step 20 .*remove: .*nothing in the step is removed"):
        ckptio._ckptio.steps_remove(str(root), 20)
    assert _files(step20) == before
    assert mgr.all_steps() == [10, 30]


# ---- loads beside removals ---------------------------------------------------------------------

_OTHER_PROCESS = textwrap.dedent("""
    import sys, torch, ckptio
    root, step = sys.argv[1], int(sys.argv[2])
    mgr = ckptio.CheckpointManager(root, keep_last=1, async_save=False)
    mgr.save(step, {"w": torch.full((64, 32), float(step)), "b": torch.arange(10) * step, "step": step})
    print("removed-by-retention-done", flush=True)
""")


def _other_process_saves(root, step):
    """Another training process saves `step` with keep_last=1: its retention removes every older step
    it may remove. Returns when it is done (the barrier)."""
    r = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(root), str(step)], capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and "removed-by-retention-done" in r.stdout, r.stdout + r.stderr


class _ReaderHook:
    """ckptio.dcp.FileSystemReader whose first read runs `hook(path)` first: the moment between the
    manager's pick and its read."""

    def __init__(self, monkeypatch, hook):
        real = ckptio.dcp.FileSystemReader
        calls = []

        class Reader(real):
            def read_metadata(self, *a, **k):
                if not calls:
                    calls.append(str(self.path))
                    hook(str(self.path))
                return super().read_metadata(*a, **k)

        monkeypatch.setattr(ckptio.dcp, "FileSystemReader", Reader)
        self.calls = calls


def _three_steps(root):
    mgr = ckptio.CheckpointManager(root, async_save=False)
    for s in (10, 20, 30):
        mgr.save(s, _state(float(s), s))
    return mgr


def test_load_keeps_its_step_while_another_process_applies_retention(tmp_path, monkeypatch):
    root = tmp_path / "run"
    mgr = _three_steps(root)
    hook = _ReaderHook(monkeypatch, lambda path: _other_process_saves(root, 40))
    sd = _blank()
    assert mgr.load(sd) == 30  # pinned while read: the other retention kept it, removed 10 and 20
    assert hook.calls and hook.calls[0].endswith("step_00000030")
    assert sd["step"] == 30 and torch.equal(sd["w"], torch.full((64, 32), 30.0))
    assert mgr.all_steps() == [30, 40]
    monkeypatch.undo()
    _other_process_saves(root, 50)  # no reader now: retention removes it
    assert mgr.all_steps() == [50]


def test_load_takes_the_newest_step_left_when_its_step_is_removed(tmp_path, monkeypatch, caplog):
    # Removed by something that ignores pins (rm -r, a manager of a release without them) while read.
    root = tmp_path / "run"
    mgr = _three_steps(root)
    hook = _ReaderHook(monkeypatch, lambda path: shutil.rmtree(path))
    sd = _blank()
    with caplog.at_level(logging.WARNING, logger="ckptio.manager"):
        assert mgr.load(sd) == 20
    assert len(hook.calls) == 1 and sd["step"] == 20 and torch.equal(sd["w"], torch.full((64, 32), 20.0))
    assert torch.equal(sd["b"], torch.arange(10) * 20)
    assert any("step 30 was removed while it was being loaded" in r.getMessage() for r in caplog.records)


def test_load_picks_again_when_retention_removes_the_step_before_it_is_read(tmp_path, monkeypatch):
    # The other process's retention runs right after the pick, before the read starts.
    root = tmp_path / "run"
    mgr = _three_steps(root)
    real = _manager._ckptio
    ran = []

    class Ext:
        def __getattr__(self, name):
            return getattr(real, name)

        def steps_latest(self, *a, **k):
            chosen = real.steps_latest(*a, **k)
            if not ran:
                ran.append(chosen[0])
                _other_process_saves(root, 40)
            return chosen

    monkeypatch.setattr(_manager, "_ckptio", Ext())
    sd = _blank()
    assert mgr.load(sd) == 40
    assert ran == [30] and sd["step"] == 40 and torch.equal(sd["w"], torch.full((64, 32), 40.0))


def test_load_of_a_named_step_that_is_removed_says_so(tmp_path, monkeypatch):
    root = tmp_path / "run"
    mgr = _three_steps(root)
    _ReaderHook(monkeypatch, lambda path: shutil.rmtree(path))
    with pytest.raises(ckptio.CkptioError, match=r"step 20 \(.*step_00000020\) was removed while it was being loaded"):
        mgr.load(_blank(), step=20)
    assert mgr.all_steps() == [10, 30]


# ---- two managers on one root --------------------------------------------------------------------

_SAVER = textwrap.dedent("""
    import json, os, sys, time, torch, ckptio
    root, first, seconds, ready = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    mgr = ckptio.CheckpointManager(root, keep_last=4, async_save=False)
    mgr.save(first, {"w": torch.zeros(1000), "step": first})  # the first save warms torch up
    open(f"{ready}{first}", "w").close()
    while not all(os.path.exists(f"{ready}{i}") for i in (0, 1)):  # the barrier: both loops start together
        time.sleep(0.005)
    saves, step, t0 = [], first + 2, time.monotonic()
    while time.monotonic() - t0 < seconds:
        t = time.monotonic()
        mgr.save(step, {"w": torch.full((1 << 18,), float(step)), "step": step})
        saves.append((t, time.monotonic()))
        step += 2
    mgr.close()
    print(json.dumps(saves), flush=True)
""")


def test_two_managers_on_one_root_take_turns(tmp_path):
    # Each saves 1 MiB in a loop as fast as it can. With flock alone, whichever held the root's lock took
    # it back at once, before the other's next poll, again and again.
    root, ready = tmp_path / "run", tmp_path / "ready"
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, str(root), str(first), "2", str(ready)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for first in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    saves = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
        saves.append(json.loads(out))
    # While one manager's save waited, the other finished at most one save (two at the edges): they take
    # turns, whatever the machine's load, and each made progress.
    most = [max(sum(start < done <= end for _, done in saves[1 - i]) for start, end in saves[i]) for i in (0, 1)]
    print(f"saves: {[len(s) for s in saves]}; the most saves of the other during one save: {most}")
    assert min(len(s) for s in saves) >= 3 and max(most) <= 2, (most, [len(s) for s in saves])
    states = _states(root)
    assert len(states) == 4 and all(state == "complete" for _, state in states), states
