"""Byte items (torch.save of a state dict's non-tensor values) under one rule:
whatever ``ckptio verify`` passes the reader loads, whatever the reader
refuses verify refuses with the same error (file, offset, item, cause); and
shared references cost what the pickle holds, not what they expand to
(docs/RELIABILITY.md, "Byte items")."""
import collections
import io
import os
import pickle
import subprocess

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: E402
from torch.distributed.checkpoint.planner import WriteItemType  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from conftest import CKPTIO_CLI, requires_cli  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


class Crafted:
    """A value pickled as the given reduce tuple: what another pickler, or a
    hand-made file, could hold."""

    def __init__(self, reduce):
        self.reduce = reduce


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        return obj.reduce if isinstance(obj, Crafted) else NotImplemented


class _PickleModule:
    """torch.save(pickle_module=...) with the pickler above."""

    __name__ = "pickle"
    Pickler = _Pickler
    Unpickler = pickle.Unpickler


class _CraftingPlanner(DefaultSavePlanner):
    """torch's planner, its byte items pickled by _Pickler (torch.save as the planner calls it)."""

    def transform_object(self, write_item, obj):
        if write_item.type == WriteItemType.BYTE_IO:
            buf = io.BytesIO()
            torch.save(obj, buf, pickle_module=_PickleModule)
            buf.seek(0)
            return buf
        return super().transform_object(write_item, obj)


def save_crafted(path, value):
    """A DCP checkpoint written by torch's own writer, holding byte item 'v'."""
    dcp.save({"w": torch.arange(4.0), "v": value}, storage_writer=dcp.FileSystemWriter(path),
             planner=_CraftingPlanner(), no_dist=True)


def load_error(path):
    with pytest.raises(CheckpointException) as ei:
        dcp.load({"w": torch.zeros(4), "v": None}, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    (failure,) = ei.value.failures.values()
    return failure[0] if isinstance(failure, tuple) else failure


def int_tensor_requiring_grad():
    storage = torch.storage.TypedStorage(wrap_storage=torch.arange(2).untyped_storage(), dtype=torch.int64,
                                         _internal=True)
    return (torch._utils._rebuild_tensor_v2, (storage, 0, (2,), (1,), True, collections.OrderedDict()))


def ordered_dict(attrs):
    return (collections.OrderedDict, (), attrs, None, iter([("a", 1)]))


# Values Python or torch cannot build (or that would not behave as what was saved): verify used to pass
# them and the reader failed with a raw TypeError / RuntimeError.
UNBUILDABLE = {
    "ordered_dict_dunder": (lambda: ordered_dict({"__reduce_ex__": 1}), "E_UNSUPPORTED",
                            "OrderedDict attribute '__reduce_ex__' starts with '__'"),
    "ordered_dict_method": (lambda: ordered_dict({"items": 1}), "E_UNSUPPORTED",
                            "OrderedDict attribute 'items' would hide the method"),
    "ordered_dict_int_name": (lambda: ordered_dict({7: 1}), "E_FORMAT", "attribute name is not a str"),
    "list_key": (lambda: (collections.OrderedDict, (), None, None, iter([([1], 2)])), "E_FORMAT",
                 "a list as a dict key: unhashable"),
    "set_of_lists": (lambda: (set, ([[1]],)), "E_FORMAT", "a list as a set item: unhashable"),
    "array_key": (lambda: (collections.OrderedDict, (), None, None, iter([(np.zeros(1), 2)])), "E_FORMAT",
                  "a numpy array as a dict key"),
    "device_type": (lambda: (torch.device, ("npu", 0)), "E_FORMAT", "torch.device 'npu:0': unknown device type"),
    "device_index": (lambda: (torch.device, ("cuda", 300)), "E_FORMAT", "the index is not a number 0..127"),
    "int_requires_grad": (int_tensor_requiring_grad, "E_FORMAT", "a int64 tensor that requires grad"),
}


@pytest.mark.parametrize("case", sorted(UNBUILDABLE))
def test_verify_and_reader_refuse_alike(tmp_path, case):
    make, status, cause = UNBUILDABLE[case]
    path = tmp_path / case
    save_crafted(path, Crafted(make()))
    err = load_error(path)
    assert isinstance(err, ckptio.CkptioError), repr(err)  # not a raw TypeError from building the object
    assert err.status_name == status and cause in str(err), err
    # File, offset, item, cause: the reader's message is libckptio's, as verify words it.
    where = f"{path}/__0_0.distcp: read DCP item at offset "
    assert where in str(err) and ": v: byte item (torch.save of a non-tensor value): " in str(err), err
    if CKPTIO_CLI is None:
        return
    r = subprocess.run([CKPTIO_CLI, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout
    core = str(err).split("; FileSystemReader(")[0]  # the reader adds how to opt out
    assert core in r.stderr, (core, r.stderr)


def test_ordered_dict_attributes_torch_sets_still_load(tmp_path):
    """The control: module state dicts carry _metadata, set by BUILD."""
    sd = collections.OrderedDict(step=3, lr=0.1)
    sd._metadata = torch.nn.Linear(2, 2).state_dict()._metadata
    path = tmp_path / "c"
    dcp.save({"w": torch.arange(4.0), "v": (sd,)}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    got = {"w": torch.zeros(4), "v": None}
    dcp.load(got, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    (od,) = got["v"]
    assert type(od) is collections.OrderedDict and od == sd and od._metadata == sd._metadata
    if CKPTIO_CLI:
        r = subprocess.run([CKPTIO_CLI, "verify", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr


def test_numpy_values_outside_the_plain_dtypes_are_refused_alike(tmp_path):
    value = {"names": np.array(["a", "bc"]), "objects": np.array([None, 1], dtype=object)}
    path = tmp_path / "c"
    dcp.save({"w": torch.arange(4.0), "v": value}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    with pytest.raises(CheckpointException) as ei:
        dcp.load({"w": torch.zeros(4), "v": {"names": None, "objects": None}},
                 storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    assert "numpy dtype 'U2': only bool, int, uint, float and complex numpy values load" in str(ei.value)
    # ckptio's writer refuses them when they are saved, naming each key.
    with pytest.raises(CheckpointException) as ei:
        dcp.save({"w": torch.arange(4.0), "v": value}, storage_writer=cdcp.FileSystemWriter(tmp_path / "d"),
                 no_dist=True)
    assert "cannot save 'v.names' (numpy.ndarray)" in str(ei.value) and "numpy dtype 'U2'" in str(ei.value)


# ---- shared references: linear in the pickle ----------------------------------------------------


def shared_levels(n):
    """L[i+1] = [L[i], L[i], {'k': L[i]}]: a few hundred bytes pickled, 3^n paths expanded."""
    level = []
    for _ in range(n):
        level = [level, level, {"k": level}]
    return level


def test_shared_reference_byte_item_loads_and_verifies(tmp_path):
    """torch loads such an item at once; so do ckptio's reader and verify
    (they used to walk every path, 8-41 s, and then refuse it)."""
    value = (shared_levels(40),)  # in a tuple: DCP's own traversal of the state dict stops there
    path = tmp_path / "c"
    dcp.save({"w": torch.arange(4.0), "v": value}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    assert os.path.getsize(path / "__0_0.distcp") < 64 << 10
    got = {"w": torch.zeros(4), "v": None}
    dcp.load(got, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    (top,) = got["v"]
    assert top[0] is top[1] is top[2]["k"]  # shared references stay shared
    depth = 0
    while top:
        top, depth = top[0], depth + 1
    assert depth == 40
    if CKPTIO_CLI:
        r = subprocess.run([CKPTIO_CLI, "verify", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr


def test_tensor_named_along_exponentially_many_paths_is_refused_by_a_limit_on_the_graph():
    t = torch.ones(2)
    level = [t]
    for _ in range(30):
        level = [level, level]
    buf = io.BytesIO()
    torch.save(level, buf)
    with pytest.raises(ckptio.CkptioError) as ei:
        ckptio.load(buf.getvalue())
    assert ei.value.status_name == "E_RANGE"
    assert "name its 1 tensor references along more than 4194304 paths (at most 16 per reference" in str(ei.value)
    # Sharing a few times, as state dicts do (tied weights), is fine.
    buf = io.BytesIO()
    torch.save({"a": t, "b": t, "layers": [t] * 3}, buf)
    got = ckptio.load(buf.getvalue())
    assert got["a"] is got["b"] and len(got["layers"]) == 3


@requires_cli
def test_convert_counts_shared_values_once(tmp_path):
    level = ["leaf"]
    for _ in range(40):
        level = [level, level, {"k": level}]
    src, out = tmp_path / "x.pt", tmp_path / "x.safetensors"
    torch.save({"w": torch.arange(3.0), "v": level}, src)
    r = subprocess.run([CKPTIO_CLI, "convert", str(src), str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "1 non-tensor value (numbers, strings, _metadata, ...) cannot be stored in safetensors" in r.stderr, r.stderr
    assert torch.equal(ckptio.load(out)["w"], torch.arange(3.0))


@requires_cli
def test_metadata_objects_the_reader_refuses_verify_refuses(tmp_path):
    """The same rule for .metadata: an object graph the reader does not build
    (a dict with attributes) is refused by verify with the same cause."""
    path = tmp_path / "c"
    dcp.save({"w": torch.ones(2)}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    md.planner_data = collections.OrderedDict(a=1)
    md.planner_data._x = 1
    with open(path / ".metadata", "wb") as f:
        pickle.dump(md, f)
    cause = "a dict with attributes (BUILD state) does not occur in DCP metadata"
    r = subprocess.run([CKPTIO_CLI, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"{path}/.metadata: unpickle at offset" in r.stderr and cause in r.stderr, r
    with pytest.raises(CheckpointException) as ei:
        dcp.load({"w": torch.zeros(2)}, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    assert cause in str(ei.value)
