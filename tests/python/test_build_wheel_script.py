"""scripts/build_wheel.sh as README.md runs it on a fresh clone (no .venv): it sets up its tools itself
(scripts/setup.sh --wheel-tools) instead of failing, then builds, repairs and checks the wheel.

The toolchain is stood in for (a setup.sh that makes a .venv whose python answers `-m build` and
`-m auditwheel` with files of the right names), so this checks the script's own steps in a second;
scripts/test.sh builds the real wheel with it."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build_wheel.sh"

FAKE_PYTHON = r"""#!/usr/bin/env bash
# Stands in for the wheel tools: `-c 'import build, auditwheel'`, `-m build`, `-m auditwheel repair|show`.
echo "python $*" >> "$LOG"
case "$1 $2" in
"-c import build, auditwheel") exit 0 ;;
"-m build") out=$4; touch "$out/ckptio-0.1.0.tar.gz" "$out/ckptio-0.1.0-cp38-abi3-linux_x86_64.whl" ;;
"-m auditwheel")
    if [ "$3" = repair ]; then touch "$5/ckptio-0.1.0-cp38-abi3-manylinux_2_34_x86_64.whl"
    else printf '%s is consistent with\nthe following platform tag: "manylinux_2_34_x86_64".\n' "$4"; fi ;;
*) exit 3 ;;
esac
"""

FAKE_SETUP = r"""#!/usr/bin/env bash
echo "setup.sh $*" >> "$LOG"
mkdir -p .venv/bin && cp scripts/fake_python .venv/bin/python && chmod +x .venv/bin/python
"""


def _executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.skipif(not SCRIPT.exists(), reason="needs the source tree's scripts/")
def test_build_wheel_sets_up_its_tools_on_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, clone / "scripts" / "build_wheel.sh")
    _executable(clone / "scripts" / "setup.sh", FAKE_SETUP)
    _executable(clone / "scripts" / "fake_python", FAKE_PYTHON)
    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["LOG"] = str(log)
    r = subprocess.run(["bash", str(clone / "scripts" / "build_wheel.sh")], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    wheel = clone / "dist" / "ckptio-0.1.0-cp38-abi3-manylinux_2_34_x86_64.whl"
    assert r.stdout.strip() == str(wheel) and wheel.exists()
    assert (clone / "dist" / "ckptio-0.1.0.tar.gz").exists()
    steps = log.read_text().splitlines()
    assert steps[0] == "setup.sh --wheel-tools", steps
    assert any(s.startswith("python -m build --outdir") for s in steps)
    # A second run finds the tools and sets nothing up again.
    log.write_text("")
    r = subprocess.run(["bash", str(clone / "scripts" / "build_wheel.sh")], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not [s for s in log.read_text().splitlines() if s.startswith("setup.sh")]
