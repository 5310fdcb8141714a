"""`ckptio inspect/verify/convert` on torch.distributed.checkpoint directories
and Hugging Face sharded output, through the CLI binary.

Checkpoints are written by stock torch DCP and by ckptio.dcp, in one process
and on 2 gloo ranks with DTensors; converted files are loaded with
safetensors.torch.load_file and compared with the original tensors.
"""
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
import torch.distributed.checkpoint as dcp  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from conftest import CKPTIO_CLI, reference_split, requires_cli  # noqa: E402

pytestmark = [requires_cli, pytest.mark.filterwarnings("ignore")]
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ckptio.__file__)))


def run(*args, timeout=120):
    env = dict(os.environ, CKPTIO_NO_PROGRESS="1")
    return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def make_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(64, 48, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "i": torch.arange(30, dtype=torch.int64).reshape(5, 6),
        "f8": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "step": 100,
        "opt": {"lr": 0.1, "m": torch.randn(3, 3, generator=g)},
    }


def flat_tensors(sd, prefix=""):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(flat_tensors(v, prefix + k + "."))
        elif isinstance(v, torch.Tensor):
            out[prefix + k] = v
    return out


def same(a, b):
    """Bitwise equality (float8 has no torch.equal)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                         b.reshape(-1).view(torch.uint8))


WRITERS = {
    "torch-ts": lambda p: dcp.FileSystemWriter(p),
    "torch-st": lambda p: dcp.FileSystemWriter(p, serialization_format=SerializationFormat.SAFETENSORS),
    "ckptio-ts": lambda p: cdcp.FileSystemWriter(p, thread_count=2),
    "ckptio-st": lambda p: cdcp.FileSystemWriter(p, serialization_format=SerializationFormat.SAFETENSORS),
    "ckptio-zstd": lambda p: cdcp.FileSystemWriter(p, _extensions=[cdcp.ZStandard()]),
}


def save_one(path, writer):
    sd = make_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=WRITERS[writer](path), no_dist=True)
    return sd


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_inspect_verify_convert_one_rank(tmp_path, writer):
    path = tmp_path / "ckpt"
    sd = save_one(path, writer)
    want = flat_tensors(sd)

    r = run("inspect", "--json", path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["format"] == "dcp"
    assert (doc["manifest"] is not None) == writer.startswith("ckptio")
    got = {t["name"]: t for t in doc["tensors"]}
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name]["shape"] == list(t.shape)
        assert got[name]["torch_dtype"] == str(t.dtype)[len("torch."):]
        assert got[name]["nbytes"] == t.numel() * t.element_size()
        assert len(got[name]["chunks"]) == 1
    assert sorted(b["name"] for b in doc["byte_items"]) == ["opt.lr", "step"]
    assert sorted(f["name"] for f in doc["files"]) == sorted(n for n in os.listdir(path) if n.endswith(".distcp"))
    r = run("inspect", path)
    assert r.returncode == 0 and "tensors: 7" in r.stdout and "byte items (non-tensor values): 2" in r.stdout

    r = run("verify", path)
    assert r.returncode == 0, r.stderr
    if writer.startswith("ckptio"):
        assert "matched their XXH3-64" in r.stdout
    else:
        assert "no ckptio manifest" in r.stdout and "structure checked" in r.stdout

    out = tmp_path / "out.safetensors"
    r = run("convert", path, out)
    assert r.returncode == 0, r.stderr
    assert "'opt.lr'" in r.stderr and "'step'" in r.stderr and "skipped" in r.stderr
    loaded = load_file(str(out))
    assert set(loaded) == set(want)
    for name, t in want.items():
        assert same(loaded[name], t.contiguous()), name


def test_convert_hf_shards(tmp_path):
    path = tmp_path / "ckpt"
    sd = save_one(path, "ckptio-ts")
    want = flat_tensors(sd)
    doc = json.loads(run("inspect", "--json", path).stdout)
    sizes = [(t["name"], t["nbytes"]) for t in doc["tensors"]]
    limit = 4096
    expect = reference_split(sizes, limit)
    assert len(expect) > 1
    out = tmp_path / "hf"
    r = run("convert", "--shard-size", limit, path, out)
    assert r.returncode == 0, r.stderr
    n = len(expect)
    names = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    assert sorted(os.listdir(out)) == sorted(names + ["model.safetensors.index.json"])
    text = (out / "model.safetensors.index.json").read_text()
    index = json.loads(text)
    assert index == {"metadata": {"total_size": sum(s for _, s in sizes)},
                     "weight_map": {t: names[k] for k, shard in enumerate(expect) for t in shard}}
    assert text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    for k, shard in enumerate(expect):
        loaded = load_file(str(out / names[k]))
        assert sorted(loaded) == sorted(shard)
        for name in shard:
            assert same(loaded[name], want[name].contiguous()), name
    # inspect/verify accept the directory and the index file itself.
    for target in (out, out / "model.safetensors.index.json"):
        r = run("verify", target)
        assert r.returncode == 0 and f"{n} shards, {len(want)} tensors" in r.stdout, r.stderr
    doc = json.loads(run("inspect", "--json", out).stdout)
    assert doc["format"] == "hf-sharded-safetensors" and len(doc["tensors"]) == len(want)
    assert {t["name"]: t["shard"] for t in doc["tensors"]} == index["weight_map"]
    # A directory OUT without --shard-size: 5 GB shards, so one model.safetensors.
    out1 = tmp_path / "hf1"
    r = run("convert", path, out1)
    assert r.returncode == 0 and os.listdir(out1) == ["model.safetensors"], r.stderr
    assert set(load_file(str(out1 / "model.safetensors"))) == set(want)
    # A shard replaced by another one no longer matches the index.
    (out / names[0]).write_bytes((out / names[1]).read_bytes())
    r = run("verify", out)
    assert r.returncode == 1 and names[0] in r.stderr and "does not hold it" in r.stderr, r.stderr


def test_verify_names_corrupt_item_and_truncation(tmp_path):
    path = tmp_path / "ckpt"
    save_one(path, "ckptio-ts")
    doc = json.loads(run("inspect", "--json", path).stdout)
    w = next(t for t in doc["tensors"] if t["name"] == "w")["chunks"][0]
    data = bytearray((path / w["file"]).read_bytes())
    data[w["offset"] + w["length"] // 2] ^= 0xFF
    (path / w["file"]).write_bytes(bytes(data))
    r = run("verify", path)
    assert r.returncode == 1
    assert "'w'" in r.stderr and w["file"] in r.stderr and f"offset {w['offset']}" in r.stderr

    theirs = tmp_path / "theirs"
    save_one(theirs, "torch-ts")
    data_file = theirs / "__0_0.distcp"
    data_file.write_bytes(data_file.read_bytes()[:3000])
    r = run("verify", theirs)
    assert r.returncode == 1 and "__0_0.distcp" in r.stderr and "past the end of the file" in r.stderr
    r = run("convert", theirs, tmp_path / "x.safetensors")
    assert r.returncode == 1 and not (tmp_path / "x.safetensors").exists()


DATA = Path(__file__).resolve().parents[1] / "data" / "dcp"


@pytest.mark.parametrize("name", ["legacy_torch22", "legacy_compat"])
def test_legacy_metadata(tmp_path, name):
    """.metadata from torch <= 2.2 (TensorProperties and MEM_FORMAT_ENCODING
    under torch.distributed._shard.sharded_tensor.metadata; tests/data/dcp,
    see test_dcp_metadata.py) inspects, verifies and converts like a current one."""
    path = DATA / name
    want = load_file(str(DATA / (name + ".expected.safetensors")))
    r = run("inspect", "--json", path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    got = {t["name"]: t for t in doc["tensors"]}
    assert set(got) == set(want) and [b["name"] for b in doc["byte_items"]] == ["step"]
    for k, t in want.items():
        assert got[k]["shape"] == list(t.shape) and got[k]["torch_dtype"] == str(t.dtype)[len("torch."):], k
    r = run("verify", path)
    assert r.returncode == 0 and "structure checked" in r.stdout and "6 items parsed" in r.stdout, r.stderr
    out = tmp_path / "out.safetensors"
    r = run("convert", path, out)
    assert r.returncode == 0, r.stderr
    loaded = load_file(str(out))
    assert set(loaded) == set(want) and all(same(loaded[k], t) for k, t in want.items())

    # An enum value torch does not define (MEM_FORMAT_ENCODING has 0-2) is refused, naming the field.
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in path.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / ".metadata").write_bytes((DATA / "bad_memformat.metadata").read_bytes())
    for cmd in ("inspect", "verify"):
        r = run(cmd, bad)
        assert r.returncode == 1 and "state_dict_metadata['w']" in r.stderr and "memory_format 7" in r.stderr, \
            r.stderr


WORKER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    import ckptio.dcp as cdcp
    rank, store, mine, theirs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(0)
    W = torch.randn(33, 20, generator=g)
    E = torch.randn(6, 50, generator=g).to(torch.bfloat16)
    sd = {"W": distribute_tensor(W, mesh, [Shard(0)]), "E": distribute_tensor(E, mesh, [Shard(1)]), "step": 42}
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(mine, thread_count=2))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(theirs))
    dist.barrier()
    print("OK", rank, flush=True)
    dist.destroy_process_group()
    os._exit(0)  # torch's gloo may abort in interpreter teardown after a clean run
    """
)


def test_two_ranks(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store"), str(mine), str(theirs)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for r, out in enumerate(outs):
        assert f"OK {r}" in out, out[-3000:]
    g = torch.Generator().manual_seed(0)
    W = torch.randn(33, 20, generator=g)
    E = torch.randn(6, 50, generator=g).to(torch.bfloat16)
    for path in (mine, theirs):
        doc = json.loads(run("inspect", "--json", path).stdout)
        chunks = {t["name"]: t["chunks"] for t in doc["tensors"]}
        assert [c["sizes"] for c in chunks["W"]] == [[17, 20], [16, 20]]
        assert sorted(c["offsets"][1] for c in chunks["E"]) == [0, 25]
        assert len({c["file"] for c in chunks["W"]}) == 2
        r = run("verify", path)
        assert r.returncode == 0, r.stderr
        out = tmp_path / (path.name + ".safetensors")
        r = run("convert", "--quiet", path, out)
        assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr
        loaded = load_file(str(out))
        assert set(loaded) == {"W", "E"}
        assert torch.equal(loaded["W"], W) and torch.equal(loaded["E"], E)


def _claim_more_rows(meta, rows):
    """Rewrites .metadata so tensor 'w' (saved whole as 2 x 3) claims `rows` rows: its one chunk is then the
    shard of a larger tensor that one process saved (rows 0-1)."""
    import pickle

    m = pickle.loads(meta.read_bytes())
    m.state_dict_metadata["w"].size = torch.Size([rows, 3])
    meta.write_bytes(pickle.dumps(m))
    return m


@pytest.mark.parametrize("writer", ["torch", "ckptio"])
def test_verify_takes_one_process_save_of_its_own_shard(tmp_path, writer):
    """A process saving alone may write just its shard of a tensor, and torch loads it back; `ckptio verify`
    (with a manifest and without) reads it as ckptio.dcp's reader does, and counts the tensor on its line.
    Reading the tensor whole (`ckptio convert`) is still refused: rows 2-3 are in no file."""
    path = tmp_path / "c"
    w = torch.arange(6.0).reshape(2, 3)
    mod = cdcp if writer == "ckptio" else dcp
    dcp.save({"w": w, "v": torch.ones(3)}, storage_writer=mod.FileSystemWriter(str(path)))
    _claim_more_rows(path / ".metadata", 4)
    into = {"w": torch.full((4, 3), -1.0), "v": torch.zeros(3)}
    dcp.load(into, storage_reader=dcp.FileSystemReader(str(path)))  # torch takes it: rows 0-1 loaded
    assert torch.equal(into["w"][:2], w) and torch.equal(into["w"][2:], torch.full((2, 3), -1.0))
    into = {"w": torch.full((4, 3), -1.0), "v": torch.zeros(3)}
    dcp.load(into, storage_reader=cdcp.FileSystemReader(str(path)))
    assert torch.equal(into["w"][:2], w)
    r = run("verify", path)
    assert r.returncode == 0, r.stderr
    assert "1 tensor saved in part (one process's own chunks), the others tiled" in r.stdout
    assert ("matched their XXH3-64" if writer == "ckptio" else "structure checked") in r.stdout
    if writer == "ckptio":  # ckptio.dcp.verify reports the same
        assert cdcp.verify(path)["partial"] == 1
    r = run("convert", path, tmp_path / "out.safetensors")
    assert r.returncode != 0 and "w: the 1 chunks cover 6 of the tensor's 12 elements (a gap)" in r.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_verify_refuses_a_gap_in_a_save_of_several_ranks(tmp_path):
    """When .metadata names data files of several ranks, torch's planner checked that chunks tile every tensor,
    so a gap is damage: `ckptio verify` fails naming the tensor, as ckptio.dcp's reader does."""
    import shutil

    path = tmp_path / "c"
    dcp.save({"w": torch.arange(6.0).reshape(2, 3), "v": torch.ones(3)},
             storage_writer=dcp.FileSystemWriter(str(path)))
    r = run("verify", path)
    assert r.returncode == 0 and "chunks tile every tensor" in r.stdout, r.stdout + r.stderr
    shutil.copy(path / "__0_0.distcp", path / "__1_0.distcp")  # same offsets: v read from rank 1's file
    m = _claim_more_rows(path / ".metadata", 4)
    for idx, info in m.storage_data.items():
        if idx.fqn == "v":
            info.relative_path = "__1_0.distcp"
    import pickle

    (path / ".metadata").write_bytes(pickle.dumps(m))
    r = run("verify", path)
    assert r.returncode == 1
    assert f"{path}/.metadata: w: the 1 chunks cover 6 of the tensor's 12 elements (a gap)" in r.stderr, r.stderr
    with pytest.raises(ckptio.CkptioError, match=r"state_dict_metadata\['w'\]: the 1 chunks cover 6 of the "
                                                 r"tensor's 12 elements \(a gap\)"):
        cdcp.FileSystemReader(str(path)).read_metadata()
