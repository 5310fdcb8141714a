"""ckptio.dcp: torch.distributed.checkpoint storage on libckptio.

Round trips, on-disk compatibility with torch's stock FileSystemWriter/Reader
in both directions (TORCH_SAVE, SAFETENSORS, zstd), resharding across process
counts with DTensor on a gloo CPU mesh, async save, atomic overwrite with
injected crashes, manifests and errors.
"""
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from conftest import CKPTIO_CLI  # noqa: E402

try:
    import zstandard  # noqa: F401

    HAVE_ZSTANDARD = True
except ImportError:
    HAVE_ZSTANDARD = False

needs_zstandard = pytest.mark.skipif(not HAVE_ZSTANDARD, reason="torch's ZStandard needs the zstandard module")

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ckptio.__file__)))

pytestmark = pytest.mark.filterwarnings("ignore")


def make_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(64, 48, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "i": torch.arange(30, dtype=torch.int64).reshape(5, 6) + seed,
        "f8": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(3.5 + seed),
        "empty": torch.zeros(0, 4),
        "step": 100 + seed,
        "opt": {"lr": 0.1, "names": ["a", "b"], "m": torch.randn(3, 3, generator=g)},
    }


def zeros_like_state(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = zeros_like_state(v)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v) if v.dtype != torch.float8_e4m3fn else torch.zeros(v.shape).to(v.dtype)
        else:
            out[k] = None
    return out


def assert_state_equal(got, want):
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, dict):
            assert_state_equal(got[k], v)
        elif isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert torch.equal(got[k].view(torch.uint8) if v.dtype == torch.float8_e4m3fn else got[k],
                               v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v), k
        else:
            assert got[k] == v, k


def save(sd, writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=True)


def load(sd_template, reader):
    out = zeros_like_state(sd_template)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


# ---- one process ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [SerializationFormat.TORCH_SAVE, SerializationFormat.SAFETENSORS])
@pytest.mark.parametrize("threads", [1, 3])
def test_ckptio_writes_both_readers_load(tmp_path, fmt, threads):
    sd = make_state()
    path = tmp_path / "ckpt"
    save(sd, cdcp.FileSystemWriter(path, thread_count=threads, serialization_format=fmt))
    names = sorted(os.listdir(path))
    assert ".metadata" in names
    data = [n for n in names if n.endswith(".distcp")]
    token = data[0].split("_")[3]
    assert all(n.startswith("__0_") and f"_{token}_" in n for n in data), names
    # (.ckptio-dcp.lock: the lock that serializes saves of the directory, empty, kept)
    assert names == sorted(data + [".metadata", f".ckptio-manifest-{token}.json", ".ckptio-dcp.lock"])
    if fmt == SerializationFormat.TORCH_SAVE:
        assert len(data) == threads
    assert_state_equal(load(sd, cdcp.FileSystemReader(path)), sd)
    if fmt == SerializationFormat.TORCH_SAVE:  # torch's reader cannot read SAFETENSORS data files at all
        assert_state_equal(load(sd, dcp.FileSystemReader(path)), sd)
    report = cdcp.verify(path)
    assert report["items"] == report["checked"] == 10 and report["unhashed"] == 0 and report["partial"] == 0


def test_torch_save_items_are_torch_archives_at_aligned_offsets(tmp_path):
    sd = {"w": torch.arange(20000, dtype=torch.float32), "step": 3}  # 80 KB: above the packing threshold
    path = tmp_path / "c"
    save(sd, cdcp.FileSystemWriter(path))
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    assert type(md).__module__ == "torch.distributed.checkpoint.metadata"
    assert md.version == "1.0.0"
    infos = {idx.fqn: info for idx, info in md.storage_data.items()}
    assert type(infos["w"]).__name__ == "_StorageInfo"  # ckptio's bookkeeping class never reaches .metadata
    assert infos["w"].transform_descriptors is None
    blob = (path / infos["w"].relative_path).read_bytes()
    item = blob[infos["w"].offset:infos["w"].offset + infos["w"].length]
    assert infos["w"].offset % 4096 == 0 and item[:4] == b"PK\x03\x04"
    import io

    t = torch.load(io.BytesIO(item), weights_only=True)
    assert torch.equal(t, sd["w"])
    # Tensor bytes sit 4 KiB-aligned in the file (O_DIRECT).
    raw = sd["w"].numpy().tobytes()
    assert (infos["w"].offset + item.index(raw)) % 4096 == 0
    step = torch.load(io.BytesIO(blob[infos["step"].offset:infos["step"].offset + infos["step"].length]),
                      weights_only=False)
    assert step == 3


def _data_bytes(path):
    return sum(os.path.getsize(path / n) for n in os.listdir(path) if n.endswith(".distcp"))


@pytest.mark.parametrize("fmt", [SerializationFormat.TORCH_SAVE, SerializationFormat.SAFETENSORS])
def test_small_items_are_packed_like_torch(tmp_path, fmt):
    # A tiny model and optimizer: each item padded to 4 KiB took 8x the space of torch's writer. Small items
    # are packed (64-byte alignment, as torch's archives); larger ones keep 4 KiB for O_DIRECT.
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 16)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 16)).sum().backward()
    opt.step()
    sd = {"model": m.state_dict(), "optim": opt.state_dict(), "big": torch.randn(40000)}
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    save(sd, cdcp.FileSystemWriter(ours, serialization_format=fmt))
    save(sd, dcp.FileSystemWriter(theirs, serialization_format=fmt))
    assert _data_bytes(ours) <= 2 * _data_bytes(theirs), (_data_bytes(ours), _data_bytes(theirs))
    if fmt == SerializationFormat.TORCH_SAVE:
        with open(ours / ".metadata", "rb") as f:
            md = pickle.load(f)
        infos = {idx.fqn: info for idx, info in md.storage_data.items()}
        blob = (ours / infos["big"].relative_path).read_bytes()
        big = blob[infos["big"].offset:infos["big"].offset + infos["big"].length]
        assert (infos["big"].offset + big.index(sd["big"].numpy().tobytes())) % 4096 == 0
        assert any(i.offset % 4096 for i in infos.values())  # small items no longer start on 4 KiB boundaries
    want = {"model": m.state_dict(), "optim": opt.state_dict(), "big": sd["big"]}
    for reader in ([cdcp.FileSystemReader(ours), dcp.FileSystemReader(ours)] if fmt == SerializationFormat.TORCH_SAVE
                   else [cdcp.FileSystemReader(ours)]):
        got = {"model": {k: torch.zeros_like(v) for k, v in m.state_dict().items()},
               "optim": {"state": {k: {n: torch.zeros_like(t) for n, t in st.items()}
                                   for k, st in opt.state_dict()["state"].items()},
                         "param_groups": opt.state_dict()["param_groups"]},
               "big": torch.zeros(40000)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(got, storage_reader=reader, no_dist=True)
        for k, v in want["model"].items():
            assert torch.equal(got["model"][k], v), k
        for k, st in want["optim"]["state"].items():
            for n, t in st.items():
                assert torch.equal(got["optim"]["state"][k][n], t), (k, n)
        assert torch.equal(got["big"], sd["big"])
    report = cdcp.verify(ours)
    assert report["unhashed"] == 0 and report["checked"] == report["items"]


def test_single_file_per_rank_false_writes_a_file_per_item(tmp_path):
    sd = make_state()
    path = tmp_path / "c"
    save(sd, cdcp.FileSystemWriter(path, single_file_per_rank=False))
    assert len([n for n in os.listdir(path) if n.endswith(".distcp")]) == 10
    assert_state_equal(load(sd, dcp.FileSystemReader(path)), sd)


@pytest.mark.parametrize("fmt", [SerializationFormat.TORCH_SAVE, SerializationFormat.SAFETENSORS])
def test_torch_writes_ckptio_reads(tmp_path, fmt):
    sd = make_state(1)
    path = tmp_path / "t"
    save(sd, dcp.FileSystemWriter(path, thread_count=2, serialization_format=fmt))
    assert_state_equal(load(sd, cdcp.FileSystemReader(path)), sd)


@needs_zstandard
def test_zstd_both_directions(tmp_path):
    from torch.distributed.checkpoint._extension import ZStandard as TorchZstd

    sd = make_state(2)
    sd["w"] = torch.zeros(256, 256)  # compresses well
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    save(sd, cdcp.FileSystemWriter(mine, _extensions=[cdcp.ZStandard()]))
    save(sd, dcp.FileSystemWriter(theirs, _extensions=[TorchZstd()]))
    with open(mine / ".metadata", "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        assert info.transform_descriptors == ["stream.zstd/1"]
    assert sum(os.path.getsize(mine / n) for n in os.listdir(mine)) < 256 * 256 * 4 // 4
    assert_state_equal(load(sd, dcp.FileSystemReader(mine)), sd)
    assert_state_equal(load(sd, cdcp.FileSystemReader(theirs)), sd)
    assert_state_equal(load(sd, cdcp.FileSystemReader(mine)), sd)
    assert cdcp.verify(mine)["checked"] == 10


def test_zstd_without_zstandard_module(tmp_path):
    """Compression and decompression run in libckptio: torch's own ZStandard
    descriptor, no Python zstd module involved."""
    sd = {"w": torch.ones(1000), "step": 1}
    path = tmp_path / "z"
    save(sd, cdcp.FileSystemWriter(path, _extensions=[cdcp.ZStandard()]))
    out = load(sd, cdcp.FileSystemReader(path))
    assert torch.equal(out["w"], sd["w"]) and out["step"] == 1


def test_reader_reads_only_needed_bytes(tmp_path):
    """Loading rows 10..19 of a stored 1000x256 chunk reads those rows only."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    full = torch.randn(1000, 256)
    path = tmp_path / "c"
    save({"w": full}, cdcp.FileSystemWriter(path))
    eng = ckptio.Engine()
    reader = cdcp.FileSystemReader(path, engine=eng)
    md = reader.read_metadata()
    reader.set_up_storage_reader(md, True)
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    dest = torch.zeros(10, 256)
    req = ReadItem(LoadItemType.TENSOR, MetadataIndex("w", (0, 0)), torch.Size([0, 0]), MetadataIndex("w", (0, 0)),
                   torch.Size([10, 0]), torch.Size([10, 256]))

    class Planner(DefaultLoadPlanner):
        def resolve_tensor(self, read_item):
            return dest

        def commit_tensor(self, read_item, tensor):
            pass

    reader.read_data(LoadPlan([req]), Planner()).wait()
    assert torch.equal(dest, full[10:20])
    assert eng.stats()["bytes_read"] <= 10 * 256 * 4 + 8192
    # Columns 5..9 of every row: one 20-byte run per row (1000 runs).
    dest2 = torch.zeros(1000, 5)
    req2 = ReadItem(LoadItemType.TENSOR, MetadataIndex("w", (0, 0)), torch.Size([0, 0]), MetadataIndex("w", (0, 0)),
                    torch.Size([0, 5]), torch.Size([1000, 5]))

    class Planner2(Planner):
        def resolve_tensor(self, read_item):
            return dest2.t().contiguous().t()  # a non-contiguous destination: read, then copied

    before = eng.stats()["bytes_read"]
    got = {}

    class Planner3(Planner):
        def resolve_tensor(self, read_item):
            got["t"] = dest2
            return dest2

    reader.read_data(LoadPlan([req2]), Planner3()).wait()
    assert torch.equal(got["t"], full[:, 5:10])
    assert eng.stats()["bytes_read"] - before < full.numel() * 4 // 4


# ---- several processes: resharding ---------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, Replicate, distribute_tensor
    import ckptio, ckptio.dcp as cdcp

    rank, world, mode, path, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    W = torch.randn(64, 16384, generator=g)
    E = torch.randn(300, 4096, generator=g).to(torch.bfloat16)
    if mode == "save":
        sd = {"W": distribute_tensor(W, mesh, [Shard(0)]), "E": distribute_tensor(E, mesh, [Shard(1)]),
              "step": 42, "rank_local": torch.full((3,), float(rank))}
        dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path, thread_count=2))
    else:
        # Other placements than at save time: W by columns, E by rows.
        sd = {"W": distribute_tensor(torch.zeros(W.shape), mesh, [Shard(1)]),
              "E": distribute_tensor(torch.zeros(E.shape, dtype=torch.bfloat16), mesh, [Shard(0)]), "step": 0,
              "rank_local": torch.zeros(3)}
        eng = ckptio.Engine()
        dcp.load(sd, storage_reader=cdcp.FileSystemReader(path, engine=eng))
        assert torch.equal(sd["W"].full_tensor(), W), "W"
        assert torch.equal(sd["E"].full_tensor(), E), "E"
        local = sd["W"].to_local()
        assert sd["step"] == 42
        # Each rank read its own columns of W and rows of E (plus rank_local), not whole tensors.
        need = local.numel() * 4 + sd["E"].to_local().numel() * 2 + 3 * 4
        got = eng.stats()["bytes_read"]
        assert need <= got < need + 64 * 8192 and got < (W.numel() * 4 + E.numel() * 2) // 2, (got, need)
    dist.barrier()
    dist.destroy_process_group()
    print("OK", rank, flush=True)
    os._exit(0)  # torch's gloo may abort in interpreter teardown after a clean run
    """
)


def run_ranks(tmp_path, world, mode, path, timeout=120):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    store = tmp_path / f"store-{mode}-{world}"
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), mode, str(path), str(store)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {r}" in out, f"rank {r} of {world} ({mode}):\n{out[-3000:]}"


def test_save_on_two_ranks_load_on_three_and_one(tmp_path):
    path = tmp_path / "sharded"
    run_ranks(tmp_path, 2, "save", path)
    names = sorted(os.listdir(path))
    assert len([n for n in names if n.startswith("__0_")]) == 2 and len([n for n in names if n.startswith("__1_")]) == 2
    run_ranks(tmp_path, 3, "load", path)
    # One process, no process group, plain tensors: stock torch's reader and ckptio's agree.
    g = torch.Generator().manual_seed(0)
    W = torch.randn(64, 16384, generator=g)
    E = torch.randn(300, 4096, generator=g).to(torch.bfloat16)
    for reader in (cdcp.FileSystemReader(path), dcp.FileSystemReader(path)):
        sd = {"W": torch.zeros(W.shape), "E": torch.zeros(E.shape, dtype=torch.bfloat16), "step": 0}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(sd, storage_reader=reader, no_dist=True)
        assert torch.equal(sd["W"], W) and torch.equal(sd["E"], E) and sd["step"] == 42
    assert cdcp.verify(path)["checked"] > 0


# ---- async save ------------------------------------------------------------------------------


def test_async_save_holds_values_at_save_time(tmp_path):
    sd = {"w": torch.arange(100000, dtype=torch.float32), "step": 1}
    writer = cdcp.FileSystemWriter(tmp_path / "a1", cache_staged_state_dict=True, snapshots=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fut = dcp.async_save(sd, storage_writer=writer, no_dist=True)
        sd["w"].add_(1000)  # training goes on
        sd["step"] = 2
        fut.result()
        staged = writer.state_dict_cache["w"]
        # The staging buffer is reused by the next save (no new allocation).
        fut2 = dcp.async_save(sd, checkpoint_id=tmp_path / "a2", storage_writer=writer, no_dist=True)
        fut2.result()
        assert writer.state_dict_cache["w"].data_ptr() == staged.data_ptr()
    out1 = load({"w": sd["w"], "step": 0}, dcp.FileSystemReader(tmp_path / "a1"))
    assert torch.equal(out1["w"], torch.arange(100000, dtype=torch.float32)) and out1["step"] == 1
    out2 = load({"w": sd["w"], "step": 0}, cdcp.FileSystemReader(tmp_path / "a2"))
    assert torch.equal(out2["w"], sd["w"]) and out2["step"] == 2


def test_second_async_save_while_in_flight_waits_or_fails(tmp_path, monkeypatch):
    import threading

    from ckptio.dcp import _writer

    gate = threading.Event()
    real = _writer.FileSystemWriter._write

    def slow_write(self, plan, planner):
        gate.wait(30)
        return real(self, plan, planner)

    monkeypatch.setattr(_writer.FileSystemWriter, "_write", slow_write)
    sd = {"w": torch.ones(10)}
    failing = cdcp.FileSystemWriter(tmp_path / "e1", cache_staged_state_dict=True, async_busy="error")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fut = dcp.async_save(sd, storage_writer=failing, no_dist=True)
        with pytest.raises(RuntimeError, match="still writing its staged data"):
            dcp.async_save(sd, checkpoint_id=tmp_path / "e2", storage_writer=failing, no_dist=True)
        gate.set()
        fut.result()
        gate.clear()
        waiting = cdcp.FileSystemWriter(tmp_path / "w1", cache_staged_state_dict=True)
        fut = dcp.async_save(sd, storage_writer=waiting, no_dist=True)
        threading.Timer(0.5, gate.set).start()
        fut2 = dcp.async_save({"w": torch.full((10,), 2.0)}, checkpoint_id=tmp_path / "w2", storage_writer=waiting,
                              no_dist=True)  # blocks in stage() until the first save wrote its data
        assert fut.done() or gate.is_set()
        fut.result()
        fut2.result()
    assert torch.equal(load({"w": sd["w"]}, cdcp.FileSystemReader(tmp_path / "w1"))["w"], torch.ones(10))
    assert torch.equal(load({"w": sd["w"]}, cdcp.FileSystemReader(tmp_path / "w2"))["w"], torch.full((10,), 2.0))


# ---- atomic overwrite ------------------------------------------------------------------------

CRASHER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed.checkpoint as dcp
    import ckptio.dcp as cdcp
    from ckptio.dcp import _writer
    stage, path = sys.argv[1], sys.argv[2]
    def crash(at):
        if at == stage:
            os._exit(17)  # a crash: no cleanup, no exception handlers
    _writer._crash_point = crash
    sd = {"w": torch.full((5000,), 2.0), "step": 2}
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path), no_dist=True)
    os._exit(0)
    """
)


@pytest.mark.parametrize("stage", ["data_committed", "manifest_written"])
def test_crash_between_data_and_metadata_keeps_old_checkpoint(tmp_path, stage):
    path = tmp_path / "ckpt"
    old = {"w": torch.full((5000,), 1.0), "step": 1}
    save(old, dcp.FileSystemWriter(path))  # the previous checkpoint, written by stock torch
    before = sorted(os.listdir(path))
    script = tmp_path / "crash.py"
    script.write_text(CRASHER)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(script), stage, str(path)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 17, r.stdout + r.stderr
    after = sorted(os.listdir(path))
    assert set(before) <= set(after) and len(after) > len(before)  # new data files exist, old ones untouched
    for reader in (dcp.FileSystemReader(path), cdcp.FileSystemReader(path)):
        got = load(old, reader)
        assert torch.equal(got["w"], old["w"]) and got["step"] == 1
    # The next successful save replaces it and removes everything older.
    new = {"w": torch.full((5000,), 3.0), "step": 3}
    save(new, cdcp.FileSystemWriter(path))
    final = sorted(os.listdir(path))
    with open(path / ".metadata", "rb") as f:
        referenced = {i.relative_path for i in pickle.load(f).storage_data.values()}
    assert [n for n in final if n.endswith(".distcp")] == sorted(referenced)
    assert not [n for n in final if "ckptio-tmp" in n or n.endswith(".tmp")]
    got = load(new, dcp.FileSystemReader(path))
    assert torch.equal(got["w"], new["w"]) and got["step"] == 3


def test_overwrite_false_refuses_existing_checkpoint(tmp_path):
    save({"w": torch.ones(3)}, cdcp.FileSystemWriter(tmp_path / "c"))
    with pytest.raises(CheckpointException, match="already exists"):
        save({"w": torch.ones(3)}, cdcp.FileSystemWriter(tmp_path / "c", overwrite=False))


# ---- errors ---------------------------------------------------------------------------------


def test_verify_names_the_corrupt_item(tmp_path):
    sd = {"w": torch.randn(4096), "v": torch.randn(10)}
    path = tmp_path / "c"
    save(sd, cdcp.FileSystemWriter(path))
    with open(path / ".metadata", "rb") as f:
        info = {i.fqn: s for i, s in pickle.load(f).storage_data.items()}["w"]
    data = path / info.relative_path
    raw = bytearray(data.read_bytes())
    raw[info.offset + info.length - 100] ^= 0xFF  # inside the tensor bytes? at least inside the item
    data.write_bytes(bytes(raw))
    with pytest.raises(ckptio.CkptioError) as exc:
        cdcp.verify(path)
    assert exc.value.status_name == "E_CHECKSUM"
    assert "'w'" in str(exc.value) and info.relative_path in str(exc.value) and str(info.offset) in str(exc.value)
    manifest = [n for n in os.listdir(path) if n.startswith(".ckptio-manifest-")][0]
    doc = json.loads((path / manifest).read_text())
    assert {i["fqn"] for i in doc["items"]} == {"w", "v"}


def test_verify_without_manifest_checks_the_structure(tmp_path):
    """A checkpoint torch wrote has no manifest: ckptio.dcp.verify checks its structure and says the bytes were
    not compared with checksums, as `ckptio verify DIR` does (one C call, ckptio_dcp_validate); not an error."""
    save({"w": torch.ones(3), "step": 7}, dcp.FileSystemWriter(tmp_path / "t"))
    report = cdcp.verify(tmp_path / "t")
    assert report["manifest"] is None and report["checksums"] is False
    assert report["items"] == report["checked"] == 2 and report["partial"] == 0
    mine = cdcp.verify(_ckptio_saved(tmp_path / "m"))
    assert mine["checksums"] is True and mine["manifest"].startswith(".ckptio-manifest-")
    if CKPTIO_CLI is not None:
        r = run_cli("verify", tmp_path / "t")
        assert r.returncode == 0 and "no ckptio manifest" in r.stdout and "structure checked" in r.stdout
        assert f"{report['checked']} items parsed" in r.stdout, r.stdout
    # Damage is still damage: an item cut short fails the structural check, here as there.
    data = tmp_path / "t" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ckptio.CkptioError, match="__0_0.distcp"):
        cdcp.verify(tmp_path / "t")


def run_cli(*args):
    return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def _ckptio_saved(path):
    save({"w": torch.ones(3)}, cdcp.FileSystemWriter(path))
    return path


def test_truncated_data_file_is_reported(tmp_path):
    sd = {"w": torch.randn(5000)}
    path = tmp_path / "c"
    save(sd, cdcp.FileSystemWriter(path))
    data = [n for n in os.listdir(path) if n.endswith(".distcp")][0]
    os.truncate(path / data, 5000)
    # dcp.load wraps the rank's exception (CkptioError E_TRUNCATED) with its traceback text.
    with pytest.raises(CheckpointException) as exc:
        load(sd, cdcp.FileSystemReader(path))
    assert f"{data}: parse DCP item at offset 0: item of" in str(exc.value)
    assert "does not lie inside the file (5000 bytes)" in str(exc.value)


def test_unknown_transform_is_refused(tmp_path):
    sd = {"w": torch.randn(10)}
    path = tmp_path / "c"
    save(sd, cdcp.FileSystemWriter(path))
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        info.transform_descriptors = ["stream.rot13/1"]
    with open(path / ".metadata", "wb") as f:
        pickle.dump(md, f)
    with pytest.raises(CheckpointException, match="unsupported transform 'stream.rot13/1'"):
        load(sd, cdcp.FileSystemReader(path))


def test_bad_options():
    with pytest.raises(ValueError, match="async_busy"):
        cdcp.FileSystemWriter("/nonexistent/x", async_busy="maybe")
    with pytest.raises(ValueError, match="zstd"):
        cdcp.FileSystemWriter("/nonexistent/x", _extensions=[object()])
