"""Checksums of ckptio.dcp items: one XXH3-64 per item, or hashed parts
(4 MiB blocks) for items saved from GPU memory (computed on the staging
copies), for torch.save items of at least two blocks of host tensors
(computed by the worker that writes each block) and for multi-block
SAFETENSORS tensors. Every part is checked by ckptio.dcp.verify; a flipped
byte in any part is named."""
import glob
import json
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

BLOCK = 4 << 20
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def big_state(device="cpu"):
    g = torch.Generator().manual_seed(5)
    return {
        "big": torch.randn(9 * BLOCK // 4 + 3, generator=g).to(device),  # 9 full blocks and 12 bytes
        "small": torch.randn(100, generator=g).to(device),
        "step": 7,
    }


def manifest_of(path):
    (name,) = glob.glob(os.path.join(path, ".ckptio-manifest-*.json"))
    with open(name) as f:
        return json.load(f)


def flip(path, item, rel):
    with open(os.path.join(path, item["file"]), "r+b") as f:
        f.seek(item["data_offset"] + rel)
        b = f.read(1)
        f.seek(item["data_offset"] + rel)
        f.write(bytes([b[0] ^ 0x10]))


def check_parts(path, fqn):
    doc = manifest_of(path)
    (item,) = [i for i in doc["items"] if i["fqn"] == fqn]
    assert item["xxh3"] is None and item["parts"], item
    ends = 0
    for off, n, h in item["parts"]:
        assert off == ends and 0 < n <= BLOCK and len(h) == 16
        ends += n
    assert ends == item["nbytes"]
    return item


def roundtrip_and_flip(path, sd, fmt, fqn):
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path, serialization_format=fmt))
    item = check_parts(path, fqn)
    rep = cdcp.verify(path)
    assert rep["unhashed"] == 0 and rep["checked"] == rep["items"]
    # Damage the middle of the last (short) part: the error names the item and the part's offset.
    off, n, _ = item["parts"][-1]
    flip(path, item, off + n // 2)
    with pytest.raises(ckptio.CkptioError) as e:
        cdcp.verify(path)
    assert e.value.status_name == "E_CHECKSUM"
    assert fqn in str(e.value) and str(item["data_offset"] + off) in str(e.value)


def test_safetensors_format_items_are_hashed_in_parts(tmp_path):
    """SAFETENSORS blobs: the per-block hashes of the blob's manifest become
    the items' parts (host memory here; GPU memory the same way)."""
    path = str(tmp_path / "ck")
    sd = big_state()
    roundtrip_and_flip(path, sd, SerializationFormat.SAFETENSORS, "big")
    # The per-blob manifest was consumed, not left beside the data file.
    assert not glob.glob(os.path.join(path, "*.distcp.ckptio-manifest.json"))
    doc = manifest_of(path)
    (small,) = [i for i in doc["items"] if i["fqn"] == "small"]
    assert small["xxh3"] is not None and "parts" not in small


def test_host_torch_save_items_are_hashed_as_they_are_written(tmp_path):
    """A host tensor of two blocks or more is hashed in parts while it is written; smaller items (and byte
    items) keep one hash."""
    path = str(tmp_path / "ck")
    roundtrip_and_flip(path, big_state(), SerializationFormat.TORCH_SAVE, "big")
    doc = manifest_of(path)
    assert all(i["xxh3"] is not None and "parts" not in i for i in doc["items"] if i["fqn"] != "big")
    out = {"big": torch.zeros(9 * BLOCK // 4 + 3), "small": torch.zeros(100), "step": 0}
    path2 = str(tmp_path / "ck2")
    dcp.save(big_state(), storage_writer=cdcp.FileSystemWriter(path2))
    dcp.load(out, storage_reader=cdcp.FileSystemReader(path2))
    want = big_state()
    assert torch.equal(out["big"], want["big"]) and torch.equal(out["small"], want["small"]) and out["step"] == 7


def test_verify_refuses_parts_that_do_not_tile(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save(big_state(), storage_writer=cdcp.FileSystemWriter(path, serialization_format=SerializationFormat.SAFETENSORS))
    (name,) = glob.glob(os.path.join(path, ".ckptio-manifest-*.json"))
    doc = manifest_of(path)
    (item,) = [i for i in doc["items"] if i["fqn"] == "big"]
    item["parts"] = item["parts"][1:]
    with open(name, "w") as f:
        json.dump(doc, f)
    with pytest.raises(ckptio.CkptioError) as e:
        cdcp.verify(path)
    assert e.value.status_name == "E_FORMAT" and '"parts"[0]' in str(e.value) and "does not continue" in str(e.value)


@cuda
@pytest.mark.parametrize("fmt", [SerializationFormat.TORCH_SAVE, SerializationFormat.SAFETENSORS])
def test_gpu_items_are_hashed_on_the_staging_copies(tmp_path, fmt):
    path = str(tmp_path / "ck")
    sd = big_state("cuda")
    roundtrip_and_flip(path, sd, fmt, "big")


@cuda
def test_gpu_items_load_back_exactly(tmp_path):
    path = str(tmp_path / "ck")
    sd = big_state("cuda")
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path))
    out = {"big": torch.zeros_like(sd["big"]), "small": torch.zeros_like(sd["small"]), "step": 0}
    dcp.load(out, storage_reader=cdcp.FileSystemReader(path))
    assert torch.equal(out["big"], sd["big"]) and torch.equal(out["small"], sd["small"]) and out["step"] == 7
    assert cdcp.verify(path)["unhashed"] == 0


def test_verify_batches_cross_the_window(tmp_path):
    """verify reads what it hashes in batches of at most 64 MiB of a file (one engine plan each, each
    batch mirroring its own window of the file): a checkpoint of 72 MiB takes at least two. It verifies
    clean, and a byte flipped right past the first window, or the data's last byte, is reported with
    the file, the item, the part and the part's offset: each batch reads and hashes its own ranges."""
    path = str(tmp_path / "ck")
    g = torch.Generator().manual_seed(8)
    sd = {f"t{i}": torch.randn(2 * BLOCK // 4 + 3 + i, generator=g) for i in range(9)}
    sd.update({f"s{i}": torch.randn(50 + i, generator=g) for i in range(3)})
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path))
    doc = manifest_of(path)
    (data_file,) = {i["file"] for i in doc["items"]}
    ranges = []  # (file offset, bytes, item, part): what verify hashes
    for it in doc["items"]:
        for k, (off, n, _) in enumerate(it.get("parts") or []):
            ranges.append((it["data_offset"] + off, n, it, k))
        if not it.get("parts"):
            ranges.append((it["data_offset"], it["nbytes"], it, None))
    lo = min(r[0] for r in ranges)
    end = max(r[0] + r[1] for r in ranges)
    assert end - lo > (64 << 20) + BLOCK, end - lo  # more than one window
    rep = cdcp.verify(path)
    assert rep["checked"] == rep["items"] == len(sd) and rep["bytes"] == sum(r[1] for r in ranges), rep
    for at in (lo + (64 << 20), end - 1):  # the first byte no first batch holds; the last byte
        (at_range,) = [r for r in ranges if r[0] <= at < r[0] + r[1]]
        start, n, it, part = at_range
        flip(path, it, at - it["data_offset"])
        with pytest.raises(ckptio.CkptioError) as e:
            cdcp.verify(path)
        msg = str(e.value)
        assert e.value.status_name == "E_CHECKSUM" and data_file in msg and f"item '{it['fqn']}'" in msg, msg
        where = f"part {part} ({n} bytes at offset {start})" if part is not None else f"({n} bytes at offset {start})"
        assert where in msg, (where, msg)
        flip(path, it, at - it["data_offset"])  # back
    assert cdcp.verify(path)["checked"] == len(sd)


def test_verify_batches_keep_the_manifests_order(tmp_path):
    """verify reads the ranges it hashes in batches (a window of the file per engine plan); whatever order
    the manifest lists them in (here reversed, so that every range lies before the last: one batch each),
    and with an item hashed whole as well as in parts, each is checked and the first mismatch in the
    manifest's order is the one reported."""
    from ckptio import _ckptio

    path = str(tmp_path / "ck")
    g = torch.Generator().manual_seed(6)
    sd = {"big": torch.randn(2 * BLOCK // 4 + 5, generator=g), "step": 7,
          **{f"t{i}": torch.randn(100 + i, generator=g) for i in range(6)}}
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path))
    (name,) = glob.glob(os.path.join(path, ".ckptio-manifest-*.json"))
    doc = manifest_of(path)
    doc["items"].reverse()
    (big,) = [i for i in doc["items"] if i["fqn"] == "big"]
    with open(os.path.join(path, big["file"]), "rb") as f:
        f.seek(big["data_offset"])
        raw = torch.frombuffer(bytearray(f.read(big["nbytes"])), dtype=torch.uint8)
    big["xxh3"] = "%016x" % _ckptio.hash_xxh3(raw.data_ptr(), raw.numel())
    with open(name, "w") as f:
        json.dump(doc, f)
    rep = cdcp.verify(path)
    assert rep["checked"] == rep["items"] == 8 and rep["bytes"] == sum(
        i["nbytes"] for i in doc["items"]) + big["nbytes"], rep
    # Two damaged items: the one the manifest lists first is named.
    items = {i["fqn"]: i for i in doc["items"]}
    first = next(i["fqn"] for i in doc["items"] if i["fqn"] in ("t1", "t4"))
    flip(path, items["t1"], items["t1"]["nbytes"] - 10)
    flip(path, items["t4"], items["t4"]["nbytes"] - 10)
    with pytest.raises(ckptio.CkptioError) as e:
        cdcp.verify(path)
    assert e.value.status_name == "E_CHECKSUM" and f"item '{first}'" in str(e.value), str(e.value)
