"""The format of a save follows the path's extension when format= is not
given (.safetensors and anything else: safetensors; .pt .pth .bin .ckpt:
torch.save), so torch.load reads what ckptio.save wrote to "model.pt"; and
`ckptio inspect` says which format a file is in."""
import subprocess

import pytest
import torch

import ckptio
from conftest import CKPTIO_CLI, requires_cli


@pytest.mark.parametrize("name,fmt", [
    ("m.pt", "torch"), ("m.pth", "torch"), ("pytorch_model.bin", "torch"), ("last.ckpt", "torch"),
    ("M.PT", "torch"), ("m.safetensors", "safetensors"), ("m.st", "safetensors"), ("noext", "safetensors"),
    ("dir.pt/m.safetensors", "safetensors"),
])
def test_format_follows_the_extension(tmp_path, name, fmt):
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    ckptio.save(sd, path)
    with ckptio.open(path) as f:
        assert f.format == fmt
    if fmt == "torch":
        assert torch.equal(torch.load(path, weights_only=True)["w"], sd["w"])
    else:
        assert path.read_bytes()[8:9] == b"{"


def test_explicit_format_wins(tmp_path):
    ckptio.save({"w": torch.ones(2)}, tmp_path / "m.pt", format="safetensors")
    ckptio.save({"w": torch.ones(2)}, tmp_path / "m.safetensors", format="torch")
    assert ckptio.open(tmp_path / "m.pt").format == "safetensors"
    assert ckptio.open(tmp_path / "m.safetensors").format == "torch"


def test_torch_extension_refuses_safetensors_options(tmp_path):
    with pytest.raises(ValueError, match="metadata is a safetensors feature"):
        ckptio.save({"w": torch.ones(2)}, tmp_path / "m.pt", metadata={"a": "b"})
    with pytest.raises(ValueError, match="checksums=True is for safetensors"):
        ckptio.save({"w": torch.ones(2)}, tmp_path / "m.bin", checksums=True)
    assert list(tmp_path.iterdir()) == []


@requires_cli
def test_inspect_names_the_format(tmp_path):
    ckptio.save({"w": torch.ones(2)}, tmp_path / "m.pt")
    ckptio.save({"w": torch.ones(2)}, tmp_path / "m.safetensors")
    for name, want in (("m.pt", "format:   torch.save\n"), ("m.safetensors", "format:   safetensors\n")):
        out = subprocess.run([CKPTIO_CLI, "inspect", str(tmp_path / name)], capture_output=True, text=True,
                             check=True).stdout
        assert want in out, out
