"""Generates the DCP directory fixtures of tests/test_dcp_dir.c and test_dcp_hostile.c (run once; the
output is committed). Needs torch (CPU) and ckptio's Python package:

    PYTHONPATH=python python3 tests/data/make_dcp_fixtures.py          # all of them
    PYTHONPATH=python python3 tests/data/make_dcp_fixtures.py legacy   # only the legacy_* ones

Writes into tests/data/dcp/:
  ts/       stock torch FileSystemWriter, TORCH_SAVE, one process
  st/       stock torch FileSystemWriter, SAFETENSORS, one process
  zstd/     ckptio.dcp.FileSystemWriter with ckptio.dcp.ZStandard (manifest)
  sharded/  ckptio.dcp.FileSystemWriter on 2 gloo ranks, DTensors (manifest)
  sharded_torch/  stock torch on the same 2 ranks (no manifest)
  legacy_compat/   .metadata naming torch <= 2.2's TensorProperties and
                   MEM_FORMAT_ENCODING (torch.distributed._shard.sharded_tensor.metadata),
                   made as torch's TestDCPCompatbility.test_sharded_tensor_dependency
                   makes one: this torch's writer with the old class patched in
  legacy_torch22/  the same state dict written by torch 2.2.2 itself, when
                   CKPTIO_TEST_OLD_TORCH_PYTHON names an interpreter that imports it
                   (otherwise the committed directory is kept), e.g.
                     pip download --no-deps torch==2.2.2 + its nvidia-*-cu12 pins,
                     pip install --no-deps --target /tmp/t22 (those wheels) "numpy<2"
                       sympy networkx jinja2 filelock fsspec typing-extensions
                     CKPTIO_TEST_OLD_TORCH_PYTHON="env PYTHONPATH=/tmp/t22 python3.11"
and NAME.expected.safetensors: the full state dict's tensors, for comparing
assembled bytes; bad_*.metadata: broken variants of ts/, sharded/ and
legacy_torch22/ .metadata (the test copies the directory and swaps the file
in). Small on purpose (alignment 64 for ckptio's writer).
Hostile inputs (hostile_fixtures(), also run alone with --hostile):
  hostile_bytes/  ckptio.dcp.FileSystemWriter (manifest): byte item 'step' is
                  a torch.save whose pickle calls posix.system (never run)
  bad_zstd_bomb_{w,step}{,_nosize}.metadata: zstd/ with item 'w' or 'step'
                  moved to bomb.distcp, a zstd frame of 4 GiB of zeros in
                  128 KiB (with and without a declared content size); the
                  test writes bomb.distcp (zstd_rle_frame, same layout)
"""
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.filesystem import SerializationFormat

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "dcp")
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
import ckptio.dcp as cdcp  # noqa: E402


def single_state():
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": (torch.arange(5, dtype=torch.float32) / 4).to(torch.bfloat16),
        "s": torch.tensor(2.5, dtype=torch.float64),
        # A transposed view: torch.save keeps its strides inside the item.
        "t": torch.arange(6, dtype=torch.int16).reshape(2, 3).t(),
        "nested": {"m": torch.full((2, 2), 7, dtype=torch.int64)},
        "step": 7,
    }


def tensors_of(sd, prefix=""):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(tensors_of(v, prefix + k + "."))
        elif isinstance(v, torch.Tensor):
            out[prefix + k] = v.contiguous()
    return out


def fresh(name):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


WORKER = r'''
import os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, Replicate, distribute_tensor
import ckptio.dcp as cdcp
rank, store, mine, theirs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
mesh = init_device_mesh("cpu", (2,))
A = torch.arange(15, dtype=torch.float32).reshape(5, 3)          # 5 rows over 2 ranks: 3 + 2
B = torch.arange(12, dtype=torch.int32).reshape(2, 6) * 3          # by columns
R = torch.tensor([1.5, -2.0, 0.25])                                  # replicated: saved once
sd = {"A": distribute_tensor(A, mesh, [Shard(0)]), "B": distribute_tensor(B, mesh, [Shard(1)]),
      "R": distribute_tensor(R, mesh, [Replicate()]), "step": 11}
dcp.save(sd, storage_writer=cdcp.FileSystemWriter(mine, alignment=64))
dcp.save(sd, storage_writer=dcp.FileSystemWriter(theirs))
dist.barrier()
dist.destroy_process_group()
'''


# Run by an old torch (CKPTIO_TEST_OLD_TORCH_PYTHON): single_state() saved with its
# own FileSystemWriter (the source of single_state is prepended).
OLD_TORCH_WORKER = r'''
import sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed.checkpoint as dcp
dcp.save(single_state(), storage_writer=dcp.FileSystemWriter(sys.argv[1]), no_dist=True)
print(torch.__version__)
'''


def legacy():
    """Directories whose .metadata names the classes torch <= 2.2 pickled."""
    import inspect
    import pickle
    from unittest.mock import patch

    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties as legacy_props

    sd = single_state()
    # Exactly torch's test_sharded_tensor_dependency: the metadata module's
    # TensorProperties swapped for the old class while saving.
    # Relative path: StorageMeta.checkpoint_id keeps it, and no local path belongs in the fixture.
    fresh("legacy_compat")
    with contextlib.chdir(OUT), patch("torch.distributed.checkpoint.metadata.TensorProperties", legacy_props):
        dcp.save(sd, storage_writer=dcp.FileSystemWriter("legacy_compat"), no_dist=True)
    names = ["legacy_compat"]
    old = os.environ.get("CKPTIO_TEST_OLD_TORCH_PYTHON")
    if old:
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "old_torch_worker.py")
            with open(script, "w") as f:
                f.write("import torch\n" + inspect.getsource(single_state) + OLD_TORCH_WORKER)
            out = subprocess.run(shlex.split(old) + [script, fresh("legacy_torch22")], check=True,
                                 capture_output=True, text=True).stdout
            if not out.strip().startswith("2.2."):
                raise SystemExit(f"CKPTIO_TEST_OLD_TORCH_PYTHON runs torch {out.strip()}, not 2.2")
        names.append("legacy_torch22")
    else:
        print("CKPTIO_TEST_OLD_TORCH_PYTHON not set: legacy_torch22/ kept as committed")
    for name in names:
        with open(os.path.join(OUT, name, ".metadata"), "rb") as f:
            data = f.read()
        assert b"torch.distributed._shard.sharded_tensor.metadata" in data and b"MEM_FORMAT_ENCODING" in data
        save_file(tensors_of(sd), os.path.join(OUT, name + ".expected.safetensors"))

    # legacy_torch22 with memory format 7 for "w": MEM_FORMAT_ENCODING has members 0-2.
    with open(os.path.join(OUT, "legacy_torch22", ".metadata"), "rb") as f:
        md = pickle.load(f)
    target = md.state_dict_metadata["w"].properties
    good_state = type(target).__getstate__

    def bad_state(self):
        state = good_state(self)
        return state[:3] + (_BadMemFormat(),) + state[4:5] if self is target else state[:5]

    with patch.object(type(target), "__getstate__", bad_state):
        with open(os.path.join(OUT, "bad_memformat.metadata"), "wb") as f:
            pickle.dump(md, f)


class _BadMemFormat:
    """Pickles as MEM_FORMAT_ENCODING(7), which no torch defines."""

    def __reduce__(self):
        from torch.distributed._shard.sharded_tensor.metadata import MEM_FORMAT_ENCODING
        return MEM_FORMAT_ENCODING, (7,)


def chmod_all():
    for name in os.listdir(OUT):
        os.chmod(os.path.join(OUT, name), 0o755 if os.path.isdir(os.path.join(OUT, name)) else 0o644)
        if os.path.isdir(os.path.join(OUT, name)):
            for f in os.listdir(os.path.join(OUT, name)):
                os.chmod(os.path.join(OUT, name, f), 0o644)


def main():
    os.makedirs(OUT, exist_ok=True)
    warnings.simplefilter("ignore")
    if sys.argv[1:] == ["legacy"]:
        legacy()
        chmod_all()
        return
    sd = single_state()
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(fresh("ts")), no_dist=True)
    # torch's SAFETENSORS writer refuses non-contiguous tensors.
    sd_st = dict(sd, t=sd["t"].contiguous())
    dcp.save(sd_st, storage_writer=dcp.FileSystemWriter(fresh("st"), serialization_format=SerializationFormat.SAFETENSORS),
             no_dist=True)
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(fresh("zstd"), alignment=64, _extensions=[cdcp.ZStandard()]),
             no_dist=True)
    for name in ("ts", "st", "zstd"):
        save_file(tensors_of(sd), os.path.join(OUT, name + ".expected.safetensors"))

    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
        mine, theirs = fresh("sharded"), fresh("sharded_torch")
        procs = [subprocess.Popen([sys.executable, script, str(r), os.path.join(tmp, "store"), mine, theirs], env=env)
                 for r in range(2)]
        for p in procs:
            if p.wait(timeout=300) != 0 and not os.path.exists(os.path.join(theirs, ".metadata")):
                # gloo teardown sometimes aborts after the saves completed; only a missing save counts.
                raise SystemExit("a rank failed")
    full = {"A": torch.arange(15, dtype=torch.float32).reshape(5, 3),
            "B": torch.arange(12, dtype=torch.int32).reshape(2, 6) * 3,
            "R": torch.tensor([1.5, -2.0, 0.25])}
    for name in ("sharded", "sharded_torch"):
        save_file(full, os.path.join(OUT, name + ".expected.safetensors"))
    bad_variants()
    legacy()
    chmod_all()


def bad_variants():
    """Broken .metadata files, made by editing the real object graph."""
    import copy
    import dataclasses
    import pickle

    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def load(name):
        with open(os.path.join(OUT, name, ".metadata"), "rb") as f:
            return pickle.load(f)

    def dump(md, name):
        with open(os.path.join(OUT, name), "wb") as f:
            pickle.dump(md, f)

    def relpath(md, path):
        md = copy.deepcopy(md)
        for info in md.storage_data.values():
            info.relative_path = path
        return md

    ts = load("ts")
    dump(relpath(ts, "../evil.distcp"), "bad_traversal.metadata")
    dump(relpath(ts, "/etc/passwd"), "bad_absolute.metadata")
    md = copy.deepcopy(ts)
    for info in md.storage_data.values():
        info.transform_descriptors = ["stream.gzip/1"]
    dump(md, "bad_transform.metadata")
    md = copy.deepcopy(ts)
    md.state_dict_metadata["w"].chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0, 0]), sizes=torch.Size([3, 4]))]
    dump(md, "bad_dims.metadata")
    md = copy.deepcopy(ts)  # w's one chunk covers rows 0..1 of 3: a gap
    md.state_dict_metadata["w"].chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 4]))]
    dump(md, "bad_gap.metadata")
    sh = load("sharded")  # A's second chunk moved up one row: overlaps the first
    md = copy.deepcopy(sh)
    chunks = md.state_dict_metadata["A"].chunks
    moved = [c for c in chunks if c.offsets[0] != 0][0]
    old = moved.offsets
    moved.offsets = torch.Size([old[0] - 1, 0])
    moved.sizes = torch.Size([moved.sizes[0] + 1, 3])
    for idx in list(md.storage_data):
        if idx.fqn == "A" and idx.offset == old:
            info = md.storage_data.pop(idx)
            md.storage_data[dataclasses.replace(idx, offset=moved.offsets)] = info
    dump(md, "bad_overlap.metadata")


def zstd_rle_frame(size, declare):
    """An honest zstd frame of `size` zero bytes in RLE blocks (4 bytes per
    128 KiB), with the content size in its header or without it (as
    tests/test_dcp_hostile.c builds it)."""
    import struct

    if declare:
        head = struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", size)  # 8-byte size, single segment
    else:
        head = struct.pack("<IBB", 0xFD2FB528, 0x00, 7 << 3)  # no size, 128 KiB window
    blocks, left = [], size
    while left:
        n = min(128 << 10, left)
        left -= n
        blocks.append(struct.pack("<I", (n << 3) | (1 << 1) | (left == 0))[:3] + b"\0")
    return head + b"".join(blocks)


class _Payload:
    """Pickles as posix.system("true"): a hostile byte item (never unpickled here)."""

    def __reduce__(self):
        return os.system, ("true",)


def hostile_fixtures():
    import copy
    import pickle

    warnings.simplefilter("ignore")
    dcp.save({"w": torch.arange(4, dtype=torch.float32), "step": _Payload()},
             storage_writer=cdcp.FileSystemWriter(fresh("hostile_bytes"), alignment=64), no_dist=True)
    with open(os.path.join(OUT, "zstd", ".metadata"), "rb") as f:
        zmd = pickle.load(f)
    for fqn in ("w", "step"):
        for declare in (True, False):
            md = copy.deepcopy(zmd)
            info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
            info.relative_path, info.offset, info.length = "bomb.distcp", 0, len(zstd_rle_frame(4 << 30, declare))
            with open(os.path.join(OUT, f"bad_zstd_bomb_{fqn}{'' if declare else '_nosize'}.metadata"), "wb") as f:
                pickle.dump(md, f)


if __name__ == "__main__":
    if sys.argv[1:] == ["--hostile"]:
        hostile_fixtures()
    else:
        main()
        hostile_fixtures()
