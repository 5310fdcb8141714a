"""torch.save interoperability of the `ckptio` CLI (inspect --json, verify, convert).

Files written by torch.save (alignments 64 and 4096, many dtypes, a real
nn.Module state dict, nested dicts with non-tensor values, shared storages)
must be read by ckptio with identical bytes; files ckptio writes must load in
torch.load with weights_only=True and False. Hostile archives must be refused
with a message naming the cause. Reference values come from torch,
safetensors and zipfile, never from ckptio itself.
"""
import collections
import io
import json
import os
import pickle
import subprocess
import zipfile

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

from conftest import CKPTIO_CLI, requires_cli  # noqa: E402


CKPTIO = CKPTIO_CLI
pytestmark = requires_cli


def run(*args):
    return subprocess.run([CKPTIO, *map(str, args)], capture_output=True, text=True, timeout=300)


def inspect(path):
    r = run("inspect", "--json", path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def torch_save(obj, path, alignment=64):
    from torch.utils.serialization import config

    old = config.save.storage_alignment
    config.save.storage_alignment = alignment
    try:
        torch.save(obj, path)
    finally:
        config.save.storage_alignment = old


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.uint16, torch.uint32, torch.uint64]


def sample(dtype, shape=(3, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(torch.tensor(shape).prod()) * torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool().view(shape)
    return raw.view(dtype).view(shape)


def raw_bytes(t):
    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()) if t.dtype != torch.bool else \
        bytes(t.contiguous().view(-1).to(torch.uint8).numpy().tobytes())


def file_bytes(path, offset, n):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


@pytest.mark.parametrize("alignment", [64, 4096])
def test_reads_torch_save_bytes_at_offsets(tmp_path, alignment):
    sd = {f"t_{str(d).split('.')[1]}": sample(d, seed=i) for i, d in enumerate(DTYPES)}
    path = tmp_path / "m.pt"
    torch_save(sd, path, alignment)
    doc = inspect(path)
    assert doc["format"] == "torch.save" and doc["storage_alignment"] == alignment
    listed = {t["name"]: t for t in doc["tensors"]}
    assert set(listed) == set(sd)
    offsets = {info.filename: info for info in zipfile.ZipFile(path).infolist()}
    for name, t in sd.items():
        entry = listed[name]
        assert entry["torch_dtype"] == str(t.dtype).split(".")[1]
        assert entry["shape"] == list(t.shape) and entry["stride"] == list(t.stride())
        assert entry["offset"] % alignment == 0
        assert file_bytes(path, entry["offset"], entry["nbytes"]) == raw_bytes(t), name
        assert f"m/data/{entry['storage']}" in offsets
    r = run("verify", path)
    assert r.returncode == 0, r.stderr
    assert f"{len(offsets)} records, {len(offsets)} CRC-32 matched" in r.stdout


def test_module_state_dict_to_safetensors(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    model.register_buffer("steps", torch.tensor(7))
    sd = model.state_dict()
    path, out = tmp_path / "model.pt", tmp_path / "model.safetensors"
    torch_save(sd, path, 4096)
    r = run("convert", path, out)
    assert r.returncode == 0, r.stderr
    assert "_metadata" not in r.stdout
    assert "non-tensor value" in r.stderr  # the module's _metadata attribute
    got = load_file(out)
    assert set(got) == set(sd)
    for k, v in sd.items():
        assert torch.equal(got[k], v), k


def test_nested_values_views_and_sharing(tmp_path):
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    shared = torch.randn(5)
    obj = {
        "model": {"w": base, "wt": base.t(), "row": base[2], "col": base[:, 1]},
        "tied_a": shared,
        "tied_b": shared,  # the same object: one memo entry in the pickle
        "opt": {"step": 10, "lr": 1e-3, "betas": (0.9, 0.999), "name": "adam", "flags": [True, None],
                "big": 2**80, "blob": b"\x00\x01\xfe", "dt": torch.bfloat16},
        "param": torch.nn.Parameter(torch.ones(3)),
    }
    path, out = tmp_path / "nested.pt", tmp_path / "nested.safetensors"
    torch_save(obj, path)
    doc = inspect(path)
    t = {x["name"]: x for x in doc["tensors"]}
    assert set(t) == {"model.w", "model.wt", "model.row", "model.col", "tied_a", "tied_b", "param"}
    assert len({t[n]["storage"] for n in ("model.w", "model.wt", "model.row", "model.col")}) == 1
    assert t["model.wt"]["stride"] == [1, 6] and not t["model.wt"]["contiguous"]
    assert t["model.row"]["storage_offset"] == 12 and t["model.col"]["stride"] == [6]
    assert t["tied_a"]["storage"] == t["tied_b"]["storage"]
    assert t["param"]["parameter"] and t["param"]["requires_grad"]
    r = run("convert", path, out)
    assert r.returncode == 0, r.stderr
    assert "share a storage" in r.stderr
    got = load_file(out)
    assert torch.equal(got["model.wt"], base.t().contiguous())
    assert torch.equal(got["model.col"], base[:, 1].contiguous())
    assert torch.equal(got["tied_b"], shared) and torch.equal(got["param"], obj["param"].detach())


def test_ckptio_files_load_in_torch(tmp_path):
    tensors = {f"layer.{i}.{str(d).split('.')[1]}": sample(d, (4, 8), seed=i) for i, d in enumerate(DTYPES)}
    src, pt = tmp_path / "in.safetensors", tmp_path / "out.pt"
    save_file(tensors, src)
    r = run("convert", "--alignment", "4096", src, pt)
    assert r.returncode == 0, r.stderr
    for weights_only in (True, False):
        got = torch.load(pt, weights_only=weights_only)
        assert isinstance(got, collections.OrderedDict) and list(got) == sorted(got, key=list(got).index)
        assert set(got) == set(tensors)
        for k, v in tensors.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
    with zipfile.ZipFile(pt) as z:
        assert z.testzip() is None  # real CRC-32s
        names = z.namelist()
        assert names[:4] == ["out/data.pkl", "out/.format_version", "out/.storage_alignment", "out/byteorder"]
        assert names[-2:] == ["out/version", "out/.data/serialization_id"]
        assert z.read("out/.storage_alignment") == b"4096"
    doc = inspect(pt)
    assert all(t["offset"] % 4096 == 0 for t in doc["tensors"])
    # torch's own offset prediction (calculate_storage_offsets) agrees with the layout
    from torch.utils.serialization import config

    config.load.calculate_storage_offsets = True
    try:
        again = torch.load(pt, mmap=True, weights_only=True)
    finally:
        config.load.calculate_storage_offsets = False
    assert all(torch.equal(again[k].view(torch.uint8), v.view(torch.uint8)) for k, v in tensors.items())


def test_round_trip_through_convert(tmp_path):
    sd = {"a": torch.randn(64, 32), "b": torch.arange(10, dtype=torch.int64), "c": torch.randn(3).half()}
    p1, s1, p2 = tmp_path / "a.pt", tmp_path / "a.safetensors", tmp_path / "b.pt"
    torch_save(sd, p1)
    assert run("convert", p1, s1).returncode == 0
    assert run("convert", s1, p2).returncode == 0
    got = torch.load(p2, weights_only=True)
    assert all(torch.equal(got[k], v) for k, v in sd.items())
    assert run("verify", p2).returncode == 0


def _archive(path, pickle_bytes, records=None, prefix="archive"):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pickle_bytes)
        z.writestr(f"{prefix}/version", "3\n")
        for name, data in (records or {}).items():
            z.writestr(f"{prefix}/{name}", data)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_hostile_files_are_refused(tmp_path):
    evil = tmp_path / "evil.pt"
    _archive(evil, pickle.dumps({"x": _Evil()}, protocol=2))
    r = run("inspect", evil)
    assert r.returncode == 1 and "global 'posix.system' is not in the allowlist" in r.stderr
    assert "pwned" not in r.stdout

    legacy = tmp_path / "legacy.pt"
    torch.save({"a": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    r = run("inspect", legacy)
    assert r.returncode == 1 and "legacy torch.save format" in r.stderr

    script = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), script)
    r = run("inspect", script)
    assert r.returncode == 1 and "TorchScript" in r.stderr

    good = tmp_path / "good.pt"
    torch_save({"a": torch.arange(1000, dtype=torch.float32)}, good)
    data = bytearray(good.read_bytes())
    info = zipfile.ZipFile(good).getinfo("good/data/0")
    h = info.header_offset  # local header: its extra (the alignment padding) differs from the central one
    start = h + 30 + int.from_bytes(data[h + 26:h + 28], "little") + int.from_bytes(data[h + 28:h + 30], "little") + 64
    data[start] ^= 0xFF
    bad = tmp_path / "crc.pt"
    bad.write_bytes(bytes(data))
    r = run("verify", bad)
    assert r.returncode == 1 and "CRC-32" in r.stderr and "good/data/0" in r.stderr

    trunc = tmp_path / "trunc.pt"
    trunc.write_bytes(good.read_bytes()[:-40])
    r = run("verify", trunc)
    assert r.returncode == 1 and "end-of-central-directory" in r.stderr

    # A pickle that declares a storage bigger than its record.
    buf = io.BytesIO()
    torch.save({"a": torch.ones(4)}, buf)
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    pk = z.read("archive/data.pkl").replace(b"cpuq\x06K\x04", b"cpuq\x06K\x40")
    assert pk != z.read("archive/data.pkl")
    lie = tmp_path / "lie.pt"
    _archive(lie, pk, {"data/0": z.read("archive/data/0"), "byteorder": "little"})
    r = run("inspect", lie)
    assert r.returncode == 1 and "holds 16 bytes but the pickle declares 256" in r.stderr


def test_empty_view_past_its_storage(tmp_path):
    """torch lets a zero-element view sit at a storage offset past its
    storage's end (found by fuzz_zip in a 2.5-hour run): ckptio loads it as an
    empty tensor instead of failing to read 0 bytes past the end of the file."""
    import ckptio

    base = torch.arange(16, dtype=torch.uint8)
    view = base.as_strided((91, 0), (0, 1), 255)
    path = tmp_path / "empty_view.pt"
    torch.save({"e": view, "t": base}, path)
    got = ckptio.load(path)
    assert got["e"].shape == (91, 0) and got["e"].dtype == torch.uint8
    assert torch.equal(got["t"], base)
    with ckptio.open(path) as f:
        assert f.get_tensor("e").shape == (91, 0)
