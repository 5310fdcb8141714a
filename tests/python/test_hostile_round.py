"""A hostile round against the checkpoint manager, the DCP reader and the CLI, as an unlucky user and
as a hostile file author would try them: each case asserts the bytes, the error text or the state on
disk (docs/MANAGER.md, docs/RELIABILITY.md).

* Values a training loop keeps beside its tensors (numpy's RNG state, numpy scalars) load back as
  saved; an ``argparse.Namespace`` is refused at save time, naming the value and the way to keep it,
  and nothing is written.
* Step directories torch's own writer saved under the manager's names are never removed, by
  ``ckptio clean`` or by a save's retention; a partial step holding something else is checked whole
  before anything goes, and the message says what happened.
* FIFOs, symlinks and devices inside a step directory neither hang nor are followed.
* Sizes a file declares stay bounded: a zstd bomb, a chain of 100,000 transforms, a safetensors
  header declaring a petabyte, a tensor name of 1 MB, a path leaving the directory.
* Two processes saving into one root both make progress and every step loads back.
* A check that fails without proving damage (out of descriptors) is an error naming the step, never
  a skipped or removed step; a step the reader refuses gives the refusal's own status.
"""
import argparse
import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import time

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from conftest import CKPTIO_CLI, requires_cli  # noqa: E402
from test_dcp_hostile import zstd_rle_frame  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ckptio.__file__)))
ENV = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")


def cli(*args, timeout=60):
    return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def python(script, *args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout, **kw)


def digest(path):
    """Names and bytes of every entry under `path` (symlinks by their target, not followed)."""
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(path)):
        for name in sorted(files + dirs):
            p = os.path.join(dirpath, name)
            h.update(os.path.relpath(p, path).encode() + b"\0")
            if os.path.islink(p):
                h.update(b"L" + os.readlink(p).encode())
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def state(v):
    return {"w": torch.full((8, 4), float(v)), "step": int(v)}


def blank():
    return {"w": torch.zeros(8, 4), "step": 0}


def torch_save(sd, path):
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)


# ---- values a training loop keeps --------------------------------------------------------------


def test_training_values_load_back_and_a_namespace_is_refused_at_save(tmp_path):
    root = tmp_path / "run"
    np.random.seed(7)
    np.random.rand(5)
    saved = {"w": torch.arange(6.0), "rng": np.random.get_state(), "loss": np.float64(0.25),
             "epoch": np.int64(3), "args": vars(argparse.Namespace(lr=0.1, name="run"))}
    mgr = ckptio.CheckpointManager(root, keep_last=2, async_save=False)
    mgr.save(100, saved)
    got = {"w": torch.zeros(6), "rng": None, "loss": None, "epoch": None, "args": {"lr": None, "name": None}}
    assert mgr.latest_step() == 100 and mgr.load(got) == 100
    assert torch.equal(got["w"], saved["w"]) and got["args"] == {"lr": 0.1, "name": "run"}
    assert type(got["loss"]) is np.float64 and got["loss"] == 0.25 and type(got["epoch"]) is np.int64
    assert got["rng"][0] == "MT19937" and got["rng"][2] == saved["rng"][2]
    assert got["rng"][1].tobytes() == saved["rng"][1].tobytes()
    before = digest(root)
    with pytest.raises(TypeError) as ei:
        mgr.save(200, {"w": torch.arange(6.0), "args": argparse.Namespace(lr=0.1)})
    assert "cannot save 'args' (argparse.Namespace)" in str(ei.value), ei.value
    assert "store vars() of the Namespace" in str(ei.value), ei.value
    assert digest(root) == before and mgr.all_steps() == [100]
    # A second save of step 100's values, and retention: the good step is never taken for damage.
    mgr.save(300, saved)
    mgr.save(400, saved)
    assert mgr.all_steps() == [300, 400]
    if CKPTIO_CLI:
        r = cli("verify", root)
        assert r.returncode == 0 and "step 400: ok" in r.stdout, r.stdout + r.stderr


# ---- what the manager did not write ------------------------------------------------------------


@requires_cli
def test_torch_written_steps_are_never_removed(tmp_path):
    root = tmp_path / "run"
    for s in (100, 200):
        torch_save(state(s), root / f"step_{s:08d}")
    before = {s: digest(root / f"step_{s:08d}") for s in (100, 200)}
    r = cli("clean", root)
    assert r.returncode == 0 and "removed 0 partial steps" in r.stdout, r.stdout + r.stderr
    assert "left step 100 alone (foreign)" in r.stdout and "left step 200 alone (foreign)" in r.stdout
    mgr = ckptio.CheckpointManager(root, keep_last=1, async_save=False)
    for s in (300, 400):
        mgr.save(s, state(s))
    assert {s: digest(root / f"step_{s:08d}") for s in (100, 200)} == before
    assert mgr.all_steps() == [400]
    sd = blank()
    dcp.load(sd, storage_reader=dcp.FileSystemReader(str(root / "step_00000100")), no_dist=True)
    assert sd["step"] == 100 and torch.equal(sd["w"], state(100)["w"])
    with pytest.raises(ckptio.CkptioError, match=r"step 200 .*not the manager's"):
        mgr.save(200, state(2))
    assert digest(root / "step_00000200") == before[200]


@requires_cli
def test_partial_step_is_checked_whole_and_the_message_tells_the_truth(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, async_save=False)
    mgr.save(10, state(10))
    step = root / "step_00000020"
    ckptio._ckptio.steps_begin(str(root), 20)
    for name in sorted(os.listdir(root / "step_00000010")):  # data files sort before the subdirectory
        if name != ckptio._ckptio.STEP_MARKER:
            (step / name).write_bytes((root / "step_00000010" / name).read_bytes())
    (step / "zz-user").mkdir()
    (step / "zz-user" / "notes.txt").write_text("mine")
    before = digest(step)
    r = cli("clean", root)
    assert r.returncode == 0 and "left step 20 alone (partial)" in r.stdout, r.stdout + r.stderr
    assert "'zz-user' (a directory)" in r.stdout and "nothing inside it is removed" not in r.stdout + r.stderr
    with pytest.raises(ckptio.CkptioError, match=r"step 20 .*remove: .*nothing in the step is removed"):
        ckptio._ckptio.steps_remove(str(root), 20)
    mgr.save(30, state(30))
    assert digest(step) == before and mgr.all_steps() == [10, 30]
    # Once the user's directory is gone, the partial step is the manager's own to remove, and it is.
    (step / "zz-user" / "notes.txt").unlink()
    (step / "zz-user").rmdir()
    r = cli("clean", root)
    assert r.returncode == 0 and "removed 1 partial step" in r.stdout and not step.exists(), r.stdout


# ---- special files in a step directory -----------------------------------------------------------

_SPECIAL_OPS = """
    import json, sys, time, torch, ckptio
    out = {}
    for r in json.loads(sys.argv[1]):
        m = ckptio.CheckpointManager(r, async_save=False)
        for op, fn in (("all_steps", m.all_steps), ("load", lambda: m.load({"w": torch.zeros(8, 4), "step": 0})),
                       ("save", lambda: m.save(300, {"w": torch.ones(8, 4), "step": 300}).result())):
            t = time.monotonic()
            try:
                got = repr(fn())
            except Exception as e:
                got = f"{type(e).__name__}: {e}"
            out[f"{r} {op}"] = [got, time.monotonic() - t]
    print(json.dumps(out))
"""


def test_fifos_symlinks_and_devices_in_a_step_never_hang_or_are_followed(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    cases = {".ckptio-step": "fifo", ".metadata": "fifo", "link": "symlink", "dev": "device"}
    roots = []
    for name, kind in cases.items():
        root = tmp_path / f"r-{kind}-{name.strip('.')}"
        mgr = ckptio.CheckpointManager(root, async_save=False)
        mgr.save(100, state(100))
        mgr.save(200, state(200))
        step = root / "step_00000200"
        data = sorted(n for n in os.listdir(step) if n.endswith(".distcp"))[0]
        if kind == "fifo":
            (step / name).unlink()
            os.mkfifo(step / name)
        elif kind == "symlink":  # a data file replaced by a link to a file outside the root
            (step / data).unlink()
            (step / data).symlink_to(outside)
        else:  # a data file replaced by a link to a device
            (step / data).unlink()
            (step / data).symlink_to("/dev/zero")
        roots.append(str(root))
    r = python(_SPECIAL_OPS, json.dumps(roots), timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for root in roots:
        for op in ("all_steps", "load", "save"):
            outcome, seconds = got[f"{root} {op}"]
            assert seconds < 10, (root, op, outcome)
        # Step 200 is damaged (its marker or data is no regular file): load takes step 100, a save succeeds.
        assert got[f"{root} load"][0] == "100", (root, got[f"{root} load"])
        assert got[f"{root} save"][0] == "300", (root, got[f"{root} save"])
    assert outside.read_bytes() == b"precious"
    if CKPTIO_CLI:
        for root in roots:
            for command in ("inspect", "verify", "clean"):
                t = time.monotonic()
                res = cli(command, root, timeout=30)
                assert time.monotonic() - t < 10 and res.returncode in (0, 1), (command, root, res.stderr)
            assert os.path.isdir(os.path.join(root, "step_00000100"))
        assert outside.read_bytes() == b"precious"


# ---- hostile sizes ---------------------------------------------------------------------------------


def _md(path):
    with open(path / ".metadata", "rb") as f:
        return pickle.load(f)


def _write_md(path, md):
    with open(path / ".metadata", "wb") as f:
        pickle.dump(md, f)


def _info(md, fqn):
    return next(v for k, v in md.storage_data.items() if k.fqn == fqn)


@requires_cli
def test_hostile_sizes_are_refused_in_bounded_time(tmp_path):
    path = tmp_path / "c"
    dcp.save({"w": torch.arange(4.0), "step": 5}, storage_writer=cdcp.FileSystemWriter(
        path, _extensions=[cdcp.ZStandard()]), no_dist=True)
    md = _md(path)
    # A byte item that decompresses to 4 GiB of zeros from 128 KB.
    frame = zstd_rle_frame(4 << 30, declare=True)
    (path / "bomb.distcp").write_bytes(frame)
    info = _info(md, "step")
    info.relative_path, info.offset, info.length = "bomb.distcp", 0, len(frame)
    _write_md(path, md)
    t = time.monotonic()
    r = cli("verify", path)
    assert r.returncode != 0 and "decompression bomb" in r.stderr and "bomb.distcp" in r.stderr, r.stderr
    assert time.monotonic() - t < 10
    # 100,000 zstd transforms on one item: named as such, not as an unsupported transform.
    _info(md, "w").transform_descriptors = ["stream.zstd/1"] * 100_000
    _write_md(path, md)
    r = cli("inspect", path)
    assert r.returncode != 0 and "the item has 100000 transforms" in r.stderr, r.stderr
    # A relative path leaving the directory reaches nothing outside it.
    secret = tmp_path / "secret.distcp"
    secret.write_bytes(b"\0" * 64)
    md = _md(tmp_path / "c")
    _info(md, "w").transform_descriptors = []
    _info(md, "w").relative_path = "../secret.distcp"
    _write_md(path, md)
    r = cli("verify", path)
    assert r.returncode != 0 and "../secret.distcp" in r.stderr, r.stderr
    # A safetensors header that declares a petabyte: refused from its length, nothing allocated.
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 50) + b"{}")
    for args in (("verify", huge), ("inspect", huge)):
        t = time.monotonic()
        r = cli(*args)
        assert r.returncode != 0 and "huge.safetensors" in r.stderr and "header" in r.stderr, r.stderr
        assert time.monotonic() - t < 5
    with pytest.raises(ckptio.CkptioError) as ei:
        ckptio.load(huge)
    assert ei.value.status_name in ("E_FORMAT", "E_TRUNCATED") and "huge.safetensors" in str(ei.value)


def test_a_tensor_name_of_a_megabyte_is_refused_naming_the_file(tmp_path):
    name = "n" * (1 << 20)
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "long.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    t = time.monotonic()
    try:
        got = ckptio.load(path)
    except ckptio.CkptioError as e:
        assert "long.safetensors" in str(e) and len(str(e)) < 4096, str(e)[:300]
    else:  # read as written: the one tensor under its whole name
        assert list(got) == [name] and torch.equal(got[name], torch.zeros(1))
    assert time.monotonic() - t < 5


# ---- two processes on one root -----------------------------------------------------------------------

_SAVER = """
    import sys, time, torch, ckptio
    root, first = sys.argv[1], int(sys.argv[2])
    mgr = ckptio.CheckpointManager(root, async_save=False)
    for s in range(first, first + 4, 2):
        mgr.save(s, {"w": torch.full((64, 64), float(s)), "step": s})
    print("saved", flush=True)
"""


def test_two_processes_saving_into_one_root_both_progress(tmp_path):
    root = tmp_path / "run"
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SAVER), str(root), str(first)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for first in (1, 2)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "saved" in out, err[-3000:]
    mgr = ckptio.CheckpointManager(root, async_save=False)
    assert mgr.all_steps() == [1, 2, 3, 4]
    for s in range(1, 5):
        sd = {"w": torch.zeros(64, 64), "step": 0}
        assert mgr.load(sd, step=s, check="full") == s
        assert sd["step"] == s and torch.equal(sd["w"], torch.full((64, 64), float(s)))


# ---- a failed check is not damage ------------------------------------------------------------------

_OUT_OF_DESCRIPTORS = """
    import os, resource, sys, torch, ckptio
    mgr = ckptio.CheckpointManager(sys.argv[1], async_save=False)
    sd = {"w": torch.zeros(8, 4), "step": 0}
    assert mgr.load(sd, check="full") == 20  # every lazy import done while descriptors are there
    fd = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor
    os.close(fd)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for spare in range(1, 5):  # only `spare` descriptors left: the walk, the check or the read runs out
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd + spare, hard))
        try:
            got = "LOADED %s" % mgr.load(sd, check="full")
        except ckptio.CkptioError as e:
            got = "ERROR %s %s" % (e.status_name, str(e).replace(chr(10), " "))
        except BaseException as e:  # torch's CheckpointException is one; the cause is in its text
            got = "RAISED %s %s" % (type(e).__name__, "Too many open files" in str(e))
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        print(got, flush=True)
    print("AFTER", mgr.load(sd, check="full"), sd["step"])
"""


def test_failed_check_is_not_damage(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=2, async_save=False)
    mgr.save(10, state(10))
    mgr.save(20, state(20))
    before = digest(root)
    r = python(_OUT_OF_DESCRIPTORS, root)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    # Out of descriptors proves nothing about step 20: it fails, or loads step 20; never step 10 or None.
    assert all(ln.startswith(("ERROR E_IO", "RAISED CheckpointException True", "LOADED 20")) for ln in lines[:-1]), lines
    check_failed = [ln for ln in lines if ln.startswith("ERROR E_IO step 20 (") and ": check: " in ln]
    assert check_failed and "Too many open files" in check_failed[0], lines
    assert lines[-1] == "AFTER 20 20", lines
    assert digest(root) == before
    mgr.save(30, state(30))  # retention keeps the two newest; nothing was replaced as damage
    assert mgr.all_steps() == [20, 30]


def test_refused_step_load_gives_the_refusal(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, async_save=False)
    mgr.save(50, state(50))
    step = root / "step_00000100"  # committed by another tool, holding a value the reader refuses
    torch_save({"w": torch.full((8, 4), 100.0), "step": 100, "args": argparse.Namespace(lr=0.1)}, step)
    ckptio._ckptio.steps_commit(str(root), 100)
    before = digest(step)
    with pytest.raises(ckptio.CkptioError) as ei:
        mgr.load({"w": torch.zeros(8, 4), "step": 0, "args": None}, step=100, check="full")
    assert ei.value.status_name == "E_DISALLOWED", ei.value
    assert "step 100 (" in str(ei.value) and "is refused" in str(ei.value), ei.value
    assert "global 'argparse.Namespace'" in str(ei.value), ei.value
    sd = blank()
    assert mgr.load(sd) == 50 and sd["step"] == 50
    assert digest(step) == before
