"""`ckptio convert` and ckptio.convert between every pair of the four kinds of checkpoint ckptio reads:
a safetensors file, a Hugging Face directory (shards + model.safetensors.index.json), a torch.save file and a
torch.distributed.checkpoint (DCP) directory, each kind into itself too (re-layout, resharding).

Inputs are written by the peers (safetensors' save_file, torch.save, torch's DCP writer); outputs are read
back by the peers (safetensors' load_file, torch.load(weights_only=True), torch's DCP FileSystemReader) and
every tensor is compared byte for byte with the source. What cannot be converted, or not into that place,
is refused before anything is written, and a failed conversion leaves nothing behind.
"""
import json
import os
import subprocess
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
import torch.distributed.checkpoint as dcp  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import ckptio  # noqa: E402
from conftest import CKPTIO_CLI, requires_cli  # noqa: E402

KINDS = ["safetensors", "hf", "torch", "dcp"]
SHARD = 1000  # bytes: the Hugging Face inputs and outputs have several shards


def tensors():
    g = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(20, 16, generator=g),
        "layers.0.w": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layers.0.b": torch.randn(8, generator=g).to(torch.float16),
        "ids": torch.arange(30, dtype=torch.int64).reshape(5, 6),
        "mask": torch.rand(9, generator=g) > 0.5,
        "bytes": torch.randint(0, 255, (13,), dtype=torch.uint8, generator=g),
        "f8": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


def same(a, b):
    """dtype, shape and every byte (NaNs and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def write_hf(sd, path):
    """A sharded Hugging Face directory as transformers writes one, made with safetensors alone."""
    path.mkdir()
    names = list(sd)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for k, part in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file({n: sd[n].contiguous() for n in part}, str(path / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True))


def make_input(kind, sd, tmp_path):
    if kind == "safetensors":
        path = tmp_path / "in.safetensors"
        save_file(sd, str(path))
    elif kind == "hf":
        path = tmp_path / "in_hf"
        write_hf(sd, path)
    elif kind == "torch":
        path = tmp_path / "in.pt"
        torch.save(sd, path)
    else:
        path = tmp_path / "in_dcp"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(path)))
    return path


def read_output(kind, path, like):
    """The tensors of an output, read by the peers only."""
    if kind == "safetensors":
        return load_file(str(path))
    if kind == "torch":
        return torch.load(path, weights_only=True)
    if kind == "hf":
        index = json.loads((path / "model.safetensors.index.json").read_text())
        got = {}
        for shard in sorted(set(index["weight_map"].values())):
            part = load_file(str(path / shard))
            assert {n for n, s in index["weight_map"].items() if s == shard} == set(part)
            got.update(part)
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
        return got
    into = {n: torch.empty_like(t) for n, t in like.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(into, storage_reader=dcp.FileSystemReader(str(path)))
    return into


def out_path(kind, tmp_path):
    return tmp_path / {"safetensors": "out.safetensors", "hf": "out_hf", "torch": "out.pt", "dcp": "out_dcp"}[kind]


def run(*args):
    env = dict(os.environ, CKPTIO_NO_PROGRESS="1")
    return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


@requires_cli
@pytest.mark.parametrize("dst", KINDS)
@pytest.mark.parametrize("src", KINDS)
def test_cli_converts_every_pair(tmp_path, src, dst):
    sd = tensors()
    inp = make_input(src, sd, tmp_path)
    out = out_path(dst, tmp_path)
    args = ["--to", dst] + (["--shard-size", SHARD] if dst == "hf" else [])
    r = run("convert", *args, inp, out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # nothing of these inputs is lost, so no warning
    assert f"{len(sd)} tensors" in r.stdout, r.stdout
    got = read_output(dst, out, sd)
    assert set(got) == set(sd)
    for name, t in sd.items():
        assert same(got[name], t), name
    if dst == "hf":
        assert len([n for n in os.listdir(out) if n.endswith(".safetensors")]) > 1
    if dst == "dcp":  # as ckptio.dcp writes it: a manifest that `ckptio verify` checks every byte against
        r = run("verify", out)
        assert r.returncode == 0 and f"{len(sd)} of {len(sd)} items matched their XXH3-64" in r.stdout, r.stderr
    # Nothing else was left beside the output (no temporary file or directory).
    assert sorted(os.listdir(tmp_path)) == sorted({inp.name, out.name})


@pytest.mark.parametrize("dst", KINDS)
@pytest.mark.parametrize("src", KINDS)
def test_python_face_converts_every_pair(tmp_path, src, dst):
    sd = tensors()
    inp = make_input(src, sd, tmp_path)
    out = out_path(dst, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is lost: no warning
        report = ckptio.convert(inp, out, to=dst, shard_size=SHARD if dst == "hf" else None)
    assert report["to"] == dst and report["from"] == src and report["tensors"] == len(sd)
    assert report["bytes"] == sum(t.numel() * t.element_size() for t in sd.values()) and report["dropped"] == 0
    got = read_output(dst, out, sd)
    assert set(got) == set(sd) and all(same(got[n], t) for n, t in sd.items())


@requires_cli
def test_the_index_file_and_an_unsharded_directory_are_inputs(tmp_path):
    sd = tensors()
    hf = make_input("hf", sd, tmp_path)
    r = run("convert", hf / "model.safetensors.index.json", tmp_path / "a.pt")
    assert r.returncode == 0, r.stderr
    one = tmp_path / "one"
    one.mkdir()
    save_file(sd, str(one / "model.safetensors"))
    r = run("convert", one, tmp_path / "b.safetensors")
    assert r.returncode == 0, r.stderr
    for got in (torch.load(tmp_path / "a.pt", weights_only=True), load_file(str(tmp_path / "b.safetensors"))):
        assert all(same(got[n], t) for n, t in sd.items())


@requires_cli
def test_names_decide_the_output_kind(tmp_path):
    sd = tensors()
    st = make_input("safetensors", sd, tmp_path)
    d = make_input("dcp", sd, tmp_path)
    assert run("convert", st, tmp_path / "x.pt").returncode == 0
    assert torch.load(tmp_path / "x.pt", weights_only=True).keys() == sd.keys()
    assert run("convert", tmp_path / "x.pt", tmp_path / "y.safetensors").returncode == 0
    assert load_file(str(tmp_path / "y.safetensors")).keys() == sd.keys()
    r = run("convert", d, f"{tmp_path}/hf_from_dcp/")  # a DCP input's directory OUT: Hugging Face
    assert r.returncode == 0 and "(DCP -> Hugging Face)" in r.stdout, r.stderr
    assert os.listdir(tmp_path / "hf_from_dcp") == ["model.safetensors"]
    # An empty directory may be the output; it is replaced by the finished one.
    (tmp_path / "empty").mkdir()
    r = run("convert", "--to", "dcp", st, tmp_path / "empty")
    assert r.returncode == 0, r.stderr
    assert ".metadata" in os.listdir(tmp_path / "empty")


@requires_cli
def test_what_cannot_be_done_is_refused_before_writing(tmp_path):
    sd = tensors()
    st = make_input("safetensors", sd, tmp_path)
    before = sorted(os.listdir(tmp_path))
    # A directory OUT for a file input: which layout?
    r = run("convert", st, f"{tmp_path}/dcp_out/")
    assert r.returncode == 1
    assert "names a directory: say which layout" in r.stderr and "--to hf | --to dcp" in r.stderr, r.stderr
    # A directory with files in it is never written into.
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    for to in ("dcp", "hf"):
        r = run("convert", "--to", to, st, full)
        assert r.returncode == 1 and "exists and is not empty" in r.stderr and "nothing was written" in r.stderr
    assert os.listdir(full) == ["notes.txt"]
    # A file OUT that is a directory.
    r = run("convert", "--to", "torch", st, full)
    assert r.returncode == 1 and "is a directory; the output is a file here" in r.stderr, r.stderr
    # A dtype the output format does not have, named with the tensor.
    torch.save({"c": torch.ones(2, dtype=torch.complex128)}, tmp_path / "c.pt")
    r = run("convert", tmp_path / "c.pt", tmp_path / "c.safetensors")
    assert r.returncode == 1 and "tensor 'c' has dtype complex128, which safetensors cannot store" in r.stderr
    r = run("convert", "--to", "hf", tmp_path / "c.pt", tmp_path / "c_hf")
    assert r.returncode == 1 and "cannot store" in r.stderr
    # --shard-size is for a Hugging Face OUT.
    r = run("convert", "--to", "torch", "--shard-size", "1GB", st, tmp_path / "z.pt")
    assert r.returncode == 2 and "--shard-size applies to a Hugging Face OUT" in r.stderr
    r = run("convert", "--to", "parquet", st, tmp_path / "z")
    assert r.returncode == 2 and "--to must be safetensors, hf, torch or dcp" in r.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(before + ["full", "c.pt"])


@requires_cli
def test_an_expanded_view_converts_in_runs_or_is_refused_before_writing(tmp_path):
    """A view larger than its storage (torch's expand): safetensors and Hugging Face outputs write it in runs
    from the storage; torch.save and DCP outputs would hold it whole, which 16 stored bytes do not justify."""
    row = torch.arange(4.0)
    torch.save({"e": row.expand(1 << 18, 4), "r": row}, tmp_path / "x.pt")
    for to, out in (("safetensors", "x.safetensors"), ("hf", "x_hf")):
        r = run("convert", "--to", to, tmp_path / "x.pt", tmp_path / out)
        assert r.returncode == 0, r.stderr
    got = load_file(str(tmp_path / "x.safetensors"))
    assert same(got["e"], row.expand(1 << 18, 4).contiguous()) and same(got["r"], row)
    for to, out in (("torch", "y.pt"), ("dcp", "y_dcp")):
        r = run("convert", "--to", to, tmp_path / "x.pt", tmp_path / out)
        assert r.returncode == 1 and "tensor 'e' is a view of 4194304 bytes over a storage of 16" in r.stderr
        assert "convert it to safetensors or a Hugging Face directory" in r.stderr, r.stderr
        assert not (tmp_path / out).exists()


@requires_cli
@pytest.mark.parametrize("dst", KINDS)
def test_a_failed_conversion_leaves_nothing(tmp_path, dst):
    """The input breaks half-way (a truncated data file): no output, no temporary, for files and directories."""
    sd = tensors()
    d = make_input("dcp", sd, tmp_path)
    data = d / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    out = out_path(dst, tmp_path)
    r = run("convert", "--to", dst, d, out)
    assert r.returncode == 1 and "__0_0.distcp" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["in_dcp"], "an output or a temporary was left"


@requires_cli
def test_what_the_output_cannot_hold_is_said_first(tmp_path):
    sd = tensors()
    state = dict(sd, step=5, cfg={"lr": 0.1})
    torch.save(state, tmp_path / "state.pt")
    r = run("convert", tmp_path / "state.pt", tmp_path / "o.safetensors")
    assert r.returncode == 0
    assert "ckptio: warning: 2 non-tensor values (numbers, strings, _metadata, ...) cannot be stored in " \
           "safetensors and are dropped" in r.stderr, r.stderr
    # DCP byte items: skipped, named, going to safetensors; carried into DCP, which torch loads back.
    d = tmp_path / "d"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": sd["embed.weight"], "step": 5}, storage_writer=dcp.FileSystemWriter(str(d)))
    r = run("convert", d, tmp_path / "d.safetensors")
    assert r.returncode == 0 and "1 byte item (non-tensor values) cannot be stored in safetensors and is " \
                                 "skipped: 'step'" in r.stderr, r.stderr
    r = run("convert", "--to", "dcp", d, tmp_path / "d2")
    assert r.returncode == 0 and r.stderr == "" and "1 tensor and 1 byte item" in r.stdout, (r.stdout, r.stderr)
    into = {"w": torch.zeros(20, 16), "step": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(into, storage_reader=dcp.FileSystemReader(str(tmp_path / "d2")))
    assert into["step"] == 5 and same(into["w"], sd["embed.weight"])
    # safetensors metadata into torch.save: said, not silently lost ("format" only tags the writer).
    save_file(sd, str(tmp_path / "m.safetensors"), metadata={"format": "pt", "author": "x", "license": "y"})
    r = run("convert", tmp_path / "m.safetensors", tmp_path / "m.pt")
    assert r.returncode == 0 and "2 __metadata__ entries of" in r.stderr and "are not carried: a torch.save " \
                                 "file has no such field" in r.stderr, r.stderr
    # --quiet: nothing at all.
    r = run("convert", "--quiet", tmp_path / "state.pt", tmp_path / "q.safetensors")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""


def test_python_face_warns_at_the_callers_line(tmp_path):
    torch.save({"w": torch.ones(3), "step": 5}, tmp_path / "s.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = ckptio.convert(tmp_path / "s.pt", tmp_path / "s.safetensors")
    assert report["dropped"] == 1 and report["to"] == "safetensors"
    (w,) = caught
    assert w.category is UserWarning and "1 non-tensor value" in str(w.message)
    assert w.filename == __file__
    with pytest.raises(ckptio.CkptioError, match="exists and is not empty"):
        ckptio.convert(tmp_path / "s.pt", tmp_path, to="dcp")
    with pytest.raises(ValueError, match="to must be"):
        ckptio.convert(tmp_path / "s.pt", tmp_path / "x", to="zip")
