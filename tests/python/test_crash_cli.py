"""`ckptio clean` and `ckptio verify` with checksums, from the command line.

- a Python process saving through the ckptio package is killed with
  SIGKILL until it leaves a temporary behind; `ckptio clean DIR` removes
  it, and the checkpoint under the final name still loads;
- a safetensors file saved with checksums (made by the C test program
  test_crash in its "save-once" mode) verifies; one flipped byte makes
  `ckptio verify` fail naming the tensor and the byte range.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CKPTIO_CLI as CKPTIO

pytestmark = pytest.mark.skipif(CKPTIO is None, reason="ckptio binary not built (set CKPTIO_TEST_BUILD_DIR)")

SAVER = r"""
import sys, numpy as np, ckptio
path = sys.argv[1]
tensors = {f"t{i}": np.full((1 << 20,), i, dtype=np.float32) for i in range(8)}
print("ready", flush=True)
while True:
    ckptio.save(tensors, path)
"""


def _temporaries(d: Path):
    return [p.name for p in d.iterdir() if ".ckptio-tmp-" in p.name]


def _env():
    # The child must import the same package the tests use (installed, or
    # built in place under python/, which conftest puts on sys.path).
    import ckptio

    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(ckptio.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_clean_removes_what_a_killed_save_left(tmp_path):
    pytest.importorskip("numpy")
    path = tmp_path / "m.safetensors"
    left = []
    for attempt in range(40):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE, env=_env())
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.02 + 0.01 * (attempt % 7))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = _temporaries(tmp_path)
        if left:
            break
    assert left, "no kill landed in the middle of a save"
    # The kernel may still be tearing down the dead child's io_uring, which
    # keeps its temporary locked ("in use") for a moment: clean until gone.
    removed = 0
    for _ in range(50):
        out = subprocess.run([CKPTIO, "clean", str(tmp_path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        removed += int(re.search(r"removed (\d+) stale temporar", out.stdout).group(1))
        if not _temporaries(tmp_path):
            break
        time.sleep(0.1)
    assert removed == len(left), out.stdout
    assert _temporaries(tmp_path) == []
    if path.exists():  # the kill may have come before the first commit
        ok = subprocess.run([CKPTIO, "verify", str(path)], capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        assert "checksums" not in ok.stdout  # saved without a manifest
    # Bad usage is reported as such.
    bad = subprocess.run([CKPTIO, "clean", "--min-age", "x", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "--min-age" in bad.stderr
    missing = subprocess.run([CKPTIO, "clean", str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 1 and "nope" in missing.stderr


def _save_with_checksums(directory: Path) -> Path:
    build = os.environ.get("CKPTIO_TEST_BUILD_DIR") or str(Path(CKPTIO).parent)
    helper = Path(build) / "test_crash"
    if not helper.is_file():
        pytest.skip("test_crash helper program not built")
    subprocess.run([str(helper), "save-once", str(directory)], check=True, capture_output=True)
    return directory / "m.safetensors"


def test_verify_checks_the_manifest(tmp_path):
    path = _save_with_checksums(tmp_path)
    assert (tmp_path / "m.safetensors.ckptio-manifest.json").is_file()
    ok = subprocess.run([CKPTIO, "verify", str(path)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "checksums of 3 tensors in 3 blocks matched" in ok.stdout
    # One flipped byte inside tensor w1 (after the 100-byte "bias", first by name).
    data = bytearray(path.read_bytes())
    data[4096 + 200] ^= 0x01
    path.write_bytes(bytes(data))
    bad = subprocess.run([CKPTIO, "verify", str(path)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "w1: checksum mismatch in file bytes [4196, " in bad.stderr
    assert "m.safetensors" in bad.stderr
