"""torch.save zip checkpoints: ckptio writes what torch.load reads and reads
what torch.save wrote, object tree, views and shared storages included.

Reference values come from torch itself (torch.save, torch.load with
weights_only=True, FakeTensorMode offsets), never from ckptio.
"""
import collections
import os

import numpy as np
import pytest
import torch

import ckptio
from conftest import TORCH_DTYPES, random_tensor, tensor_bytes

ALL_DTYPES = [name for name, _ in TORCH_DTYPES]
SHAPES = [(), (0,), (3, 0), (5,), (4, 3), (2, 3, 2)]


def _torch_load(path, **kw):
    return torch.load(path, weights_only=True, **kw)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype_name", ALL_DTYPES)
def test_every_dtype_both_directions(tmp_path, dtype_name):
    dtype = getattr(torch, dtype_name)
    sd = {f"t{i}": random_tensor(dtype, s, seed=i) for i, s in enumerate(SHAPES)}
    mine = tmp_path / "mine.pt"
    ckptio.save(sd, mine, format="torch")
    ref = _torch_load(mine)
    assert list(ref) == list(sd)
    for k, t in sd.items():
        assert ref[k].dtype == dtype and ref[k].shape == t.shape
        assert tensor_bytes(ref[k]) == tensor_bytes(t), k
    theirs = tmp_path / "theirs.pt"
    torch.save(sd, theirs)
    got = ckptio.load(theirs)
    assert list(got) == list(sd)
    for k, t in sd.items():
        assert got[k].dtype == dtype and got[k].shape == t.shape
        assert tensor_bytes(got[k]) == tensor_bytes(t), k


def _tree():
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    return {
        "model": collections.OrderedDict(
            [("w", w), ("w_t", w.t()), ("rows", w[2:5]), ("cols", w[:, 1::2]), ("b", torch.arange(4.0))]
        ),
        "param": torch.nn.Parameter(torch.ones(3)),
        "frozen": torch.nn.Parameter(torch.zeros(2), requires_grad=False),
        "grad": torch.ones(2).requires_grad_(),
        "step": 12,
        "big": 2**70,
        "neg": -(2**65),
        "lr": 1e-3,
        "name": "run-ünïcode",
        "raw": b"\x00\x01bytes",
        "flags": [True, False, None],
        "shape": (3, (4, 5)),
        "tags": {"a", "b"},
        "dtype": torch.bfloat16,
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3, dtype=torch.int8),
    }


def _check_tree(got, want):
    assert type(got) is type(want) or (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor))
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _check_tree(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _check_tree(a, b)
    elif isinstance(want, torch.Tensor):
        assert type(got) is type(want)
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
        assert got.storage_offset() == want.storage_offset()
        assert got.requires_grad == want.requires_grad
        assert tensor_bytes(got) == tensor_bytes(want)
    else:
        assert got == want


def test_object_tree_views_and_parameters_survive_torch_load(tmp_path):
    tree = _tree()
    path = tmp_path / "tree.pt"
    ckptio.save(tree, path, format="torch")
    got = _torch_load(path)
    _check_tree(got, tree)
    m = got["model"]
    ptr = m["w"].untyped_storage().data_ptr()
    assert all(m[k].untyped_storage().data_ptr() == ptr for k in ("w_t", "rows", "cols")), "views lost sharing"


def test_object_tree_from_torch_save(tmp_path):
    tree = _tree()
    path = tmp_path / "tree.pt"
    torch.save(tree, path)
    got = ckptio.load(path)
    _check_tree(got, tree)
    m = got["model"]
    ptr = m["w"].untyped_storage().data_ptr()
    assert all(m[k].untyped_storage().data_ptr() == ptr for k in ("w_t", "rows", "cols"))


def test_module_state_dict_round_trips_with_metadata(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    path = tmp_path / "sd.pt"
    torch.save(model.state_dict(), path)
    got = ckptio.load(path)
    assert isinstance(got, collections.OrderedDict)
    assert got._metadata == model.state_dict()._metadata
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    fresh.load_state_dict(got)
    for (k, a), (_, b) in zip(fresh.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), k
    mine = tmp_path / "mine.pt"
    ckptio.save(model.state_dict(), mine, format="torch")
    fresh2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    fresh2.load_state_dict(_torch_load(mine))
    for (k, a), (_, b) in zip(fresh2.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), k


def test_storage_offsets_match_torch_fake_tensor_offsets(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    sd = {"a": torch.randn(100), "b": torch.randn(3, 3).half(), "c": torch.arange(7)}
    path = tmp_path / "off.pt"
    offsets = ckptio.save_torch(sd, path)
    assert all(off % 4096 == 0 for off, _ in offsets)
    with FakeTensorMode():
        fake = torch.load(path)
    for (off, key), name in zip(offsets, sd):
        assert fake[name].untyped_storage()._checkpoint_offset == off
    with ckptio.open(path) as f:
        assert [s.offset for s in f.storages()] == [off for off, _ in offsets]
        assert [s.key for s in f.storages()] == [key for _, key in offsets]
    # torch's own default alignment, and mmap loading of ckptio's file.
    ckptio.save(sd, path, format="torch", align=64)
    with ckptio.open(path) as f:
        assert all(s.offset % 64 == 0 for s in f.storages())
    mm = torch.load(path, mmap=True, weights_only=True)
    for k in sd:
        assert torch.equal(mm[k], sd[k])


def test_open_keys_and_selected_tensors_of_a_torch_file(tmp_path):
    tree = _tree()
    path = tmp_path / "tree.pt"
    torch.save(tree, path)
    with ckptio.open(path) as f:
        assert f.format == "torch"
        assert "model.cols" in f and "param" in f
        info = f.info("model.cols")
        assert info.contiguous is False and info.shape == (6, 2)
        assert torch.equal(f.get_tensor("model.cols"), tree["model"]["cols"])
        assert f.info("model.w").contiguous is True
        assert f.verify()["records"] >= 1
    flat = ckptio.load(path, keys=["model.w", "model.w_t"])
    assert list(flat) == ["model.w", "model.w_t"]
    assert torch.equal(flat["model.w_t"], tree["model"]["w"].t())
    arr = ckptio.load(path, keys=["model.b"], framework="numpy")
    np.testing.assert_array_equal(arr["model.b"], np.arange(4.0, dtype=np.float32))


def test_unsupported_objects_are_refused_with_their_path(tmp_path):
    path = tmp_path / "bad.pt"
    with pytest.raises(TypeError, match=r"torch\.device.*'opt\.dev'"):
        ckptio.save({"opt": {"dev": torch.device("cpu")}}, path, format="torch")

    class Custom:
        pass

    with pytest.raises(TypeError, match=r"Custom.*'x\.1'"):
        ckptio.save({"x": [1, Custom()]}, path, format="torch")
    assert not path.exists()
    with pytest.raises(ValueError, match="metadata"):
        ckptio.save({"a": torch.ones(1)}, path, format="torch", metadata={"k": "v"})


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def test_disallowed_globals_are_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"x": _Evil()}, path)
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load(path)
    assert info.value.status_name == "E_DISALLOWED"
    assert "system" in str(info.value) and str(path) in str(info.value)


def test_damaged_zip_files(tmp_path):
    path = tmp_path / "m.pt"
    torch.save({"w": torch.arange(5000, dtype=torch.float32)}, path)
    data = bytearray(path.read_bytes())
    trunc = tmp_path / "trunc.pt"
    trunc.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load(trunc)
    assert str(trunc) in str(info.value)
    # Flip one data byte: the CRC no longer matches.
    with ckptio.open(path) as f:
        off = f.storages()[0].offset
    data[off + 10] ^= 0xFF
    flipped = tmp_path / "flipped.pt"
    flipped.write_bytes(bytes(data))
    with ckptio.open(flipped) as f:
        with pytest.raises(ckptio.CkptioError) as info:
            f.verify()
    assert info.value.status_name == "E_CHECKSUM"


def test_gds_tutorial_flow_with_ckptio_offsets(tmp_path):
    """The tutorial's flow with ckptio only: offsets from ckptio.open instead
    of FakeTensorMode, bytes moved by ckptio.GdsFile."""
    path = str(tmp_path / "checkpoint.pt")
    sd = torch.nn.Linear(5, 10).state_dict()
    with torch.serialization.skip_data():
        torch.save(sd, path)
    with ckptio.open(path) as f:
        where = {name: f.info(name).offset for name in f.keys()}
    g = ckptio.GdsFile(path, os.O_RDWR)
    for k, v in sd.items():
        g.save_storage(v.untyped_storage(), where[k])
    loaded = _torch_load(path)
    for k in sd:
        assert torch.equal(loaded[k], sd[k])
    del g
