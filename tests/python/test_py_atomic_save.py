"""What an atomic save keeps and how it names things, through the Python package:

- saving over a file keeps its permission bits (data and checksum manifest), as
  torch.save and safetensors.save_file do; a new file gets 0666 & ~umask;
- a manifest is bound to its data by a per-save id: data of one save beside the
  manifest of another is a stale manifest (E_STALE), never corrupt data, also
  while two processes save to one path and a third runs ``ckptio verify``;
- every file name up to 255 bytes saves, in both formats, with checksums; torch
  and safetensors read the files back; a longer one is refused naming the file.
"""
import errno
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import ckptio
from conftest import CKPTIO_CLI, requires_cli

SAVE_ID_KEY = "ckptio.save_id"


def _sd(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300, 200, generator=g), "b": torch.arange(7, dtype=torch.int64) + seed}


def _manifest(path):
    return path + ".ckptio-manifest.json"


def _mode(path):
    return os.stat(path).st_mode & 0o7777


# ---- permissions ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444])
def test_resave_keeps_the_mode(tmp_path, fmt, mode):
    path = str(tmp_path / ("m." + ("safetensors" if fmt == "safetensors" else "pt")))
    checksums = fmt == "safetensors"
    ckptio.save(_sd(0), path, format=fmt, checksums=checksums)
    os.chmod(path, mode)
    if checksums:
        os.chmod(_manifest(path), 0o666)  # the manifest follows its data, not its predecessor
    ckptio.save(_sd(1), path, format=fmt, checksums=checksums)
    assert _mode(path) == mode
    if checksums:
        assert _mode(_manifest(path)) == mode
    assert not [n for n in os.listdir(tmp_path) if ".ckptio-tmp-" in n]
    # The reference writers rewrite in place and so keep the mode too.
    ref = str(tmp_path / "ref")
    torch.save(_sd(0), ref)
    os.chmod(ref, mode | 0o200)
    torch.save(_sd(1), ref)
    assert _mode(ref) == mode | 0o200


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_new_file_follows_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        st = str(tmp_path / "new.safetensors")
        pt = str(tmp_path / "new.pt")
        ckptio.save(_sd(), st, checksums=True)
        ckptio.save(_sd(), pt, format="torch")
    finally:
        os.umask(old)
    assert _mode(st) == _mode(_manifest(st)) == _mode(pt) == 0o666 & ~mask


def test_inherit_mode_hook(tmp_path):
    """The hook for writers with temporaries of their own (the DCP commit)."""
    from ckptio import _ckptio

    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(b"x")
    os.chmod(old, 0o640)
    fd = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        _ckptio.inherit_mode(fd, str(old))
        assert _mode(str(new)) == 0o640
        os.fchmod(fd, 0o666)
        _ckptio.inherit_mode(fd, tmp_path / "missing")  # nothing to inherit: unchanged
        assert _mode(str(new)) == 0o666
    finally:
        os.close(fd)


# ---- manifests bound to their data ---------------------------------------------------


def test_save_id_in_metadata(tmp_path):
    path = str(tmp_path / "m.safetensors")
    ckptio.save(_sd(), path, metadata={"format": "pt", SAVE_ID_KEY: "forged"}, checksums=True)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and len(meta[SAVE_ID_KEY]) == 32 and meta[SAVE_ID_KEY] != "forged"
    assert ckptio.open(path).metadata() == meta
    assert torch.equal(load_file(path)["w"], _sd()["w"])
    ckptio.save(_sd(), path, metadata={"format": "pt", SAVE_ID_KEY: "forged"})
    assert ckptio.open(path).metadata() == {"format": "pt"}


def test_manifest_of_another_save_is_stale(tmp_path):
    path = str(tmp_path / "m.safetensors")
    ckptio.save(_sd(0), path, checksums=True)
    shutil.copy(path, tmp_path / "data_a")
    ckptio.save(_sd(1), path, checksums=True)  # same layout, other values
    shutil.copy(tmp_path / "data_a", path)  # data of A beside the manifest of B
    with ckptio.open(path) as f:
        with pytest.raises(ckptio.CkptioError) as info:
            f.verify()
    e = info.value
    assert e.status_name == "E_STALE" and e.status == ckptio._ckptio.E_STALE and e.path == path
    assert "written by another save" in str(e) and "the manifest is stale" in str(e)
    assert "checksum mismatch" not in str(e)


_WRITER = """
import sys, time, torch, ckptio
path, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
g = torch.Generator().manual_seed(seed)
sd = {"w": torch.randn(256, 256, generator=g), "b": torch.randn(64, generator=g)}
n, until = 0, time.monotonic() + seconds
while time.monotonic() < until:
    ckptio.save(sd, path, checksums=True)
    n += 1
print(n)
"""


@requires_cli
def test_two_savers_and_cli_verify_never_report_corruption(tmp_path):
    """Every DDP rank saving one file while `ckptio verify` runs: each verify is
    ok or reports a stale manifest; none reports a checksum mismatch."""
    path = str(tmp_path / "ddp.safetensors")
    ckptio.save(_sd(), path, checksums=True)
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, path, str(s), "2.5"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for s in (1, 2)]
    outcomes = {"ok": 0, "stale": 0}
    try:
        while any(w.poll() is None for w in writers):
            r = subprocess.run([CKPTIO_CLI, "verify", path], capture_output=True, text=True)
            if r.returncode == 0:
                outcomes["ok"] += 1
            else:
                assert "checksum mismatch" not in r.stderr and "hash to" not in r.stderr, r.stderr
                assert "E_STALE" in r.stderr or "the manifest is stale" in r.stderr, r.stderr
                outcomes["stale"] += 1
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
    saves = []
    for w in writers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        saves.append(int(out))
    assert min(saves) >= 3 and sum(outcomes.values()) >= 20, (saves, outcomes)


# ---- long names --------------------------------------------------------------------


def _name(length, ext):
    stem = ("n\u00e9" * 200).encode()[: length - len(ext)]
    while True:  # whole UTF-8 characters only
        try:
            return (stem.decode() + ext) if len(stem) + len(ext) == length else None
        except UnicodeDecodeError:
            stem = stem[:-1] + b"x"


@pytest.mark.parametrize("length", [200, 235, 250, 255])
def test_long_names_save_in_both_formats(tmp_path, length):
    st_name, pt_name = _name(length, ".safetensors"), _name(length, ".pt")
    assert len(os.fsencode(st_name)) == len(os.fsencode(pt_name)) == length
    st, pt = str(tmp_path / st_name), str(tmp_path / pt_name)
    sd = _sd(3)
    for _ in range(2):  # a new file, then over it
        ckptio.save(sd, st, checksums=True)
        ckptio.save(sd, pt, format="torch")
    assert torch.equal(load_file(st)["w"], sd["w"])
    assert torch.equal(torch.load(pt, weights_only=True)["w"], sd["w"])
    with ckptio.open(st) as f:
        assert f.verify()["tensors"] == 2
    with ckptio.open(pt) as f:
        f.verify()
    names = os.listdir(tmp_path)
    assert all(len(os.fsencode(n)) <= 255 for n in names)
    assert not [n for n in names if ".ckptio-tmp-" in n]
    manifests = [n for n in names if n.endswith(".ckptio-manifest.json")]
    assert len(manifests) == 1
    if length + len(".ckptio-manifest.json") <= 255:
        assert manifests[0] == st_name + ".ckptio-manifest.json"
    else:  # first bytes, '~', 16 hex digits of the name's hash
        stem = manifests[0][: -len(".ckptio-manifest.json")]
        assert st_name.startswith(stem[:-17]) and stem[-17] == "~" and len(os.fsencode(stem)) <= 234


def test_name_over_255_bytes_is_refused_naming_the_file(tmp_path):
    path = str(tmp_path / ("x" * 244 + ".safetensors"))  # 256 bytes
    for fmt in ("safetensors", "torch"):
        with pytest.raises(ckptio.CkptioError) as info:
            ckptio.save(_sd(), path, format=fmt, checksums=fmt == "safetensors")
        e = info.value
        assert e.errno == errno.ENAMETOOLONG and e.path == path and e.status_name == "E_INVAL"
        assert "the file name is 256 bytes long, names may have at most 255 bytes" in str(e)
    assert os.listdir(tmp_path) == []
