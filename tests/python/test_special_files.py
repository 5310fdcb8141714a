"""Nothing a checkpoint directory holds can hang ckptio, and a signal always ends the CLI.

Any name ckptio opens in a manager root, a DCP directory or a Hugging Face directory may hold a
FIFO (open(2) would wait for a writer forever) or a symlink to a device (/dev/zero never ends):
every operation (the CLI's inspect / verify / clean / convert; the manager's all_steps / load /
save; ckptio.load, ckptio.safe_open, ckptio.dcp's reader and verify) answers at once, refusing
such a file with an error that names it and what it is, or skipping a step it damages with that
reason. Each layout runs in a subprocess with a timeout, so that a regression fails instead of
hanging the suite. The CLI ends at SIGINT and SIGTERM with 130 / 143, also on such a root; it
takes a directory holding model.safetensors as ckptio.load does (docs/RELIABILITY.md section 12).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ckptio
from conftest import CKPTIO_CLI

requires_cli = pytest.mark.skipif(CKPTIO_CLI is None, reason="no ckptio command")

TIMEOUT = 60  # per command; a hang is what this file exists to catch


def cli(*args, timeout=TIMEOUT, env=None):
    try:
        return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, CKPTIO_NO_PROGRESS="1", **(env or {})))
    except subprocess.TimeoutExpired:
        pytest.fail(f"ckptio {' '.join(map(str, args))} did not end within {timeout} s")


def python(script: str, *args, timeout=240):
    """Runs OUTCOME and `script` in a fresh interpreter; each line it prints is a JSON record."""
    code = textwrap.dedent(OUTCOME) + textwrap.dedent(script)
    try:
        p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the operations did not end within {timeout} s; done so far:\n{e.stdout}")
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


OUTCOME = """
    import json, sys, time, warnings
    warnings.filterwarnings("ignore")
    def outcome(what, fn):
        t = time.monotonic()
        try:
            r = fn()
            o = "ok " + repr(r)[:200]
        except BaseException as e:
            # torch.distributed.checkpoint wraps what a rank raised.
            inner = [f[0] for f in getattr(e, "failures", {}).values()]
            o = "; ".join(f"{type(x).__name__}: {x}" for x in (inner or [e]))
        print(json.dumps({"what": what, "s": time.monotonic() - t, "outcome": o}), flush=True)
"""


def special(path: Path, kind: str) -> None:
    """Replaces the file at `path` by a FIFO or a symlink to /dev/zero."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def refused(text: str, kind: str) -> bool:
    """Whether `text` refuses the special file the way ckptio words it: a FIFO by its type; a symlink
    to a device as a symlink where ckptio follows none (a step's files), as what it points to where
    it does, or as a symlink leaving the directory (a model's shards)."""
    if kind == "fifo":
        return "is a FIFO" in text or "not a regular file" in text
    return any(s in text for s in ("is a symlink", "is a character device", "not a regular file",
                                   "is a symlink to /dev/zero"))

# ---- a manager root ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manager_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mgr") / "root"
    with ckptio.CheckpointManager(root, async_save=False) as mgr:
        mgr.save(100, {"w": torch.arange(10.0)})
        mgr.save(200, {"w": torch.arange(10.0) + 1})
    return root


def _step_names(root: Path):
    return sorted(p.name for p in (root / "step_00000200").iterdir())


@requires_cli
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_manager_root(manager_root, tmp_path, kind):
    names = _step_names(manager_root)
    assert {".ckptio-step", ".metadata", ".ckptio-dcp.lock"} <= set(names) and any(n.endswith(".distcp") for n in names)
    copies = []

    def copy_with(name):  # the root with `name` (in step 200, or the root's own) replaced
        r = tmp_path / f"r{len(copies)}"
        copies.append(r)
        shutil.copytree(manager_root, r)
        special(r / name[5:] if name.startswith("ROOT/") else r / "step_00000200" / name, kind)
        return r

    roots = {name: copy_with(name) for name in names + ["ROOT/.ckptio-dcp.lock"]}
    records = python("""
        import torch, ckptio
        for name, r in json.loads(sys.argv[1]).items():
            m = ckptio.CheckpointManager(r, async_save=False)
            outcome((name, "all_steps"), m.all_steps)
            outcome((name, "load"), lambda: m.load({"w": torch.zeros(10)}))
            outcome((name, "save"), lambda: m.save(300, {"w": torch.zeros(10)}).result())
    """, json.dumps({k: str(v) for k, v in roots.items()}))
    got = {tuple(rec["what"]): rec for rec in records}
    assert len(got) == 3 * len(roots), records
    for name, r in roots.items():
        for op in ("all_steps", "load", "save"):
            assert got[(name, op)]["s"] < 20, got[(name, op)]
        if name == "ROOT/.ckptio-dcp.lock":
            # The root's lock: no save; reading the steps needs no lock.
            save = got[(name, "save")]["outcome"]
            assert refused(save, kind) and ".ckptio-dcp.lock" in save, save
            assert got[(name, "load")]["outcome"] == "ok 200"
        elif name in (".ckptio-dcp.lock", ".ckptio-step-begun"):
            # Never read back: a step's own lock file, and its begun mark (only its presence counts).
            assert got[(name, "load")]["outcome"] == "ok 200"
            assert got[(name, "save")]["outcome"] == "ok 300", (name, got[(name, "save")])
        else:
            # The step is damaged: skipped (the reason is logged), the older one loads.
            assert got[(name, "load")]["outcome"] == "ok 100", (name, got[(name, "load")])
            assert got[(name, "save")]["outcome"] == "ok 300", (name, got[(name, "save")])
        assert got[(name, "all_steps")]["outcome"] == ("ok [100]" if name == ".ckptio-step" else "ok [100, 200]")
        # The CLI, on a fresh copy of the same root.
        fresh = copy_with(name)
        ins = cli("inspect", fresh)
        ver = cli("verify", fresh)
        cln = cli("clean", fresh)
        if name in (".ckptio-step", ".metadata"):
            assert ins.returncode == 0 and refused(ins.stdout, kind) and "damaged" in ins.stdout, ins
            assert ver.returncode == 1 and refused(ver.stderr, kind) and f"step_00000200/{name}" in ver.stderr, ver
        elif name == "ROOT/.ckptio-dcp.lock":
            assert ins.returncode == 0 and ver.returncode == 0, (ins, ver)
            assert cln.returncode == 1 and refused(cln.stderr, kind) and ".ckptio-dcp.lock" in cln.stderr, cln
            continue
        elif name == ".ckptio-step-begun":
            # The step is whole, but removal refuses what the manager does not make: it is left alone.
            assert ins.returncode == 0 and name in ins.stdout and "removal leaves this step whole" in ins.stdout, ins
            assert ver.returncode == 0 and "step 200: ok" in ver.stdout, ver
            assert cln.returncode == 0 and "left step 200 alone" in cln.stdout and name in cln.stdout, cln
            continue
        elif name != ".ckptio-dcp.lock":
            assert ver.returncode == 1 and "step 200: damaged" in ver.stderr and name in ver.stderr, ver
        assert cln.returncode == 0, cln


# ---- a DCP directory ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dcp_dir(tmp_path_factory):
    import torch.distributed.checkpoint as dcp

    import ckptio.dcp

    d = tmp_path_factory.mktemp("dcp") / "ckpt"
    dcp.save({"w": torch.arange(12.0).reshape(3, 4), "step": 7}, storage_writer=ckptio.dcp.FileSystemWriter(d),
             no_dist=True)
    return d


@requires_cli
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_dcp_directory(dcp_dir, tmp_path, kind):
    names = sorted(p.name for p in dcp_dir.iterdir() if p.name != ".ckptio-dcp.lock")
    assert ".metadata" in names and any(n.startswith(".ckptio-manifest-") for n in names), names
    dirs = {}
    for name in names:
        d = tmp_path / f"d{len(dirs)}"
        shutil.copytree(dcp_dir, d)
        special(d / name, kind)
        dirs[name] = d
    records = python("""
        import torch, ckptio, ckptio.dcp
        import torch.distributed.checkpoint as dcp
        for name, d in json.loads(sys.argv[1]).items():
            sd = {"w": torch.zeros(3, 4), "step": 0}
            outcome((name, "dcp.load"), lambda: dcp.load(sd, storage_reader=ckptio.dcp.FileSystemReader(d),
                                                         no_dist=True))
            outcome((name, "verify"), lambda: ckptio.dcp.verify(d))
    """, json.dumps({k: str(v) for k, v in dirs.items()}))
    got = {tuple(rec["what"]): rec for rec in records}
    for name, d in dirs.items():
        for op in ("dcp.load", "verify"):
            rec = got[(name, op)]
            assert rec["s"] < 20, (name, rec)
            if op == "dcp.load" and name.startswith(".ckptio-manifest-"):
                assert rec["outcome"] == "ok None", rec  # a load does not read the manifest
                continue
            assert name in rec["outcome"] and refused(rec["outcome"], kind), rec
        for args in (("inspect", d), ("verify", d), ("convert", d, tmp_path / f"out{len(os.listdir(tmp_path))}")):
            r = cli(*args)
            if (args[0] == "inspect" and name != ".metadata") or (args[0] == "convert" and "manifest" in name):
                assert r.returncode == 0, (args, r)  # what they do not read
                continue
            assert r.returncode == 1 and name in r.stderr and refused(r.stderr, kind), (args, r)


# ---- Hugging Face directories -----------------------------------------------------------------


def _hf_dir(d: Path, shards: int) -> dict:
    d.mkdir()
    want, weight_map = {}, {}
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        t = {f"t{k}": torch.arange(5.0) + k}
        ckptio.save(t, d / name)
        want.update(t)
        weight_map[f"t{k}"] = name
    if shards > 1:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return want


@requires_cli
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_hf_directory(tmp_path, kind):
    cases = {}
    for shards in (1, 3):
        src = tmp_path / f"src{shards}"
        _hf_dir(src, shards)
        for name in sorted(os.listdir(src)):
            d = tmp_path / f"hf{len(cases)}"
            shutil.copytree(src, d)
            special(d / name, kind)
            cases[name + f"@{shards}"] = d
    records = python("""
        import ckptio
        for key, d in json.loads(sys.argv[1]).items():
            outcome((key, "load"), lambda: ckptio.load(d))
            outcome((key, "load trusted"), lambda: ckptio.load(d, allow_symlinks=True))
            outcome((key, "safe_open"), lambda: list(ckptio.safe_open(d, framework="pt").keys()))
    """, json.dumps({k: str(v) for k, v in cases.items()}))
    got = {tuple(rec["what"]): rec for rec in records}
    for key, d in cases.items():
        name = key.split("@")[0]
        for op in ("load", "load trusted", "safe_open"):
            rec = got[(key, op)]
            assert rec["s"] < 20 and not rec["outcome"].startswith("ok"), (key, rec)
            assert name in rec["outcome"] and refused(rec["outcome"], kind), (key, rec)
        for args in (("inspect", d), ("verify", d), ("convert", d, tmp_path / f"o{len(os.listdir(tmp_path))}.pt")):
            r = cli(*args)
            assert r.returncode == 1 and name in r.stderr and refused(r.stderr, kind), (key, args, r)
    # A file given by path: the detector refuses a device before reading a byte.
    zero = tmp_path / "zero.safetensors"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ckptio.CkptioError, match="is a character device, not a regular file"):
        ckptio.load(zero)
    r = cli("verify", zero)
    assert r.returncode == 1 and "is a character device" in r.stderr


# ---- the CLI takes what ckptio.load takes -------------------------------------------------------


@requires_cli
def test_cli_takes_a_model_directory(tmp_path):
    d = tmp_path / "model"
    want = _hf_dir(d, 1)  # model.safetensors alone, no index
    assert os.listdir(d) == ["model.safetensors"]
    assert set(ckptio.load(d)) == set(want)
    r = cli("verify", d)
    assert r.returncode == 0 and r.stdout.startswith(f"{d}: ok (") and "1 tensor" in r.stdout, r
    doc = json.loads(cli("inspect", "--json", d).stdout)
    assert doc["path"] == str(d) and doc["index"] is None and [t["name"] for t in doc["tensors"]] == ["t0"]
    r = cli("convert", d, tmp_path / "model.pt")
    assert r.returncode == 0, r.stderr
    assert torch.equal(torch.load(tmp_path / "model.pt", weights_only=True)["t0"], want["t0"])
    # A directory of several shards with an index, and one without: every tensor, as ckptio.load reads them.
    for with_index in (True, False):
        sharded = tmp_path / f"sharded{int(with_index)}"
        want = _hf_dir(sharded, 3)
        if not with_index:
            (sharded / "model.safetensors.index.json").unlink()
        r = cli("verify", sharded)
        assert r.returncode == 0 and "3 shards, 3 tensors" in r.stdout, r
        r = cli("convert", sharded, tmp_path / f"s{int(with_index)}.pt")
        assert r.returncode == 0, r.stderr
        got = torch.load(tmp_path / f"s{int(with_index)}.pt", weights_only=True)
        assert list(got) == list(ckptio.load(sharded)) and all(torch.equal(got[k], want[k]) for k in want)


# ---- signals end the CLI ---------------------------------------------------------------------------


def _read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@requires_cli
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_verify_of_a_root_holding_a_fifo(tmp_path, sig):
    """`ckptio verify ROOT` is slowed down (4 KiB requests, one thread, no O_DIRECT) on a large step;
    the root's newer step holds a FIFO as its marker. The signal arrives while the data is read and
    the command ends at once, with 128 + the signal's number."""
    root = tmp_path / "root"
    with ckptio.CheckpointManager(root, async_save=False) as mgr:
        mgr.save(100, {"w": torch.ones(32 << 20)})  # 128 MiB
        mgr.save(200, {"w": torch.zeros(4)})
    special(root / "step_00000200" / ".ckptio-step", "fifo")
    env = dict(os.environ, CKPTIO_THREADS="1", CKPTIO_CHUNK_BYTES="4096", CKPTIO_BACKEND="pread",
               CKPTIO_DIRECT="off", CKPTIO_NO_PROGRESS="1")
    p = subprocess.Popen([CKPTIO_CLI, "verify", str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    try:
        start = time.monotonic()
        while p.poll() is None and _read_bytes(p.pid) < (8 << 20) and time.monotonic() - start < TIMEOUT:
            time.sleep(0.002)
        assert p.poll() is None, f"verify ended before the signal: {p.communicate()}"
        sent = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=TIMEOUT)
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 128 + sig, (p.returncode, out, err)
    assert f"ckptio: interrupted by {signal.Signals(sig).name}" in err, err
    assert "step 100: ok" not in out and "damaged" not in err  # a check cut short says nothing
    assert took < 10, f"{took:.2f} s from the signal to the end"
