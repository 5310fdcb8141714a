"""A process that exits with a CheckpointManager's async save in flight: the save is finished, not abandoned
(the step asked for is complete and loads), and the process exits cleanly (docs/MANAGER.md "At exit")."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

import ckptio

_SAVE_AND_EXIT = """
import sys, torch, ckptio
root, how = sys.argv[1], sys.argv[2]
state = {"model": {"w": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(3, 5)}, "step": 7}
if how == "with":
    with ckptio.CheckpointManager(root, keep_last=2) as mgr:
        mgr.save(7, state)
else:  # neither wait() nor close(): the interpreter exits with the save in flight
    mgr = ckptio.CheckpointManager(root, keep_last=2)
    mgr.save(7, state)
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parents[1]), env.get("PYTHONPATH", "")])
    return env


def test_a_save_in_flight_at_exit_is_finished_and_the_process_exits_cleanly(tmp_path):
    for run in range(4):
        how = "with" if run % 2 else "bare"
        root = tmp_path / f"run{run}"
        proc = subprocess.run([sys.executable, "-c", _SAVE_AND_EXIT, str(root), how], capture_output=True,
                              text=True, env=_env(), timeout=120)
        assert proc.returncode == 0, f"run {run} ({how}): exit {proc.returncode}\n{proc.stderr[-3000:]}"
        assert "terminate called" not in proc.stderr, proc.stderr[-3000:]
        assert [(s[0], s[1]) for s in ckptio._ckptio.steps_scan(str(root))] == [(7, "complete")], (run, how)
        got = {"model": {"w": torch.zeros(1 << 20), "b": torch.zeros(3, 5)}, "step": -1}
        with ckptio.CheckpointManager(root) as mgr:
            assert mgr.load(got) == 7
        assert got["step"] == 7 and torch.equal(got["model"]["w"], torch.arange(1 << 20, dtype=torch.float32))
        assert torch.equal(got["model"]["b"], torch.ones(3, 5))


def test_close_leaves_no_thread_of_the_manager_running(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=1)
    for step in (1, 2):
        mgr.save(step, {"w": torch.full((1000,), float(step))})
    assert [t for t in threading.enumerate() if t.name == f"ckptio-manager-{root}"] != []
    mgr.close()
    # A thread of ckptio's still running Python (and dropping the snapshot's tensors) while the interpreter
    # finalizes is stopped inside torch's destructors: std::terminate.
    assert [t for t in threading.enumerate() if t.name == f"ckptio-manager-{root}"] == []
    assert mgr.all_steps() == [2]
