"""Mapped CPU loads (``ckptio.load(path, mmap=True)``, ``ckptio.open(path,
mmap=True)``) and loads of many small tensors.

- every dtype bit-exact, for files of ckptio and of safetensors, HF
  directories and torch.save files, and the tensors are views of the file's
  mapping (found in /proc/self/maps), as safetensors and torch.load(mmap=True)
  give them;
- private, copy-on-write: writing a tensor never changes the file;
- a file renamed over keeps the old mapping's bytes;
- a file truncated in place under a mapping is CkptioError E_TRUNCATED naming
  the file in every ckptio call that reads that memory (saves of every format,
  with checksums, truncated before or during the call), never a SIGBUS
  (those checks run in a child process: a SIGBUS kills the child, not the
  test run);
- 100,000 tiny tensors of mixed dtypes and shapes, copied and mapped, each
  one its own bytes.
"""

import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import ckptio  # noqa: E402
from conftest import TORCH_DTYPES, random_tensor, tensor_bytes  # noqa: E402
from safetensors.torch import save_file as st_save_file  # noqa: E402

ST_DTYPES = [name for name, in_st in TORCH_DTYPES if in_st]
SHAPES = [(), (0,), (3, 0, 2), (7,), (4, 6), (2, 3, 4), (300, 70)]


def _shape_for(dtype_name, shape):
    return (1,) if dtype_name == "float4_e2m1fn_x2" and shape == () else shape


def mapped_ranges(path):
    """[start, end) of every mapping of `path` in this process."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].strip() == real:
                lo, hi = fields[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def assert_mapped(t, path):
    if t.numel() == 0:
        return
    ranges = mapped_ranges(path)
    assert any(lo <= t.data_ptr() < hi for lo, hi in ranges), f"{t.data_ptr():#x} is not in a mapping of {path}"


@pytest.mark.parametrize("writer", ["ckptio", "safetensors"])
@pytest.mark.parametrize("dtype_name", ST_DTYPES)
def test_mapped_loads_are_bit_exact_for_every_dtype(tmp_path, dtype_name, writer):
    dtype = getattr(torch, dtype_name)
    sd = {f"t{i}": random_tensor(dtype, _shape_for(dtype_name, s), seed=i) for i, s in enumerate(SHAPES)}
    path = str(tmp_path / "m.safetensors")
    if writer == "ckptio":
        ckptio.save(sd, path)
    else:
        st_save_file(sd, path)
    out = ckptio.load(path, mmap=True)
    assert list(out) == sorted(sd)
    for name, t in sd.items():
        assert out[name].dtype == dtype and out[name].shape == t.shape, name
        assert tensor_bytes(out[name]) == tensor_bytes(t), name
        assert_mapped(out[name], path)
    with ckptio.open(path, mmap=True) as f:
        one = f.get_tensor("t6")
    assert tensor_bytes(one) == tensor_bytes(sd["t6"])
    assert_mapped(one, path)


def test_storages_as_safetensors_and_torch_give_them(tmp_path):
    """A large tensor's storage is its own bytes; small neighbours share one
    of at most 16 MiB; torch.save of either writes no more than that."""
    sd = {"big": torch.randn(512, 1024), **{f"small.{i}": torch.randn(8) for i in range(10)}}
    path = tmp_path / "m.safetensors"
    ckptio.save(sd, path)
    for mmap in (False, True):
        out = ckptio.load(path, mmap=mmap)
        assert out["big"].untyped_storage().nbytes() == 512 * 1024 * 4
        assert out["small.3"].untyped_storage().nbytes() < 1 << 20
        assert out["small.3"].untyped_storage().data_ptr() == out["small.4"].untyped_storage().data_ptr()
        out["small.3"].fill_(7)  # neighbours are other bytes
        assert torch.equal(out["small.4"], sd["small.4"])
        torch.save(out["big"], tmp_path / "big.pt")
        assert os.path.getsize(tmp_path / "big.pt") < 512 * 1024 * 4 + (64 << 10)


def test_writes_are_private_copy_on_write(tmp_path):
    sd = {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(10)}
    path = tmp_path / "m.safetensors"
    ckptio.save(sd, path)
    before = path.read_bytes()
    out = ckptio.load(path, mmap=True)
    out["a"][5] = -1.0
    out["b"].add_(1)
    assert path.read_bytes() == before
    again = ckptio.load(path, mmap=True)
    assert again["a"][5] == 5.0 and torch.equal(again["b"], sd["b"])
    assert out["a"][5] == -1.0


def test_hf_directory_mapped(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    shards = {"model-00001-of-00002.safetensors": {"embed": torch.randn(100, 16), "norm": torch.randn(16)},
              "model-00002-of-00002.safetensors": {"lm_head": torch.randn(100, 16).half(),
                                                   "layers.0.w": torch.randn(16, 16).to(torch.bfloat16)}}
    weight_map = {}
    for name, part in shards.items():
        st_save_file(part, str(d / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0},
                                                                "weight_map": weight_map}))
    out = ckptio.load(d, mmap=True)
    for name, part in shards.items():
        for k, t in part.items():
            assert tensor_bytes(out[k]) == tensor_bytes(t) and out[k].dtype == t.dtype, k
            assert_mapped(out[k], d / name)


def test_torch_files_mapped(tmp_path):
    base = torch.randn(64, 64)
    obj = {"w": torch.nn.Parameter(torch.randn(32, 8)), "view": base[3:10, ::2], "base": base,
           "ints": torch.arange(100, dtype=torch.int64), "nested": [torch.ones(3, dtype=torch.bfloat16), 5],
           "step": 7}
    for writer in ("torch", "ckptio"):
        path = tmp_path / f"{writer}.pt"
        if writer == "torch":
            torch.save(obj, path)
        else:
            ckptio.save(obj, path)
        out = ckptio.load(path, mmap=True)
        ref = torch.load(path, mmap=True, weights_only=True)
        assert isinstance(out["w"], torch.nn.Parameter) and out["step"] == 7
        for k in ("w", "view", "base", "ints"):
            assert torch.equal(out[k], ref[k]) and out[k].stride() == ref[k].stride(), k
            assert_mapped(out[k], path)
        assert torch.equal(out["nested"][0], obj["nested"][0])
        # Views keep sharing their storage, as in the file.
        assert out["view"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()
        out["base"][3, 0] = 1234.0
        assert out["view"][0, 0] == 1234.0
        with ckptio.open(path, mmap=True) as f:
            assert torch.equal(f.get_tensor("ints"), obj["ints"])


def test_renamed_over_keeps_the_old_bytes(tmp_path):
    path = tmp_path / "m.safetensors"
    old = {"a": torch.randn(1000), "b": torch.randn(70000)}
    ckptio.save(old, path)
    out = ckptio.load(path, mmap=True)
    ckptio.save({"a": torch.zeros(1000), "b": torch.zeros(70000)}, path)  # a new file renamed over the name
    assert torch.equal(out["a"], old["a"]) and torch.equal(out["b"], old["b"])
    ckptio.save(out, tmp_path / "copy.safetensors")
    assert torch.equal(ckptio.load(tmp_path / "copy.safetensors")["b"], old["b"])


def test_refusals(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(3)}, path)
    with pytest.raises(ValueError, match="mmap"):
        ckptio.load(path, "cuda", mmap=True)
    with pytest.raises(ValueError, match="mmap"):
        ckptio.load(path, out={"a": torch.empty(3)}, mmap=True)
    with pytest.raises(ValueError, match="mmap"):
        ckptio.load(path, mmap=True, process_group=object())


# ---- a file truncated under a mapping ------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys, torch, ckptio
    src, out, fmt, when, checksums = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
    sd = ckptio.load(src, mmap=True)
    calls = []
    def shrink(done, total):
        if not calls:
            os.truncate(src, 8)
        calls.append(done)
    if when == "before":
        os.truncate(src, 8)
    try:
        ckptio.save(sd, out, format=fmt, checksums=checksums, progress=shrink if when == "during" else None)
    except ckptio.CkptioError as exc:
        print("ERROR", exc.status_name, exc)
    else:
        print("SAVED")
""")


@pytest.mark.parametrize("fmt,checksums", [("safetensors", False), ("safetensors", True), ("torch", False)])
@pytest.mark.parametrize("when", ["before", "during"])
def test_truncated_file_is_a_clear_error_never_sigbus(tmp_path, fmt, checksums, when):
    src = tmp_path / "src.safetensors"
    # Tensors at unaligned and aligned offsets: bounce copies and the kernel's own copies.
    ckptio.save({"a": torch.randn(3000), "b": torch.randn(5), "c": torch.randn(300000)}, src)
    out = tmp_path / "out.bin"
    r = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out), fmt, when, "1" if checksums else "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"the child died (status {r.returncode}): {r.stderr[-2000:]}"
    assert r.stdout.startswith("ERROR E_TRUNCATED"), r.stdout + r.stderr
    assert str(src) in r.stdout and "truncated in place" in r.stdout
    assert not out.exists()


def test_mapping_check_names_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.randn(100000)}, path)
    with ckptio.open(path, mmap=True) as f:
        t = f.get_tensor("a")
        f._mapping().check()
        os.truncate(path, 8)
        with pytest.raises(ckptio.CkptioError) as e:
            f._mapping().check()
    assert e.value.status_name == "E_TRUNCATED" and str(path) in str(e.value)
    with pytest.raises(ckptio.CkptioError):
        ckptio._ckptio.mapping_check(t.data_ptr(), t.numel() * 4)


# ---- many small tensors ----------------------------------------------------------------------

def _tiny_file(path, n):
    """A safetensors file of n tiny tensors in runs of mixed dtypes and shapes
    (the reference layout: header padded to 8); returns [(name, dtype, shape,
    offset)] in file order and the data section."""
    kinds = [("BF16", torch.bfloat16, (4, 4)), ("F32", torch.float32, (3,)), ("U8", torch.uint8, (5, 1)),
             ("BF16", torch.bfloat16, (2, 2))]
    header, layout, at = {}, [], 0
    for i in range(n):
        st, dt, shape = kinds[(i // 3) % len(kinds)]
        nbytes = torch.empty(shape, dtype=dt).numel() * torch.empty((), dtype=dt).element_size()
        at += (-at) % 4  # keep every offset a multiple of its element size
        name = f"layers.{i // 64}.experts.{i % 64}.{i}"
        header[name] = {"dtype": st, "shape": list(shape), "data_offsets": [at, at + nbytes]}
        layout.append((name, dt, shape, at, nbytes))
        at += nbytes
    # Fill the alignment holes with a tensor each so the data stays packed back to back.
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    pos, holes = 0, 0
    for name, e in items:
        b = e["data_offsets"][0]
        if b > pos:
            header[f"hole.{holes}"] = {"dtype": "U8", "shape": [b - pos], "data_offsets": [pos, b]}
            holes += 1
        pos = e["data_offsets"][1]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    data = bytes(torch.randint(0, 256, (at,), dtype=torch.uint8).numpy())
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return layout, data, 8 + len(text)


def test_100k_tiny_tensors_each_its_own_bytes(tmp_path):
    path = tmp_path / "tiny.safetensors"
    layout, data, base = _tiny_file(path, 100_000)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    for mmap in (False, True):
        out = ckptio.load(path, mmap=mmap)
        assert len(out) >= 100_000
        # Compare per (dtype, shape) group at once: the loaded tensors stacked
        # against the file's bytes gathered at their offsets.
        groups = {}
        for name, dt, shape, off, nbytes in layout:
            groups.setdefault((dt, shape), []).append((name, off, nbytes))
        for (dt, shape), members in groups.items():
            got = torch.stack([out[name] for name, _, _ in members])
            assert got.dtype == dt and got.shape[1:] == shape
            idx = torch.tensor([off for _, off, _ in members]).unsqueeze(1) + torch.arange(members[0][2])
            want = flat[idx]
            assert torch.equal(got.reshape(len(members), -1).view(torch.uint8), want), (dt, shape, mmap)
        if mmap:
            assert_mapped(out[layout[12345][0]], path)
        else:
            a, b = out[layout[0][0]], out[layout[1][0]]
            b_before = b.clone()
            a.fill_(1)
            assert torch.equal(b, b_before)
