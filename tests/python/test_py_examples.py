"""The examples/ scripts run to completion (their own asserts check results)."""
import os
import subprocess
import sys
from pathlib import Path

import ckptio

REPO = Path(__file__).resolve().parents[2]


def test_gds_tutorial_example(tmp_path):
    env = dict(os.environ)
    # The child must import the same ckptio as this process.
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parents[1]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(REPO / "examples" / "gds_tutorial.py"), str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "round trip OK" in out.stdout
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "checkpoint_ckptio.pt").exists()
