"""Checksums through the Python package: save(checksums=True) writes the
manifest, CheckpointFile.verify() checks it and names a damaged tensor; torch
files carry CRC-32s for host and GPU storages alike."""
import os

import pytest
import torch

import ckptio
from conftest import requires_cuda, safetensors_header


def _state_dict(device="cpu"):
    g = torch.Generator().manual_seed(7)
    return {
        "a": torch.randn(1000, 300, generator=g).to(device),
        "b": torch.randint(0, 255, (5 << 20,), dtype=torch.uint8, generator=g).to(device),
        "c": torch.randn(3, generator=g).to(torch.bfloat16).to(device),
    }


def _flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def _check_manifest_and_damage(path):
    assert os.path.exists(path + ".ckptio-manifest.json")
    with ckptio.open(path) as f:
        report = f.verify()
    assert report["tensors"] == 3 and report["bytes"] == 1000 * 300 * 4 + (5 << 20) + 3 * 2
    assert report["blocks"] >= 4  # "b" spans two 4 MiB blocks
    header, data_start = safetensors_header(path)
    begin = header["b"]["data_offsets"][0]
    _flip_byte(path, data_start + begin + (4 << 20) + 17)  # second block of "b"
    with ckptio.open(path) as f:
        with pytest.raises(ckptio.CkptioError) as info:
            f.verify()
    e = info.value
    assert e.status_name == "E_CHECKSUM" and e.subject == "b" and e.path == path
    assert "checksum mismatch" in str(e) and ".ckptio-manifest.json" in str(e)


def test_safetensors_checksums_verify_and_name_the_damaged_tensor(tmp_path):
    path = str(tmp_path / "m.safetensors")
    ckptio.save(_state_dict(), path, checksums=True)
    _check_manifest_and_damage(path)


def test_save_without_checksums_removes_a_stale_manifest(tmp_path):
    path = str(tmp_path / "m.safetensors")
    ckptio.save(_state_dict(), path, checksums=True)
    ckptio.save(_state_dict(), path)
    assert not os.path.exists(path + ".ckptio-manifest.json")
    with ckptio.open(path) as f:
        with pytest.raises(ckptio.CkptioError) as info:
            f.verify()
    assert info.value.status_name == "E_NOT_FOUND" and "no checksum manifest" in str(info.value)


def test_checksums_flag_is_for_safetensors(tmp_path):
    with pytest.raises(ValueError, match="checksums=True is for safetensors"):
        ckptio.save(_state_dict(), str(tmp_path / "m.pt"), format="torch", checksums=True)


def test_torch_file_crcs_verify_and_catch_a_flipped_bit(tmp_path):
    path = str(tmp_path / "m.pt")
    ckptio.save(_state_dict(), path, format="torch")
    with ckptio.open(path) as f:
        report = f.verify()
        offset = f.info("b").offset
    assert report["crc_checked"] == report["records"] and report["crc_absent"] == 0
    _flip_byte(path, offset + 100)
    with ckptio.open(path) as f:
        with pytest.raises(ckptio.CkptioError) as info:
            f.verify()
    assert info.value.status_name == "E_CHECKSUM"


@requires_cuda
def test_gpu_safetensors_checksums_are_computed_on_the_way_out(tmp_path):
    path = str(tmp_path / "g.safetensors")
    ckptio.save(_state_dict("cuda"), path, checksums=True)
    _check_manifest_and_damage(path)


@requires_cuda
def test_gpu_torch_save_has_real_crcs(tmp_path):
    path = str(tmp_path / "g.pt")
    sd = _state_dict("cuda")
    ckptio.save(sd, path, format="torch")
    with ckptio.open(path) as f:
        report = f.verify()
    assert report["crc_checked"] == report["records"] and report["crc_absent"] == 0
    loaded = torch.load(path, map_location="cuda", weights_only=True)
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)
