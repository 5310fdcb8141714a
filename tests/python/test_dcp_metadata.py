"""ckptio.dcp._metadata: DCP .metadata read by libckptio's restricted
unpickler (no code from the file runs) equals what pickle.load gives, field
by field, for files written by torch's stock writer (TORCH_SAVE,
SAFETENSORS, DTensor shards on two ranks) and by ckptio's writer; hostile
files are refused with CkptioError naming the global, and run nothing.
"""
import dataclasses
import os
import pickle
import re
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageInfo  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from ckptio.dcp._metadata import load_metadata, metadata_from_bytes  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ckptio.__file__)))


def make_state(contiguous=False):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(4, 6, generator=g).t()  # non-contiguous: TensorProperties.strides (1, 6)
    return {"w": torch.randn(8, 6, generator=g), "b": torch.randn(5, generator=g).to(torch.bfloat16),
            "t": t.contiguous() if contiguous else t, "i": torch.arange(6, dtype=torch.int64),
            "e": torch.zeros(0, 3), "step": 7, "opt": {"lr": 0.5, "names": ["a"], "m": torch.ones(2, 2)}}


def save(sd, writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=True)


def same(got, want, where="metadata"):
    """Deep equality that also insists on identical types (torch.Size, not
    tuple; OrderedDict, not dict) and identical instance __dict__ keys."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if dataclasses.is_dataclass(want):
        assert list(got.__dict__) == list(want.__dict__), f"{where}: fields {list(got.__dict__)} != {list(want.__dict__)}"
        for k in want.__dict__:
            same(got.__dict__[k], want.__dict__[k], f"{where}.{k}")
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys differ"
        for (gk, gv), (wk, wv) in zip(got.items(), want.items()):
            same(gk, wk, f"{where} key {wk!r}")
            same(gv, wv, f"{where}[{wk!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def check_against_pickle(path):
    md_path = os.path.join(path, ".metadata")
    with open(md_path, "rb") as f:
        want = pickle.load(f)
    got = load_metadata(md_path)
    same(got, want)
    assert got == want
    # Python's protocol 2 (no FRAME/MEMOIZE/STACK_GLOBAL) reads the same.
    same(metadata_from_bytes(pickle.dumps(want, protocol=2)), want)
    return got


@pytest.mark.parametrize("fmt", [SerializationFormat.TORCH_SAVE, SerializationFormat.SAFETENSORS])
@pytest.mark.parametrize("writer", ["torch", "ckptio"])
def test_metadata_equals_pickle_load(tmp_path, fmt, writer):
    cls = dcp.FileSystemWriter if writer == "torch" else cdcp.FileSystemWriter
    # torch's SAFETENSORS writer refuses non-contiguous tensors.
    save(make_state(contiguous=fmt == SerializationFormat.SAFETENSORS), cls(tmp_path / "c", serialization_format=fmt))
    md = check_against_pickle(tmp_path / "c")
    props = md.state_dict_metadata["t"].properties
    assert props.dtype == torch.float32 and props.layout == torch.strided
    assert type(md.state_dict_metadata["w"].size) is torch.Size
    # The reader's read_metadata goes the same way and sets load_id as torch's does.
    reader = cdcp.FileSystemReader(tmp_path / "c")
    reader.reset()
    got = reader.read_metadata()
    assert got.storage_meta.load_id == reader.load_id
    assert got.state_dict_metadata == md.state_dict_metadata and got.storage_data == md.storage_data


WORKER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    rank, world, path, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    W = torch.arange(64 * 10, dtype=torch.float32).reshape(64, 10)
    sd = {"W": distribute_tensor(W, mesh, [Shard(0)]), "E": distribute_tensor(W.t().contiguous(), mesh, [Shard(1)]),
          "step": 3}
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
    dist.barrier()
    dist.destroy_process_group()
    print("OK", rank, flush=True)
    os._exit(0)  # torch's gloo may abort in interpreter teardown after a clean run
    """
)


def test_sharded_dtensor_metadata(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    path = tmp_path / "sharded"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", str(path), str(tmp_path / "store")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {r}" in out, out[-3000:]
    md = check_against_pickle(path)
    chunks = md.state_dict_metadata["W"].chunks
    assert [tuple(c.offsets) for c in chunks] == [(0, 0), (32, 0)] and all(type(c.sizes) is torch.Size for c in chunks)
    assert {idx.offset for idx in md.storage_data if idx.fqn == "E"} == {torch.Size([0, 0]), torch.Size([0, 32])}


class _Payload:
    """Pickles as a REDUCE of `fn(*args)`: what a hostile .metadata does."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def hostile_dir(tmp_path, payload, name="evil"):
    d = tmp_path / name
    d.mkdir()
    # Inside a real-looking Metadata, as an attacker would hide it.
    from torch.distributed.checkpoint.metadata import Metadata

    md = Metadata(state_dict_metadata={}, planner_data=payload)
    (d / ".metadata").write_bytes(pickle.dumps(md, protocol=4))
    return d


@pytest.mark.parametrize("how", ["os.system", "builtins.exec", "builtins.open"])
def test_hostile_metadata_is_refused_and_runs_nothing(tmp_path, how):
    marker = tmp_path / "PWNED"
    if how == "os.system":
        # pickle names os.system by its defining module: posix.system on Linux.
        payload, global_name = _Payload(os.system, f"touch {marker}"), f"{os.system.__module__}.system"
    elif how == "builtins.exec":
        payload, global_name = _Payload(exec, f"open({str(marker)!r}, 'w').close()"), "builtins.exec"
    else:
        # "io.open" on Python 3.11, "_io.open" on 3.12: pickle uses __module__.
        payload, global_name = _Payload(open, str(marker), "w"), f"{open.__module__}.open"
    d = hostile_dir(tmp_path, payload)
    for load in (lambda: cdcp.FileSystemReader(d).read_metadata(), lambda: cdcp.verify(d),
                 lambda: load_metadata(d / ".metadata")):
        with pytest.raises(ckptio.CkptioError) as ei:
            load()
        assert ei.value.status_name == "E_DISALLOWED", ei.value
        assert f"global '{global_name}'" in str(ei.value) and ".metadata" in str(ei.value)
        assert not marker.exists()
    # The payload is live: torch's own reader (pickle.load) runs it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.FileSystemReader(d).read_metadata()
    assert marker.exists()


def test_the_collector_is_paused_while_reading_and_left_as_it_was(tmp_path, monkeypatch):
    """metadata_from_bytes pauses Python's cyclic collector (a large .metadata builds millions of containers)
    and gives it back as it found it, after an error too."""
    import gc

    save({"w": torch.ones(3)}, dcp.FileSystemWriter(tmp_path / "c"))
    data = (tmp_path / "c" / ".metadata").read_bytes()
    from ckptio.dcp import _metadata

    seen = []
    real = _metadata._other

    def other(cls_name, args, state):  # called from inside the C build, for TensorProperties and its parts
        seen.append(gc.isenabled())
        return real(cls_name, args, state)

    monkeypatch.setattr(_metadata, "_other", other)
    was = gc.isenabled()
    try:
        gc.enable()
        metadata_from_bytes(data, "ok/.metadata")
        assert seen and not any(seen) and gc.isenabled()
        with pytest.raises(ckptio.CkptioError):
            metadata_from_bytes(data[:-1], "cut/.metadata")
        assert gc.isenabled()
        with pytest.raises(ckptio.CkptioError):
            metadata_from_bytes(pickle.dumps({"state_dict_metadata": {}}), "d/.metadata")
        assert gc.isenabled()
        gc.disable()
        metadata_from_bytes(data, "ok/.metadata")
        assert not gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


def test_malformed_metadata(tmp_path):
    save({"w": torch.ones(3)}, dcp.FileSystemWriter(tmp_path / "c"))
    data = (tmp_path / "c" / ".metadata").read_bytes()
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(data[:-1], "cut/.metadata")
    assert ei.value.status_name == "E_TRUNCATED" and "cut/.metadata" in str(ei.value)
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(pickle.dumps({"state_dict_metadata": {}}), "d/.metadata")
    assert ei.value.status_name == "E_FORMAT" and "not a Metadata" in str(ei.value)
    # Allowlisted classes with the wrong values are refused by the mapping.
    from torch.distributed.checkpoint.metadata import Metadata

    bad = pickle.dumps(Metadata(state_dict_metadata={"x": torch.Size([1])}))
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(bad, "e/.metadata")
    assert ei.value.status_name == "E_FORMAT" and "state_dict_metadata['x'] is a Size" in str(ei.value)
    bad = pickle.dumps(Metadata(state_dict_metadata={}, planner_data=_Payload(torch.Size, ("no",))))
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(bad, "f/.metadata")
    assert "torch.Size of" in str(ei.value)


class _Reduce:
    """Pickles as `fn(*args)`, then BUILD with `state` when given."""

    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


def _dict_with_attrs():
    import collections

    d = collections.OrderedDict(a=1)
    d.extra = 2  # pickled as BUILD state on the dict
    return d


_CSM = "torch.distributed.checkpoint.metadata.ChunkStorageMetadata"


UNPICKLER = "unpickler: "  # a message of libckptio's unpickler, with the opcode's offset


@pytest.mark.parametrize("value,message", [
    (lambda md: _Reduce(md.ChunkStorageMetadata, (1,)), _CSM + " created with arguments (1,) (pickle passes none)"),
    (lambda md: _Reduce(md.ChunkStorageMetadata, (), [1, 2]), _CSM + " state is a list, not a dict"),
    (lambda md: _Reduce(md.ChunkStorageMetadata, (), {"__class__": 1}), _CSM + " state has the field name '__class__'"),
    (lambda md: _Reduce(md.ChunkStorageMetadata, (), {"not id": 1}), _CSM + " state has the field name 'not id'"),
    (lambda md: _Reduce(md.ChunkStorageMetadata, (), {1: 2}), _CSM + " state has the field name 1"),
    (lambda md: _Reduce(torch.Size, ((1, 2),), {"a": 1}),
     UNPICKLER + "torch.Size with BUILD state (the class takes none)"),
    (lambda md: _Reduce(torch.Size, ((1, True),)), "torch.Size of ((1, True),) (want one tuple of ints)"),
    (lambda md: _Reduce(torch.Size, ((1,), (2,))), "torch.Size of ((1,), (2,)) (want one tuple of ints)"),
    (lambda md: _dict_with_attrs(), UNPICKLER + "a dict with attributes (BUILD state) does not occur in DCP metadata"),
], ids=["args", "state-list", "dunder-field", "non-identifier-field", "int-field", "size-state", "size-bool",
        "size-two-args", "dict-attrs"])
def test_object_graphs_metadata_does_not_have_are_refused(value, message):
    """Allowlisted classes built the ways a .metadata never builds them: E_FORMAT naming the file and what was
    wrong (python/src/ckpy_pickle.c builds these objects; _metadata._other the rarer ones)."""
    from torch.distributed.checkpoint import metadata as md

    data = pickle.dumps(md.Metadata(state_dict_metadata={}, planner_data=value(md)))
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(data, "bad/.metadata")
    assert ei.value.status_name == "E_FORMAT"
    if message.startswith(UNPICKLER):  # refused by the unpickler itself, as ckptio verify refuses it
        want = r"bad/\.metadata: unpickle at offset \d+: \.metadata: " + re.escape(message[len(UNPICKLER):])
        assert re.fullmatch(want, str(ei.value)), str(ei.value)
    else:
        assert str(ei.value) == f"bad/.metadata: load DCP metadata: {message}"


_SI = "torch.distributed.checkpoint.filesystem._StorageInfo"
_TSM = "torch.distributed.checkpoint.metadata.TensorStorageMetadata"


def _with_chunk(md, chunk, size=torch.Size([4, 3])):
    props = md.TensorProperties(dtype=torch.float32)
    return md.Metadata(state_dict_metadata={"w": _Reduce(md.TensorStorageMetadata, (), {
        "properties": props, "size": size, "chunks": [chunk]})})


@pytest.mark.parametrize("make,message", [
    (lambda md: md.Metadata(state_dict_metadata={}, storage_data={_Reduce(md.MetadataIndex, (), {"offset": None}): 1}),
     "torch.distributed.checkpoint.metadata.MetadataIndex lacks the field 'fqn'"),
    (lambda md: _with_chunk(md, _Reduce(md.ChunkStorageMetadata, (), {"offsets": torch.Size([0, 0])})),
     _CSM + " lacks the field 'sizes'"),
    (lambda md: _with_chunk(md, md.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 3])),
                            size="big"), _TSM + " field 'size' is a str, not a torch.Size"),
    (lambda md: _with_chunk(md, {"offsets": 1}),
     _TSM + " field 'chunks' holds a dict, not a list of ChunkStorageMetadata"),
    (lambda md: md.Metadata(state_dict_metadata={}, storage_data={
        md.MetadataIndex("w"): _Reduce(_StorageInfo, (), {"relative_path": "__0_0.distcp", "offset": 0})}),
     _SI + " lacks the field 'length'"),
    (lambda md: md.Metadata(state_dict_metadata={}, storage_data={
        md.MetadataIndex("w"): _Reduce(_StorageInfo, (), {"relative_path": 7, "offset": 0, "length": 1})}),
     _SI + " field 'relative_path' is a int, not a str"),
    (lambda md: _Reduce(md.Metadata, (), {"planner_data": None}),
     "torch.distributed.checkpoint.metadata.Metadata lacks the field 'state_dict_metadata'"),
], ids=["key-without-fqn", "chunk-without-sizes", "size-a-str", "chunks-of-dicts", "storage-without-length",
        "path-an-int", "no-state-dict-metadata"])
def test_dataclass_fields_are_checked(make, message):
    """Each dataclass's fields are there and of the right types, or E_FORMAT names the class and the field
    (before, such a file failed later, with an AttributeError or TypeError inside torch's planner)."""
    from torch.distributed.checkpoint import metadata as md

    data = pickle.dumps(make(md))
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(data, "k/.metadata")
    assert ei.value.status_name == "E_FORMAT"
    assert str(ei.value) == f"k/.metadata: load DCP metadata: {message}"


@pytest.mark.parametrize("offsets,sizes,said", [
    ([-2, 0], [4, 3], "state_dict_metadata['w']: chunk 0 spans [-2, 2) in dimension 0, outside the tensor's size 4"),
    ([0, 0], [8, 3], "state_dict_metadata['w']: chunk 0 spans [0, 8) in dimension 0, outside the tensor's size 4"),
    ([1, 0], [-1, 3], "state_dict_metadata['w']: chunk 0 spans [1, 0) in dimension 0, outside the tensor's size 4"),
    ([0], [4], "load DCP metadata: state_dict_metadata['w']: chunk 0 has 1 offsets and 1 sizes for a 2-d tensor"),
], ids=["negative-offset", "past-the-end", "negative-size", "wrong-rank"])
def test_chunks_outside_their_tensor_are_refused(tmp_path, offsets, sizes, said):
    """A tensor's chunks must lie inside it (ckptio_dcp_check_chunks). torch's planner places chunks by their
    offsets unchecked: through the reader, dcp.load put rows 2-3 of the file into rows 0-1 for a negative offset,
    without an error."""
    from torch.distributed.checkpoint import metadata as md

    save({"w": torch.arange(12.0).reshape(4, 3)}, dcp.FileSystemWriter(tmp_path / "c"))
    meta = tmp_path / "c" / ".metadata"
    m = pickle.loads(meta.read_bytes())
    info = next(iter(m.storage_data.values()))
    chunk = m.state_dict_metadata["w"].chunks[0]
    chunk.offsets, chunk.sizes = torch.Size(offsets), torch.Size(sizes)
    m.storage_data = {md.MetadataIndex("w", torch.Size(offsets)): info}
    meta.write_bytes(pickle.dumps(m))
    with pytest.raises(ckptio.CkptioError) as ei:
        cdcp.FileSystemReader(tmp_path / "c").read_metadata()
    assert ei.value.status_name == "E_FORMAT"
    assert str(ei.value) == f"{meta}: {said}"


def test_a_ranks_own_metadata_may_hold_part_of_a_tensor(tmp_path):
    """A save without collectives writes __RANK.metadata with that rank's chunks only: read through the reader
    for that rank (and by load_metadata by its name), chunks inside the tensor are enough; outside it is refused."""
    save({"w": torch.arange(12.0).reshape(4, 3)}, dcp.FileSystemWriter(tmp_path / "c"))
    meta = tmp_path / "c" / ".metadata"
    m = pickle.loads(meta.read_bytes())
    m.state_dict_metadata["w"].chunks[0].sizes = torch.Size([2, 3])  # rows 0-1: this rank's share
    data = pickle.dumps(m)
    own = tmp_path / "c" / "__0.metadata"
    own.write_bytes(data)
    got = cdcp.FileSystemReader(tmp_path / "c").read_metadata(rank=0)
    assert got.state_dict_metadata["w"].chunks[0].sizes == torch.Size([2, 3])
    assert load_metadata(own).state_dict_metadata["w"].chunks[0].sizes == torch.Size([2, 3])
    m.state_dict_metadata["w"].chunks[0].offsets = torch.Size([3, 0])  # rows 3-4 of 4: outside, for any file
    own.write_bytes(pickle.dumps(m))
    with pytest.raises(ckptio.CkptioError) as ei:
        cdcp.FileSystemReader(tmp_path / "c").read_metadata(rank=0)
    assert "chunk 0 spans [3, 5) in dimension 0, outside the tensor's size 4" in str(ei.value)


def _rows(md, *spans, files):
    """A Metadata of one 4 x 3 tensor 'w' in chunks of the given row spans, chunk i stored in files[i]."""
    chunks = [md.ChunkStorageMetadata(offsets=torch.Size([a, 0]), sizes=torch.Size([b - a, 3])) for a, b in spans]
    tsm = md.TensorStorageMetadata(properties=md.TensorProperties(dtype=torch.float32), size=torch.Size([4, 3]),
                                   chunks=chunks)
    storage = {md.MetadataIndex("w", c.offsets): _StorageInfo(relative_path=f, offset=0, length=8)
               for c, f in zip(chunks, files)}
    return md.Metadata(state_dict_metadata={"w": tsm}, storage_data=storage)


@pytest.mark.parametrize("spans,said", [
    (((0, 2), (3, 4)), "the 2 chunks cover 9 of the tensor's 12 elements (a gap)"),
    (((0, 3), (1, 4)), "chunks 0 and 1 overlap"),
], ids=["gap", "overlap"])
def test_chunks_of_several_ranks_must_tile_their_tensor(spans, said):
    """Data files of several ranks: torch's save planner checked that the chunks cover each tensor, so chunks that
    leave a gap (dcp.load would keep those rows as they were, without an error) or overlap are refused. One
    process's save may hold only its own shard of a tensor (torch loads that back), so there a gap is read."""
    from torch.distributed.checkpoint import metadata as md

    several = pickle.dumps(_rows(md, *spans, files=["__0_0.distcp", "__1_0.distcp"]))
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(several, "r/.metadata")
    assert ei.value.status_name == "E_FORMAT" and str(ei.value) == f"r/.metadata: state_dict_metadata['w']: {said}"
    assert metadata_from_bytes(pickle.dumps(_rows(md, (0, 2), (2, 4), files=["__0_0.distcp", "__1_0.distcp"])),
                               "r/.metadata").state_dict_metadata["w"].size == torch.Size([4, 3])
    one = metadata_from_bytes(pickle.dumps(_rows(md, (0, 2), files=["__0_0.distcp"])), "o/.metadata")
    assert [c.sizes for c in one.state_dict_metadata["w"].chunks] == [torch.Size([2, 3])]


def test_saved_by_ranks_reads_names_only():
    """The rule (ckptio_dcp_saved_by_ranks) sees the str among the names, whatever they hold: other items are
    skipped, lone surrogates (a pickle may carry them) are no error, ranks differ by their digits."""
    from ckptio import _ckptio

    assert _ckptio.dcp_saved_by_ranks(["__0_0.distcp", "__1_\udc80.distcp"]) is True
    assert _ckptio.dcp_saved_by_ranks([1, None, "__0_0.distcp", b"__1_0.distcp", ("__2_0.distcp",)]) is False
    assert _ckptio.dcp_saved_by_ranks(["__0_0.distcp", "__00_1.distcp"]) is True
    assert _ckptio.dcp_saved_by_ranks([]) is False
    with pytest.raises(TypeError):
        _ckptio.dcp_saved_by_ranks(5)
    from torch.distributed.checkpoint import metadata as md

    data = pickle.dumps(_rows(md, (0, 2), (3, 4), files=["__0_\udc80.distcp", "__1_0.distcp"]))
    with pytest.raises(ckptio.CkptioError, match=r"the 2 chunks cover 9 of the tensor's 12 elements \(a gap\)"):
        metadata_from_bytes(data, "s/.metadata")


def test_a_tensor_of_64_dimensions_reads():
    """torch allows 64 dimensions, and so does the chunk check (it took 63 at most: a ValueError, E_FORMAT);
    65 are refused by the C check."""
    from torch.distributed.checkpoint import metadata as md

    for nd, ok in ((64, True), (65, False)):
        ones = torch.Size([1] * nd)
        chunk = md.ChunkStorageMetadata(offsets=torch.Size([0] * nd), sizes=ones)
        tsm = md.TensorStorageMetadata(properties=md.TensorProperties(dtype=torch.float32), size=ones, chunks=[chunk])
        data = pickle.dumps(md.Metadata(state_dict_metadata={"w": tsm},
                                        storage_data={md.MetadataIndex("w", chunk.offsets): _StorageInfo(
                                            relative_path="__0_0.distcp", offset=0, length=4)}))
        if ok:
            assert metadata_from_bytes(data, "d/.metadata").state_dict_metadata["w"].size == ones
        else:
            with pytest.raises(ckptio.CkptioError) as ei:
                metadata_from_bytes(data, "d/.metadata")
            assert str(ei.value).endswith("state_dict_metadata['w']: the tensor has 65 dimensions (at most 64)")


def test_a_reader_refuses_a_chunk_without_sizes(tmp_path):
    """Through ckptio.dcp.FileSystemReader: the same E_FORMAT, naming the file; torch's dcp.load fails and loads
    nothing, its error carrying that message where torch passes a reader's on."""
    from torch.distributed.checkpoint import metadata as md

    save({"w": torch.ones(4, 3)}, dcp.FileSystemWriter(tmp_path / "c"))
    meta = tmp_path / "c" / ".metadata"
    good = pickle.loads(meta.read_bytes())
    tsm = good.state_dict_metadata["w"]
    bad = md.Metadata(state_dict_metadata={"w": _Reduce(md.TensorStorageMetadata, (), {
        "properties": tsm.properties, "size": tsm.size,
        "chunks": [_Reduce(md.ChunkStorageMetadata, (), {"offsets": torch.Size([0, 0])})]})},
        storage_data=good.storage_data)
    meta.write_bytes(pickle.dumps(bad))
    with pytest.raises(ckptio.CkptioError) as ei:
        cdcp.FileSystemReader(tmp_path / "c").read_metadata()
    assert ei.value.status_name == "E_FORMAT" and str(meta) in str(ei.value)
    assert str(ei.value).endswith(f"{_CSM} lacks the field 'sizes'")
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    dst = {"w": torch.zeros(4, 3)}
    with pytest.raises(CheckpointException) as ei:
        dcp.load(dst, storage_reader=cdcp.FileSystemReader(tmp_path / "c"))
    # torch 2.15 appends the reader's error to its own ("metadata is None; global metadata read failed: ...");
    # torch 2.11 (the GPU machine's, 2026-11-28) raises "metadata is None" alone and logs the reader's error as a
    # warning.
    text = str(ei.value)
    assert (f"{meta}: load DCP metadata: {_CSM} lacks the field 'sizes'" in text
            or text.rstrip().endswith("AssertionError: metadata is None")), text
    assert torch.equal(dst["w"], torch.zeros(4, 3))


def test_mutated_metadata_loads_or_fails_cleanly(tmp_path):
    """Bytes of a real .metadata flipped, cut and inserted at random (a fixed seed): each either loads or raises
    CkptioError (what the C fuzzers do for the parser, here through the object building as well)."""
    import random

    save({"w": torch.ones(4, 3), "b": torch.zeros(5, dtype=torch.bfloat16), "step": 3,
          "extra": {"lr": 0.1, "name": "x"}}, dcp.FileSystemWriter(tmp_path / "c"))
    data = (tmp_path / "c" / ".metadata").read_bytes()
    rng = random.Random(17)
    outcomes = {}
    for _ in range(3000):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            pos, op = rng.randrange(len(b)), rng.random()
            if op < 0.6:
                b[pos] = rng.randrange(256)
            elif op < 0.8:
                del b[pos:pos + rng.randint(1, 8)]
            else:
                b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        try:
            metadata_from_bytes(bytes(b), "m/.metadata")
            outcome = "loaded"
        except ckptio.CkptioError as e:
            assert "m/.metadata" in str(e), e
            outcome = e.status_name
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("E_FORMAT", 0) > 100 and outcomes.get("E_DISALLOWED", 0) > 100, outcomes


def test_shared_objects_stay_shared_and_sizes_take_lists():
    """An object the pickle shares is one object after loading, as pickle.loads gives it; a torch.Size pickled
    from a list (the callback's path) equals pickle.loads's."""
    from torch.distributed.checkpoint import metadata as md

    chunk = md.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 3]))
    planner_data = [chunk, chunk, _Reduce(torch.Size, ([4, 5],))]
    data = pickle.dumps(md.Metadata(state_dict_metadata={}, planner_data=planner_data))
    got, ref = metadata_from_bytes(data, "s/.metadata"), pickle.loads(data)
    assert got.planner_data == ref.planner_data
    assert got.planner_data[0] is got.planner_data[1] and type(got.planner_data[2]) is torch.Size


# ---- torch <= 2.2 metadata ---------------------------------------------------------------------------------------
# Those torch versions pickled TensorProperties and MEM_FORMAT_ENCODING from
# torch.distributed._shard.sharded_tensor.metadata; torch moved both into
# torch.distributed.checkpoint.metadata (the enum renamed _MEM_FORMAT_ENCODING)
# and still loads the old names into the old classes. tests/data/dcp/
# legacy_torch22 was written by torch 2.2.2, legacy_compat by torch 2.15 the
# way torch's TestDCPCompatbility.test_sharded_tensor_dependency writes one
# (tests/data/make_dcp_fixtures.py). ckptio reads both as the current classes.
#
# torch 2.15 pickles TensorProperties with 6 fields (strides last); a torch whose
# class has no strides field (2.11) takes exactly 5, and its own pickle.load
# refuses legacy_compat (ValueError): there ckptio must refuse it too.
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "dcp")
LEGACY = ["legacy_torch22", "legacy_compat"]
OLD_MODULE = "torch.distributed._shard.sharded_tensor.metadata"


def props_have_strides():
    from torch.distributed.checkpoint.metadata import TensorProperties

    return "strides" in {f.name for f in dataclasses.fields(TensorProperties)}


def torch_reads(data):
    """Whether this torch's pickle.loads reads the legacy .metadata `data`.
    The one refusal expected is a 6-field TensorProperties on a torch whose
    class has no strides field."""
    try:
        pickle.loads(data)
    except ValueError as e:
        assert not props_have_strides() and "too many values to unpack (expected 5)" in str(e), e
        return False
    return True


def assert_refused_as_newer_torch(load):
    with pytest.raises(ckptio.CkptioError) as ei:
        load()
    assert ei.value.status_name == "E_FORMAT", ei.value
    assert "TensorProperties state has 6 fields" in str(ei.value) and "newer torch" in str(ei.value), ei.value


def legacy_template():
    """The fixtures' state dict (make_dcp_fixtures.single_state), zeroed: what dcp.load fills."""
    return {"w": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16),
            "s": torch.tensor(0.0, dtype=torch.float64), "t": torch.zeros(3, 2, dtype=torch.int16),
            "nested": {"m": torch.zeros(2, 2, dtype=torch.int64)}, "step": 0}


def as_current(md):
    """torch's Metadata with each old TensorProperties replaced by the current
    class holding the same field values."""
    import copy

    from torch.distributed.checkpoint.metadata import TensorProperties

    md = copy.deepcopy(md)
    for item in md.state_dict_metadata.values():
        old = getattr(item, "properties", None)
        if old is not None:
            assert type(old).__module__ == OLD_MODULE  # torch keeps the old class
            new = TensorProperties.__new__(TensorProperties)
            new.__dict__.update(old.__dict__)
            item.properties = new
    return md


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_metadata_reads_as_current_classes(name):
    path = os.path.join(DATA, name, ".metadata")
    with open(path, "rb") as f:
        data = f.read()
    assert OLD_MODULE.encode() in data and b"MEM_FORMAT_ENCODING" in data
    if not torch_reads(data):
        assert name == "legacy_compat"  # torch 2.2 wrote 5 fields: every torch reads legacy_torch22
        assert_refused_as_newer_torch(lambda: load_metadata(path))
        return
    want = as_current(pickle.loads(data))
    got = load_metadata(path)
    same(got, want)
    assert got == want
    props = got.state_dict_metadata["w"].properties
    assert (props.dtype, props.layout, props.memory_format, props.requires_grad, props.pin_memory) == \
        (torch.float32, torch.strided, torch.contiguous_format, False, False)
    # torch 2.2 pickled 5 fields (no strides), read as strides None where the class has the field;
    # torch 2.15's old class pickled 6 (legacy_compat).
    props = got.state_dict_metadata["t"].properties
    if props_have_strides():
        assert props.strides == (None if name == "legacy_torch22" else (1, 3))
    else:
        assert "strides" not in props.__dict__


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_checkpoint_loads_like_torch(name):
    d = os.path.join(DATA, name)
    want, got = legacy_template(), legacy_template()
    with open(os.path.join(d, ".metadata"), "rb") as f:
        readable = torch_reads(f.read())
    if not readable:
        # torch's dcp.load fails (its read_metadata's error is swallowed: "metadata is None"), and so
        # does it through ckptio's reader, whose read_metadata says why.
        assert name == "legacy_compat"
        from torch.distributed.checkpoint.api import CheckpointException

        for reader in (dcp.FileSystemReader(d), cdcp.FileSystemReader(d)):
            with warnings.catch_warnings(), pytest.raises(CheckpointException):
                warnings.simplefilter("ignore")
                dcp.load(legacy_template(), storage_reader=reader, no_dist=True)
        assert_refused_as_newer_torch(lambda: cdcp.FileSystemReader(d).read_metadata())
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(want, storage_reader=dcp.FileSystemReader(d), no_dist=True)
        dcp.load(got, storage_reader=cdcp.FileSystemReader(d), no_dist=True)
    assert got["step"] == want["step"] == 7
    flat_got = {**{k: v for k, v in got.items() if k != "nested"}, "nested.m": got["nested"]["m"]}
    flat_want = {**{k: v for k, v in want.items() if k != "nested"}, "nested.m": want["nested"]["m"]}
    from safetensors.torch import load_file

    expected = load_file(os.path.join(DATA, name + ".expected.safetensors"))
    assert set(expected) == {k for k in flat_got if k != "step"}
    for k, t in expected.items():
        assert flat_want[k].dtype == t.dtype and torch.equal(flat_want[k], t), k
        assert flat_got[k].dtype == t.dtype and torch.equal(flat_got[k], t), k
    # No manifest (torch wrote it), but .metadata passed: verify checks the structure and says the bytes were
    # not compared with checksums, not E_DISALLOWED.
    report = cdcp.verify(d)
    assert report["manifest"] is None and report["checksums"] is False and report["checked"] == report["items"]


def test_legacy_memory_format_out_of_range_is_refused(tmp_path):
    # MEM_FORMAT_ENCODING(7) for "w" (made by make_dcp_fixtures.py): the enum has members 0-2.
    with open(os.path.join(DATA, "bad_memformat.metadata"), "rb") as f:
        data = f.read()
    with pytest.raises(ValueError, match="7 is not a valid MEM_FORMAT_ENCODING"):
        pickle.loads(data)  # torch refuses it too
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(data, "bad/.metadata")
    assert ei.value.status_name == "E_FORMAT" and "_MEM_FORMAT_ENCODING has no member 7" in str(ei.value)
    d = tmp_path / "bad"
    d.mkdir()
    (d / ".metadata").write_bytes(data)
    for load in (lambda: cdcp.FileSystemReader(d).read_metadata(), lambda: cdcp.verify(d)):
        with pytest.raises(ckptio.CkptioError) as ei:
            load()
        assert ei.value.status_name == "E_FORMAT" and "bad/.metadata" in str(ei.value)
        assert "7" in str(ei.value) and "_MEM_FORMAT_ENCODING" in str(ei.value)


@pytest.mark.parametrize("module,name", [
    # torch 1.13's DCP package: torch no longer loads its checkpoints (the
    # module is re-imported under the old name, so isinstance checks and
    # MetadataIndex lookups fail), so ckptio does not admit them either.
    ("torch.distributed._shard.checkpoint.metadata", "Metadata"),
    ("torch.distributed._shard.checkpoint.filesystem", "_StorageInfo"),
    # Other classes of the old modules never appear in DCP metadata.
    ("torch.distributed._shard.metadata", "ShardMetadata"),
    (OLD_MODULE, "ShardedTensorMetadata"),
    (OLD_MODULE, "ShardMetadata"),
])
def test_other_old_names_stay_refused(module, name):
    data = f"c{module}\n{name}\n)\x81}}b.".encode()  # GLOBAL, NEWOBJ(), BUILD {}
    with pytest.raises(ckptio.CkptioError) as ei:
        metadata_from_bytes(data, "old/.metadata")
    assert ei.value.status_name == "E_DISALLOWED" and f"global '{module}.{name}'" in str(ei.value)
