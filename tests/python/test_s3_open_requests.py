"""ckptio.open of an s3:// file, counted in the fault proxy's log: the format probe's GET of the object's first
bytes is also its open (no HEAD, no second GET of the header), so the handle is ready after one request; the
tensors' bytes then come in GETs of their own, pinned to the ETag that first GET saw."""

from __future__ import annotations

import subprocess

import pytest
import torch

import ckptio
from ckptio import _ckptio

from conftest import CKPTIO_CLI, requires_cli
from test_s3_files import Proxy, through


def logged(proxy):
    return [(e["method"], e["range"]) for e in proxy.requests()]


def test_probe_and_open_are_one_get(s3_prefix, tmp_path):
    url = f"{s3_prefix}/model.safetensors"
    tensors = {"a": torch.arange(5000, dtype=torch.float32), "b": torch.ones(3, 4, dtype=torch.bfloat16)}
    ckptio.save(tensors, url)
    proxy = Proxy(tmp_path)
    try:
        f = through(proxy, lambda: ckptio.open(url))
        assert logged(proxy) == [("GET", "bytes=0-65535")]
        with f:
            assert f.keys() == ["a", "b"]
            for name, want in tensors.items():
                assert torch.equal(through(proxy, lambda: f.get_tensor(name)), want)
        after = logged(proxy)
        assert [m for m, _ in after] == ["GET"] * len(after) and len(after) > 1, after
    finally:
        proxy.kill()


def test_an_object_replaced_after_the_probe_is_stale(s3_prefix):
    """The open after a probe takes the probe's answer: an object replaced in between fails its read (E_STALE),
    it does not mix two versions. A probe always asks the server: ckptio.open (which probes first) reads the
    new object."""
    url = f"{s3_prefix}/model.safetensors"
    ckptio.save({"a": torch.zeros(1000)}, url)
    engine = ckptio.Engine()
    assert _ckptio.format_detect(url, engine) == "safetensors"
    ckptio.save({"a": torch.ones(1000)}, url)  # the default engine: the probe's engine keeps its answer
    out = torch.empty(1000)
    with _ckptio.ModelReader(url, engine, False) as reader:
        with pytest.raises(ckptio.CkptioError) as e:
            reader.read([(0, out.data_ptr(), 4000, 0)])
        assert e.value.status_name == "E_STALE", str(e.value)
    with ckptio.open(url, engine=engine) as f:
        assert torch.equal(f.get_tensor("a"), torch.ones(1000))


@requires_cli
def test_cli_inspect_and_verify_send_one_get_before_the_data(s3_prefix, tmp_path):
    """`ckptio inspect` and `ckptio verify` of an s3:// safetensors file detect its format once, on the engine
    that then opens it: the probe's GET of the first bytes is the open, inspect sends nothing more (the header
    fits in it) and verify only the data's requests."""
    url = f"{s3_prefix}/model.safetensors"
    tensors = {"a": torch.arange(5000, dtype=torch.float32), "b": torch.ones(3, 4, dtype=torch.bfloat16)}
    ckptio.save(tensors, url)
    for command, more in (("inspect", False), ("verify", True)):
        (tmp_path / command).mkdir()
        proxy = Proxy(tmp_path / command)
        try:
            r = through(proxy, lambda: subprocess.run([CKPTIO_CLI, command, url], capture_output=True, text=True,
                                                      timeout=120))
            assert r.returncode == 0, r.stdout + r.stderr
            got = logged(proxy)
        finally:
            proxy.kill()
        assert got[0] == ("GET", "bytes=0-65535"), f"{command}: {got}"
        assert got.count(("GET", "bytes=0-65535")) == 1, f"{command}: {got}"
        if more:  # the data's reads (their file's open is a HEAD: the probe's answer went to the header's open)
            data = [r for m, r in got[1:] if m == "GET"]
            assert data and all(not r.startswith("bytes=0-") for r in data), got
        else:
            assert got == [("GET", "bytes=0-65535")], got
