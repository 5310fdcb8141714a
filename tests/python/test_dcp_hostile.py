"""ckptio.dcp's reader on hostile and unusual DCP directories.

* Byte items (torch.save of non-tensor values) pass libckptio's restricted
  unpickler before torch's planner sees them: a __reduce__ payload is refused
  naming the directory, item, data file, offset and global, and runs nothing;
  the values real training checkpoints store load exactly as torch's reader
  returns them; ``allow_pickle=True`` is the explicit opt-out. ``verify`` (API
  and CLI) checks byte items the same way.
* Data files are opened through libckptio: a relative_path that leaves the
  directory is refused; a zstd item declaring gigabytes is refused from its
  frame header, in bounded time and memory.
* Sizes .metadata declares and honest zstd frames hold (4 GiB in 130 KB):
  `ckptio verify`, `ckptio convert` and the reader stay in bounded memory
  (peak RSS of the child measured), real values over 64 MiB stream back
  exactly, chunks sharing stored bytes are refused by convert, and a list
  of 100000 zstd descriptors is named as such.
* Stream transforms other than zstd are applied through the caller's
  extension registry (torch's Rot13 test extension); without it the load is
  refused while it is planned (E_UNSUPPORTED).
* A .metadata splitting one tensor into 150k chunks is checked in seconds.
"""
import collections
import copy
import dataclasses
import importlib.util
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from conftest import CKPTIO_CLI, REPO, requires_cli  # noqa: E402

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ckptio.__file__)))
pytestmark = pytest.mark.filterwarnings("ignore")


def save(sd, writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=True)


def load(template, reader):
    out = copy.deepcopy(template)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def load_error(template, reader) -> BaseException:
    """The exception a failing dcp.load raised on rank 0 (unwrapped)."""
    with pytest.raises(CheckpointException) as ei:
        load(template, reader)
    (failure,) = ei.value.failures.values()
    return failure[0] if isinstance(failure, tuple) else failure  # torch keeps (exception, traceback)


def metadata(path):
    with open(os.path.join(path, ".metadata"), "rb") as f:
        return pickle.load(f)


def write_metadata(path, md):
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def info_of(md, fqn):
    return next(v for k, v in md.storage_data.items() if k.fqn == fqn)


def run_cli(*args):
    return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def same(a, b, where="value"):
    """Equal values of the same types, all the way down (tensors bitwise, with
    dtype, shape, strides, requires_grad, Parameter-ness; OrderedDict
    _metadata attributes)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.requires_grad) == (b.dtype, b.shape, b.stride(), b.requires_grad), where
        assert torch.equal(a.detach(), b.detach()), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where
        if isinstance(a, float):
            assert math.copysign(1, a) == math.copysign(1, b), where


# ---- byte items: hostile pickles -----------------------------------------------------------


class _Payload:
    """Pickles as a REDUCE of `fn(*args)`: what a hostile torch.save holds."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def payload(how, marker):
    if how == "os.system":
        # pickle names os.system by its defining module: posix.system on Linux.
        return _Payload(os.system, f"touch {marker}"), f"{os.system.__module__}.system"
    if how == "builtins.exec":
        return _Payload(exec, f"open({str(marker)!r}, 'w').close()"), "builtins.exec"
    return _Payload(open, str(marker), "w"), f"{open.__module__}.open"


# ckptio's writer refuses such values unless told to save them as torch does (allow_pickle=True): the reader
# must still refuse them in checkpoints that hold them.
WRITERS = {
    "torch": lambda p: dcp.FileSystemWriter(p),
    "ckptio": lambda p: cdcp.FileSystemWriter(p, allow_pickle=True),
    "ckptio-zstd": lambda p: cdcp.FileSystemWriter(p, _extensions=[cdcp.ZStandard()], allow_pickle=True),
}
TEMPLATE = {"w": torch.zeros(4), "step": 0}


def hostile_checkpoint(tmp_path, writer, how):
    marker = tmp_path / "PWNED"
    obj, global_name = payload(how, marker)
    path = tmp_path / f"ckpt-{writer}"
    # Pickling the payload runs nothing; only unpickling it would.
    save({"w": torch.arange(4.0), "step": obj}, WRITERS[writer](path))
    assert not marker.exists()
    return path, marker, global_name


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("how", ["os.system", "builtins.exec", "builtins.open"])
def test_hostile_byte_item_is_refused_and_runs_nothing(tmp_path, writer, how):
    path, marker, global_name = hostile_checkpoint(tmp_path, writer, how)
    info = info_of(metadata(path), "step")
    err = load_error(TEMPLATE, cdcp.FileSystemReader(path))
    assert isinstance(err, ckptio.CkptioError), repr(err)
    assert err.status_name == "E_DISALLOWED", err
    msg = str(err)
    # The directory, the data file, the offset, the item and the global.
    assert f"{path}/{info.relative_path}" in msg and f"offset {info.offset}" in msg, msg
    assert "step: byte item" in msg and f"global '{global_name}'" in msg, msg
    assert not marker.exists()


def test_hostile_byte_item_is_live_for_torch(tmp_path):
    """The control: torch's own reader runs the payload (its planner calls
    torch.load(weights_only=False)), and so did ckptio's reader before."""
    path, marker, _ = hostile_checkpoint(tmp_path, "torch", "os.system")
    load(TEMPLATE, dcp.FileSystemReader(path))
    assert marker.exists()


@pytest.mark.parametrize("how", ["os.system", "builtins.exec"])
def test_verify_refuses_hostile_byte_item(tmp_path, how):
    # ckptio-written: the manifest's hashes match, the content is still refused.
    path, marker, global_name = hostile_checkpoint(tmp_path, "ckptio", how)
    with pytest.raises(ckptio.CkptioError) as ei:
        cdcp.verify(path)
    assert ei.value.status_name == "E_DISALLOWED"
    assert "step: byte item" in str(ei.value) and f"global '{global_name}'" in str(ei.value), ei.value
    assert not marker.exists()
    if CKPTIO_CLI is None:
        return
    # The CLI: with a manifest (ckptio_dcp_verify) and without (torch wrote it: ckptio_dcp_check).
    tpath, _, _ = hostile_checkpoint(tmp_path, "torch", how)
    for p in (path, tpath):
        r = run_cli("verify", p)
        assert r.returncode != 0, r.stdout
        assert "step: byte item" in r.stderr and f"global '{global_name}'" in r.stderr and str(p) in r.stderr, r.stderr
    assert not marker.exists()


def test_allow_pickle_opts_out(tmp_path):
    """A trusted checkpoint holding objects outside the allowlist: refused by
    default, loaded as torch loads it with allow_pickle=True."""
    import fractions

    sd = {"w": torch.arange(3.0), "ratio": fractions.Fraction(1, 3)}
    path = tmp_path / "c"
    save(sd, dcp.FileSystemWriter(path))
    template = {"w": torch.zeros(3), "ratio": None}
    err = load_error(template, cdcp.FileSystemReader(path))
    assert err.status_name == "E_DISALLOWED" and "global 'fractions.Fraction'" in str(err), err
    assert "allow_pickle=True" in str(err)
    got = load(template, cdcp.FileSystemReader(path, allow_pickle=True))
    same(got, load(template, dcp.FileSystemReader(path)))
    assert got["ratio"] == fractions.Fraction(1, 3)
    with pytest.raises(TypeError):
        cdcp.FileSystemReader(path, allow_pickle="yes")


# ---- byte items: what real checkpoints hold -------------------------------------------------


def training_state():
    g = torch.Generator().manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(3):
        model(torch.randn(5, 4, generator=g)).sum().backward()
        opt.step()
        sched.step()
    random.seed(11)
    view = torch.arange(12.0).reshape(3, 4)[:, 1]  # a strided view of a larger storage
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),  # flattened by DCP: floats, tuples, bools, None, lists of ints, tensors
        "sched": sched.state_dict(),
        "step": 3,
        "epoch_fraction": 0.375,
        "run": "exp-ü",
        "py_rng": random.getstate(),  # (3, (625 ints), None): one byte item
        "torch_rng": torch.get_rng_state(),
        "dataloader": {"_num_yielded": 15, "_sampler_iter_yielded": 15, "_iterator_finished": False,
                       "_shared_seed": None, "dataset_state": {"epoch": 1, "files": ["a.bin", "b.bin"]}},
        # Tuples are byte items whatever they hold: every kind of value in one.
        "misc": (torch.Size([2, 3]), torch.bfloat16, torch.device("cpu"), collections.OrderedDict(a=1, b=[2]),
                 {1: "int key", (2, 3): "tuple key"}, {4, 5}, 2**70, -2**70, float("inf"), float("nan"), -0.0,
                 b"raw\x00bytes", None, True, view, torch.nn.Parameter(torch.ones(2)),
                 torch.ones(2, requires_grad=True), (model.state_dict(), opt.state_dict())),
    }


@pytest.mark.parametrize("writer", ["torch", "ckptio", "ckptio-zstd"])
def test_real_byte_items_load_as_torch_loads_them(tmp_path, writer):
    sd = training_state()
    path = tmp_path / "c"
    save(sd, WRITERS[writer](path))
    if writer == "ckptio-zstd":
        assert any(v.transform_descriptors for v in metadata(path).storage_data.values())
    want = load(sd, dcp.FileSystemReader(path)) if writer != "ckptio-zstd" else sd
    got = load(sd, cdcp.FileSystemReader(path))
    same(got, want, "state")
    same(got["misc"][14], sd["misc"][14])  # the view comes back as itself
    assert got["misc"][14].storage_offset() == 1 and got["misc"][14].untyped_storage().nbytes() == 48


def test_load_object_keeps_torch_size(tmp_path):
    """The object builder byte items share with ckptio.load keeps torch.Size (it made tuples)."""
    path = tmp_path / "s.pt"
    torch.save({"shape": torch.Size([2, 3]), "plain": (2, 3)}, path)
    got = ckptio.load(path)
    same(got, torch.load(path, weights_only=True))


# ---- data files: traversal and decompression bombs -------------------------------------------


@pytest.mark.parametrize("fqn", ["w", "step"])
@pytest.mark.parametrize("kind", ["parent", "absolute"])
def test_relative_path_leaving_the_directory_is_refused(tmp_path, fqn, kind):
    path = tmp_path / "c"
    save({"w": torch.arange(4.0), "step": 5}, dcp.FileSystemWriter(path))
    md = metadata(path)
    info = info_of(md, fqn)
    # A complete copy of the checkpoint's data outside it: a reader that
    # followed the name would load it and succeed.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(path / info.relative_path, outside / "data.distcp")
    info.relative_path = "../elsewhere/data.distcp" if kind == "parent" else str(outside / "data.distcp")
    write_metadata(path, md)
    err = load_error(TEMPLATE, cdcp.FileSystemReader(path))
    assert isinstance(err, ckptio.CkptioError) and err.status_name == "E_FORMAT", repr(err)
    assert f"relative_path '{info.relative_path}' leaves the checkpoint directory" in str(err), err
    # The control: torch follows it.
    assert load(TEMPLATE, dcp.FileSystemReader(path))["step"] == 5


def zstd_rle_frame(size: int, declare: bool) -> bytes:
    """An honest zstd frame of `size` zero bytes in RLE blocks (4 bytes per
    128 KiB), with the content size in its header or without it."""
    block = 128 << 10
    if declare:
        head = struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", size)  # 8-byte FCS, single segment
    else:
        head = struct.pack("<IBB", 0xFD2FB528, 0x00, 7 << 3)  # no FCS, 128 KiB window
    blocks = []
    left = size
    while left:
        n = min(block, left)
        left -= n
        blocks.append(struct.pack("<I", (n << 3) | (1 << 1) | (left == 0))[:3] + b"\0")
    return head + b"".join(blocks)


BOMB_RUNNER = textwrap.dedent(
    """
    import json, os, resource, sys, time, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    import ckptio.dcp as cdcp
    path = sys.argv[1]
    sd = {"w": torch.zeros(4), "step": 0}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    try:
        dcp.load(sd, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
        err = None
    except CheckpointException as e:
        (err,) = e.failures.values()
        err = err[0] if isinstance(err, tuple) else err
    elapsed = time.monotonic() - t
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"error": str(err), "status": getattr(err, "status_name", None), "seconds": elapsed,
                      "rss_growth_kib": grown}))
    """
)


@pytest.mark.parametrize("fqn", ["w", "step"])
@pytest.mark.parametrize("declare", [True, False])
def test_zstd_bomb_is_refused_at_once_in_bounded_memory(tmp_path, fqn, declare):
    path = tmp_path / "c"
    save({"w": torch.arange(4.0), "step": 5}, cdcp.FileSystemWriter(path, _extensions=[cdcp.ZStandard()]))
    md = metadata(path)
    info = info_of(md, fqn)
    # 4 GiB of zeros in 128 KiB of frames (the frame is honest: decompressing it really makes 4 GiB).
    frame = zstd_rle_frame(4 << 30, declare)
    (path / "bomb.distcp").write_bytes(frame)
    info.relative_path, info.offset, info.length = "bomb.distcp", 0, len(frame)
    write_metadata(path, md)
    (tmp_path / "runner.py").write_text(BOMB_RUNNER)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(path)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "E_FORMAT", out
    # A tensor item's frame of zeros without a declared size is refused on its first decoded bytes (no zip
    # header), before the bound is reached.
    why = "not a torch.save archive" if fqn == "w" and not declare else "decompression bomb"
    assert why in out["error"] and f"{fqn}: zstd" in out["error"], out
    assert "bomb.distcp" in out["error"], out
    # Refused from the header (declared) or after counting at most the
    # item's bound (64 MiB + the chunk for a tensor item, 1 GiB for a byte
    # item) in scratch memory: nothing near 4 GiB is ever allocated.
    assert out["seconds"] < 20, out
    assert out["rss_growth_kib"] < 256 << 10, out
    if CKPTIO_CLI is not None:  # the C directory reader refuses the same item
        r = run_cli("verify", path)
        assert r.returncode != 0 and why in r.stderr, r.stderr


def _seeds():
    """tests/data/make_zstd_seeds.py: zstd frames written by hand, archive edges."""
    spec = importlib.util.spec_from_file_location("make_zstd_seeds", REPO / "tests" / "data" / "make_zstd_seeds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def declared_large_checkpoint(tmp_path, numel: int):
    """A DCP directory of ~150 KB whose .metadata declares tensor 'w' of `numel`
    float32 stored as one zstd frame: an honest torch.save archive of that many
    zeros (its storage in RLE blocks). No ckptio manifest, so `ckptio verify`
    checks every item's structure."""
    path = tmp_path / "declared"
    save({"w": torch.arange(4.0), "step": 5}, cdcp.FileSystemWriter(path, _extensions=[cdcp.ZStandard()]))
    for manifest in path.glob(".ckptio-manifest-*.json"):
        manifest.unlink()
    seeds = _seeds()
    head, nbytes, tail = seeds.zeros_archive_edges(numel, str(tmp_path / "edges.pt"))
    frame = seeds.frame([head, nbytes, tail])
    (path / "bomb.distcp").write_bytes(frame)
    md = metadata(path)
    tmd = md.state_dict_metadata["w"]
    tmd.size = torch.Size([numel])
    tmd.chunks[0].sizes = torch.Size([numel])
    info = info_of(md, "w")
    info.relative_path, info.offset, info.length = "bomb.distcp", 0, len(frame)
    write_metadata(path, md)
    return path, len(frame)


CHILD_RUNNER = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    t = time.monotonic()
    r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)
    print(json.dumps({"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "seconds": time.monotonic() - t,
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
    """
)


def measured(tmp_path, *args):
    """Runs the ckptio command in a child of a fresh runner: its exit status,
    output, seconds and peak RSS (ru_maxrss of the runner's children)."""
    runner = tmp_path / "child_runner.py"
    runner.write_text(CHILD_RUNNER)
    r = subprocess.run([sys.executable, str(runner), CKPTIO_CLI, *map(str, args)], capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@requires_cli
def test_declared_large_zstd_tensor_is_verified_and_converted_in_bounded_memory(tmp_path):
    # 4 GiB declared and honestly held by 130 KB of frames: verify decompresses it through a fixed buffer
    # (twice the 4 GB and 11 s before), convert streams it to the output (8.4 GB and 17 s before).
    numel = 1 << 30
    path, stored = declared_large_checkpoint(tmp_path, numel)
    assert stored < 200 << 10
    out = measured(tmp_path, "verify", path)
    assert out["rc"] == 0 and "ok (DCP, 1 tensor" in out["stdout"], out
    assert out["maxrss_kib"] < 300 << 10, out
    assert out["seconds"] < 20, out
    dest = tmp_path / "out.safetensors"
    out = measured(tmp_path, "convert", path, dest)
    assert out["rc"] == 0, out
    assert out["maxrss_kib"] < 300 << 10, out
    assert out["seconds"] < 30, out
    with open(dest, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        assert header["w"]["shape"] == [numel] and header["w"]["data_offsets"] == [0, 4 * numel], header
        for at in (8 + n, 8 + n + 4 * numel - (1 << 20)):
            f.seek(at)
            assert f.read(1 << 20) == bytes(1 << 20)
    st = os.stat(dest)
    assert st.st_size == 8 + n + 4 * numel
    # Pieces of zeros are not written (the new file reads as zeros there): 4 GiB of output, no 4 GiB of disk.
    assert st.st_blocks * 512 < 64 << 20, st.st_blocks


LOAD_RUNNER = textwrap.dedent(
    """
    import json, resource, sys, time, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed.checkpoint as dcp
    import ckptio.dcp as cdcp
    path, numel = sys.argv[1], int(sys.argv[2])
    sd = {"w": torch.ones(numel), "step": 0}  # the caller's memory, touched before measuring
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    dcp.load(sd, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    print(json.dumps({"seconds": time.monotonic() - t, "zeros": bool((sd["w"] == 0).all()), "step": sd["step"],
                      "rss_growth_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}))
    """
)


def test_declared_large_zstd_tensor_loads_into_the_callers_tensor_only(tmp_path):
    # 256 MiB declared: the caller's tensor is the only memory of that size; the reader decompresses the
    # frames straight into it (before: the decoded archive and a copy of it, 512 MiB more).
    numel = 1 << 26
    path, _ = declared_large_checkpoint(tmp_path, numel)
    (tmp_path / "load_runner.py").write_text(LOAD_RUNNER)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(tmp_path / "load_runner.py"), str(path), str(numel)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["zeros"] and out["step"] == 5, out
    assert out["rss_growth_kib"] < 96 << 10, out
    assert out["seconds"] < 20, out


def test_large_zstd_items_stream_their_real_values(tmp_path):
    # Above the 64 MiB held in memory, a zstd item is read from its frames as they decompress: the values
    # (not zeros) come back exactly through the reader, `ckptio convert` and `ckptio verify`. "w" (80 MiB) is
    # streamed to the converted file; "m" (64 MiB, an archive just over 64 MiB) is assembled by
    # ckptio_dcp_read_tensor from its frames as they pass.
    w = torch.arange(20 << 20, dtype=torch.float32).reshape(5 << 10, 4 << 10)
    m = -torch.arange(16 << 20, dtype=torch.float32).reshape(4 << 10, 4 << 10)
    sd = {"w": w, "m": m, "b": torch.arange(1000, dtype=torch.int64), "step": 7}
    path = tmp_path / "real"
    save(sd, cdcp.FileSystemWriter(path, _extensions=[cdcp.ZStandard()]))
    back = load({"w": torch.zeros_like(w), "m": torch.zeros_like(m), "b": torch.zeros(1000, dtype=torch.int64),
                 "step": 0}, cdcp.FileSystemReader(path))
    assert torch.equal(back["w"], w) and torch.equal(back["m"], m) and torch.equal(back["b"], sd["b"])
    assert back["step"] == 7
    if CKPTIO_CLI is not None:
        r = run_cli("verify", path)
        assert r.returncode == 0, r.stderr
        r = run_cli("convert", path, tmp_path / "real.safetensors")
        assert r.returncode == 0, r.stderr
        from safetensors.torch import load_file
        got = load_file(str(tmp_path / "real.safetensors"))
        assert torch.equal(got["w"], w) and torch.equal(got["m"], m) and torch.equal(got["b"], sd["b"])


@requires_cli
def test_convert_refuses_chunks_that_share_stored_bytes(tmp_path):
    # Two chunks of one tensor stored in the same bytes: one stored range would stand for many chunks, and the
    # conversion's buffer for the tensor would not be justified by bytes on disk.
    path = tmp_path / "shared"
    save({"w": torch.arange(8.0)}, dcp.FileSystemWriter(path))
    md = metadata(path)
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
    tmd = md.state_dict_metadata["w"]
    tmd.size = torch.Size([16])
    tmd.chunks = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([8])),
                  ChunkStorageMetadata(offsets=torch.Size([8]), sizes=torch.Size([8]))]
    info = info_of(md, "w")
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != "w"}
    md.storage_data[MetadataIndex("w", torch.Size([0]))] = info
    md.storage_data[MetadataIndex("w", torch.Size([8]))] = dataclasses.replace(info)
    write_metadata(path, md)
    r = run_cli("convert", path, tmp_path / "out.safetensors")
    assert r.returncode != 0, r.stdout
    assert "w: chunks 0 and 1 are stored in overlapping bytes of the file" in r.stderr, r.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_a_chain_of_many_zstd_transforms_says_what_is_wrong(tmp_path):
    path = tmp_path / "chain"
    save({"w": torch.arange(4.0), "step": 5}, cdcp.FileSystemWriter(path, _extensions=[cdcp.ZStandard()]))
    md = metadata(path)
    info_of(md, "w").transform_descriptors = ["stream.zstd/1"] * 100_000
    write_metadata(path, md)
    t = time.monotonic()
    err = load_error(TEMPLATE, cdcp.FileSystemReader(path))
    assert isinstance(err, ckptio.CkptioError) and err.status_name == "E_UNSUPPORTED", repr(err)
    assert "item 'w' has 100000 transforms (100000 of them stream.zstd); ckptio reads at most one " \
           "'stream.zstd/1'" in str(err), err
    assert time.monotonic() - t < 10
    if CKPTIO_CLI is not None:
        for command in ("verify", "inspect"):
            t = time.monotonic()
            r = run_cli(command, path)
            assert r.returncode != 0, r.stdout
            assert "the item has 100000 transforms, all 'stream.zstd/1'; ckptio reads at most one 'stream.zstd/1'" \
                in r.stderr, r.stderr
            assert "storage_data['w'" in r.stderr, r.stderr
            assert time.monotonic() - t < 10
        # One that is not zstd is named with its place in the list.
        info_of(md, "w").transform_descriptors = ["stream.zstd/1", "stream.rot13/1"]
        write_metadata(path, md)
        r = run_cli("verify", path)
        assert "unsupported transform 'stream.rot13/1' (descriptor 2 of 2): ckptio reads only 'stream.zstd/1'" \
            in r.stderr, r.stderr


# ---- custom stream transforms --------------------------------------------------------------


def rot13_registry():
    from torch.testing._internal.distributed.checkpoint_utils import Rot13Example

    registry = ExtensionRegistry()
    registry.register(Rot13Example)
    return registry


def rot13_checkpoint(tmp_path):
    from torch.testing._internal.distributed.checkpoint_utils import Rot13Example

    sd = {"w": torch.randn(40, 3, generator=torch.Generator().manual_seed(1)), "step": 17,
          "name": "Hello Rot13 World", "opt": ({"lr": 0.5, "betas": (0.9, 0.99)}, torch.arange(5))}
    path = tmp_path / "rot13"
    save(sd, dcp.FileSystemWriter(path, _extensions=[Rot13Example()]))
    assert all(v.transform_descriptors == ["stream.rot13/1"] for v in metadata(path).storage_data.values())
    return sd, path


def test_custom_transform_loads_through_the_registry(tmp_path):
    sd, path = rot13_checkpoint(tmp_path)
    template = {"w": torch.zeros(40, 3), "step": 0, "name": None, "opt": None}
    want = load(template, dcp.FileSystemReader(path, _extension_registry=rot13_registry()))
    got = load(template, cdcp.FileSystemReader(path, _extension_registry=rot13_registry()))
    same(got, want)
    same(got, sd)


def test_custom_transform_without_registry_fails_at_planning(tmp_path, monkeypatch):
    _, path = rot13_checkpoint(tmp_path)
    template = {"w": torch.zeros(40, 3), "step": 0, "name": None, "opt": None}

    def never(*args, **kwargs):
        raise AssertionError("read_data ran: the transform must be refused while the load is planned")

    monkeypatch.setattr(cdcp.FileSystemReader, "read_data", never)
    err = load_error(template, cdcp.FileSystemReader(path))
    assert isinstance(err, ckptio.CkptioError) and err.status_name == "E_UNSUPPORTED", repr(err)
    assert re.search(r"unsupported transform 'stream.rot13/1' of item '(w|step|name|opt)'", str(err)), err
    assert "_extension_registry" in str(err)


class _Xor(StreamTransformExtension):
    """Does not commute with rot13: the order of two transforms matters."""

    @staticmethod
    def registry_name():
        return "stream.xor"

    @staticmethod
    def from_descriptor(version):
        return _Xor()

    def get_descriptor(self):
        return "stream.xor/1"

    def transform_to(self, output):
        class Writer(io.RawIOBase):
            def writable(self):
                return True

            def write(self, b):
                b = bytes(b)
                output.write(bytes(x ^ 0x41 for x in b))
                return len(b)

        return Writer()

    def transform_from(self, input):
        return io.BytesIO(bytes(x ^ 0x41 for x in input.read()))


def test_two_custom_transforms_are_undone_in_reverse(tmp_path):
    from torch.testing._internal.distributed.checkpoint_utils import Rot13Example

    sd = {"w": torch.arange(10.0), "name": "Hello World"}
    path = tmp_path / "c"
    save(sd, dcp.FileSystemWriter(path, _extensions=[Rot13Example(), _Xor()]))
    registry = rot13_registry()
    registry.register(_Xor)
    same(load({"w": torch.zeros(10), "name": None}, cdcp.FileSystemReader(path, _extension_registry=registry)), sd)


def test_writer_refuses_custom_transforms(tmp_path):
    from torch.testing._internal.distributed.checkpoint_utils import Rot13Example

    with pytest.raises(ValueError, match="zstd"):
        cdcp.FileSystemWriter(tmp_path / "c", _extensions=[Rot13Example()])


# ---- many chunks -----------------------------------------------------------------------------

CHUNKS = 150_000


def many_chunks_metadata(path, n, overlap=False):
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                       TensorProperties, TensorStorageMetadata)

    offsets, sizes = list(range(n)), [1] * n
    if overlap:  # same volume: one element covered twice, the last one not at all
        sizes[n // 2], sizes[n - 1] = 2, 0
    chunks = [ChunkStorageMetadata(offsets=torch.Size([o]), sizes=torch.Size([s])) for o, s in zip(offsets, sizes)]
    storage = {MetadataIndex("w", torch.Size([o])): _StorageInfo(f"__{o % 7}_0.distcp", o * 4, 4) for o in offsets}
    md = Metadata(state_dict_metadata={"w": TensorStorageMetadata(TensorProperties(dtype=torch.float32),
                                                                  torch.Size([n]), chunks)},
                  storage_data=storage)
    path.mkdir()
    write_metadata(path, md)


@requires_cli
def test_many_chunks_are_checked_in_seconds(tmp_path):
    many_chunks_metadata(tmp_path / "ok", CHUNKS)
    many_chunks_metadata(tmp_path / "bad", CHUNKS, overlap=True)
    t = time.monotonic()
    r = run_cli("inspect", tmp_path / "ok")
    assert r.returncode == 0 and f"{CHUNKS}" in r.stdout, r.stderr
    assert time.monotonic() - t < 10
    # verify checks the tiling (the files are 7 ranks': torch's planner would have checked it), then reads items:
    # the data files do not exist.
    t = time.monotonic()
    r = run_cli("verify", tmp_path / "ok")
    assert r.returncode != 0 and "__0_0.distcp" in r.stderr and "No such file" in r.stderr, r.stderr
    assert time.monotonic() - t < 10
    t = time.monotonic()
    r = run_cli("verify", tmp_path / "bad")
    assert r.returncode != 0 and f"chunks {CHUNKS // 2} and {CHUNKS // 2 + 1} overlap" in r.stderr, r.stderr
    assert time.monotonic() - t < 10


# ---- two ranks: the load-once broadcast path ----------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    import ckptio.dcp as cdcp
    rank, world, store, path, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    reader = cdcp.FileSystemReader(path, broadcast=True)
    sd = {"w": torch.zeros(4), "step": 0, "misc": None}
    try:
        dcp.load(sd, storage_reader=reader)
    except CheckpointException as e:
        errs = [getattr(x[0] if isinstance(x, tuple) else x, "status_name", None) for x in e.failures.values()]
        print("ERR", rank, json.dumps([errs, str(e)]), flush=True)
        os._exit(0)
    print("OK", rank, json.dumps([sd["step"], repr(sd["misc"]), reader.last_read_stats["items_shared"]]), flush=True)
    os._exit(0)
    """
)


def test_broadcast_path_checks_byte_items(tmp_path):
    marker = tmp_path / "PWNED"
    good, bad = tmp_path / "good", tmp_path / "bad"
    save({"w": torch.arange(4.0), "step": 9, "misc": (torch.Size([3]), "x")}, cdcp.FileSystemWriter(good))
    save({"w": torch.arange(4.0), "step": 9, "misc": _Payload(os.system, f"touch {marker}")},
         cdcp.FileSystemWriter(bad, allow_pickle=True))
    (tmp_path / "worker.py").write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    for path, mode in ((good, "good"), (bad, "bad")):
        store = tmp_path / f"store-{mode}"
        procs = [subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(r), "2", str(store), str(path),
                                   mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        try:
            outs = [p.communicate(timeout=120)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for r, out in enumerate(outs):
            line = next((ln for ln in out.splitlines() if ln.startswith(("OK ", "ERR "))), None)
            assert line is not None, out[-3000:]
            if mode == "good":
                assert line.startswith("OK"), out[-3000:]
                step, misc, shared = json.loads(line.split(" ", 2)[2])
                assert step == 9 and misc == repr((torch.Size([3]), "x")) and shared > 0, line
            else:
                assert line.startswith("ERR"), out[-3000:]
                errs, text = json.loads(line.split(" ", 2)[2])
                assert "E_DISALLOWED" in errs and f"global '{os.system.__module__}.system'" in text, line
    assert not marker.exists()
