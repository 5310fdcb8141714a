"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs on its own, in a fresh interpreter, in an empty temporary
directory (a reader copies one block, not the page). README.md's ```sh block
of `ckptio` commands runs too, line by line, in the folder README.md's Python
examples leave (its paths are theirs). Blocks pick the GPU
when there is one (`device = "cuda" if torch.cuda.is_available() else
"cpu"`), so they run on both machines; a block that only makes sense on a
GPU starts with the line `# requires: cuda` and is skipped without one (the
GPU run, scripts/gpu_wheel.sh, runs it). A block that starts with
`# requires: s3` runs against the test S3 server (scripts/s3_server.sh, which
scripts/test.sh starts), its `s3://bucket/` turned into a fresh prefix of the
test bucket, and is skipped without one; so are the command lines naming
s3://. A block whose optional package (transformers, safetensors, tqdm) is
missing is skipped, naming it.
"""
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import ckptio
from conftest import CKPTIO_CLI, cuda_available, requires_cli

S3_BUCKET = os.environ.get("CKPTIO_TEST_S3_BUCKET") if os.environ.get("AWS_ENDPOINT_URL") else None


def _s3_prefix() -> str:
    """Where the docs' `s3://bucket/` goes in one test: a new prefix of the test bucket."""
    return f"s3://{S3_BUCKET}/docs-{os.getpid()}-{uuid.uuid4().hex[:8]}/"


def _runnable(code: str, prefix: str):
    """The block as it runs here, or None (with the reason) where it needs what this machine lacks."""
    if code.startswith("# requires: cuda") and not cuda_available():
        return None, "needs a CUDA GPU (block marked '# requires: cuda')"
    if code.startswith("# requires: s3"):
        if not S3_BUCKET:
            return None, 'needs an S3 server (block marked \'# requires: s3\'; eval "$(scripts/s3_server.sh start)")'
        code = code.replace("s3://bucket/", prefix)
    return code, None

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OPTIONAL = ("transformers", "safetensors", "tqdm")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(m.group(1), id=f"{doc.relative_to(REPO)}:{line}")


BLOCKS = list(_blocks())


def test_the_docs_have_python_blocks():
    # The extraction itself works (a changed fence style would silently test nothing).
    assert len(BLOCKS) >= 5, [b.id for b in BLOCKS]


@pytest.mark.parametrize("code", BLOCKS)
def test_python_block_runs(tmp_path, code):
    code, why = _runnable(code, _s3_prefix() if S3_BUCKET else "")
    if why:
        pytest.skip(why)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parents[1]), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=600)
    if proc.returncode != 0:
        missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", proc.stderr)
        if missing and missing.group(1).split(".")[0] in OPTIONAL:
            pytest.skip(f"needs {missing.group(1)}")
    assert proc.returncode == 0, f"the block failed:\n{code}\n--- stderr ---\n{proc.stderr[-4000:]}"


def _python_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parents[1]), env.get("PYTHONPATH", "")])
    return env


@requires_cli
def test_readme_cli_block_runs_after_the_python_examples(tmp_path):
    """The command-line block of README.md, run as written in the folder the README's Python blocks (in
    order) leave: every line exits 0. One change: a bare `ckptio bench` measures 8 MiB in tmp_path (its
    1 GiB default takes a minute)."""
    text = (REPO / "README.md").read_text()
    prefix = _s3_prefix() if S3_BUCKET else ""
    for m in BLOCK.finditer(text):
        code, why = _runnable(m.group(1), prefix)
        if why:
            continue
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                              env=_python_env(), timeout=600)
        assert proc.returncode == 0, f"the block failed:\n{code}\n--- stderr ---\n{proc.stderr[-4000:]}"
    blocks = [b for b in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M) if b.startswith("ckptio inspect")]
    assert len(blocks) == 1, "README.md has one block of ckptio commands"
    lines = [line.split("#", 1)[0].split() for line in blocks[0].splitlines()]
    assert len(lines) >= 10 and all(cmd[0] == "ckptio" for cmd in lines), blocks[0]
    for cmd in lines:
        if any(a.startswith("s3://") for a in cmd):
            if not S3_BUCKET:
                continue
            cmd = [a.replace("s3://bucket/", prefix) for a in cmd]
        args = cmd[1:] + (["--size", "8M", "--dir", str(tmp_path)] if cmd[1:] == ["bench"] else [])
        r = subprocess.run([CKPTIO_CLI, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stderr[-3000:]}"
