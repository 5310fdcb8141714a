"""Checkpoints as bytes and file objects (docs/PYTHON.md): ``ckptio.save(sd)``
returns bytes, ``ckptio.load`` takes bytes, bytearray, memoryview and binary
file objects, for both formats, checked against safetensors.torch.save/load
and torch.save/torch.load through buffers."""
import io
import os

import pytest
import torch

import ckptio

st_torch = pytest.importorskip("safetensors.torch")


def _sd():
    g = torch.Generator().manual_seed(3)
    return {
        "emb": torch.randn(50, 16, generator=g),
        "ln.bias": torch.randn(16, generator=g).to(torch.bfloat16),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }


def _equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_safetensors_bytes_equal_the_reference_writer():
    sd = _sd()
    data = ckptio.save(sd, align=8)
    assert isinstance(data, bytes)
    assert data == st_torch.save(sd)
    # One metadata entry: safetensors writes several in a random order (a Rust HashMap).
    meta = {"format": "pt"}
    assert ckptio.save(sd, metadata=meta, align=8) == st_torch.save(sd, metadata=meta)
    # The default layout (data 4 KiB-aligned) is a valid file for safetensors too.
    _equal(st_torch.load(ckptio.save(sd)), sd)


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "BytesIO", "file"])
def test_load_takes_bytes_and_file_objects_safetensors(tmp_path, kind):
    sd = _sd()
    data = st_torch.save(sd)
    if kind == "bytes":
        src = data
    elif kind == "bytearray":
        src = bytearray(data)
    elif kind == "memoryview":
        src = memoryview(data)
    elif kind == "BytesIO":
        src = io.BytesIO(data)
    else:
        (tmp_path / "m.safetensors").write_bytes(data)
        src = open(tmp_path / "m.safetensors", "rb")
    try:
        _equal(ckptio.load(src), sd)
    finally:
        if kind == "file":
            src.close()


def test_torch_format_bytes_both_ways():
    sd = _sd()
    data = ckptio.save(sd, format="torch")
    assert isinstance(data, bytes) and data[:4] == b"PK\x03\x04"
    _equal(torch.load(io.BytesIO(data), weights_only=True), sd)
    buf = io.BytesIO()
    torch.save(sd, buf)
    _equal(ckptio.load(buf.getvalue()), sd)
    buf.seek(0)
    _equal(ckptio.load(buf), sd)
    # A whole object tree, as torch.load returns it.
    obj = {"model": sd, "epoch": 3, "lrs": [0.1, 0.01]}
    got = ckptio.load(ckptio.save(obj, format="torch"))
    assert got["epoch"] == 3 and got["lrs"] == [0.1, 0.01]
    _equal(got["model"], sd)


def test_file_object_is_read_from_its_position(tmp_path):
    sd = _sd()
    buf = io.BytesIO(b"header!" + st_torch.save(sd))
    buf.seek(7)
    _equal(ckptio.load(buf), sd)
    path = tmp_path / "prefixed"
    path.write_bytes(b"header!" + st_torch.save(sd))
    with open(path, "rb") as f:
        f.seek(7)
        _equal(ckptio.load(f), sd)


def test_load_options_work_on_bytes():
    sd = _sd()
    data = ckptio.save(sd)
    got = ckptio.load(data, keys=["emb"])
    assert list(got) == ["emb"] and torch.equal(got["emb"], sd["emb"])
    out = {"emb": torch.empty(50, 16)}
    ckptio.load(data, out=out)
    assert torch.equal(out["emb"], sd["emb"])
    seen = []
    ckptio.load(data, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1][0] == seen[-1][1] > 0


def test_bad_bytes_name_the_data_not_a_proc_path():
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load(b"definitely not a checkpoint")
    assert str(info.value).startswith("<bytes>: ") and "/proc/" not in str(info.value)
    assert info.value.path == "<bytes>"
    data = st_torch.save(_sd())
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load(data[:-10])
    assert "<bytes>" in str(info.value) and "/proc/" not in str(info.value)
    with pytest.raises(TypeError, match="binary mode"):
        ckptio.load(io.StringIO("text"))
    with pytest.raises(TypeError, match="<bytes>: 'b' is None, not a tensor") as info:
        ckptio.save({"a": torch.ones(4), "b": None})
    assert "/proc/" not in str(info.value)


def test_save_to_bytes_refuses_checksums_and_leaves_no_descriptor():
    with pytest.raises(ValueError, match="checksums"):
        ckptio.save(_sd(), checksums=True)
    # New descriptors only: other threads of the process (a torch or gloo
    # thread left by an earlier test) may close theirs meanwhile.
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(20):
        ckptio.load(ckptio.save(_sd()))
        ckptio.load(ckptio.save(_sd(), format="torch"))
    left = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in set(os.listdir("/proc/self/fd")) - before
            if os.path.exists(f"/proc/self/fd/{fd}")}
    assert not left, f"descriptors left open: {left}"


# ---- the in-memory paths: bytes laid out and copied once, loads parsed in place ----------------------------

ST_DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16",
             "bfloat16", "float32", "float64", "complex64", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu"]


@pytest.mark.parametrize("align", [4096, 8])
def test_bytes_are_the_file_save_writes_for_every_dtype(tmp_path, align):
    g = torch.Generator().manual_seed(5)
    sd = {f"t.{name}": torch.randint(0, 256, (3, 5 * torch.empty((), dtype=getattr(torch, name)).element_size()),
                                     generator=g, dtype=torch.uint8).view(getattr(torch, name)) for name in ST_DTYPES}
    sd["t.bool"] = sd["t.bool"].view(torch.uint8).remainder(2).bool()
    sd["empty"] = torch.empty(0, 4)
    sd["scalar"] = torch.tensor(1.5)
    sd.update({f"small.{i}": torch.randn(i + 1, generator=g) for i in range(40)})  # packed on load
    path = tmp_path / "m.safetensors"
    ckptio.save(sd, path, align=align)
    data = ckptio.save(sd, align=align)
    assert data == path.read_bytes()
    for kind in (bytes, bytearray, memoryview):
        out = ckptio.load(kind(data))
        assert list(out) == sorted(sd)
        for k, t in sd.items():
            assert out[k].dtype == t.dtype and out[k].shape == t.shape, k
            assert torch.equal(out[k].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), k
    two = ckptio.load(data, keys=["small.3", "t.int64"])
    assert list(two) == ["small.3", "t.int64"] and torch.equal(two["small.3"], sd["small.3"])
    with pytest.raises(KeyError, match="<bytes>"):
        ckptio.load(data, keys=["nope"])
    # Loaded tensors own their memory: the bytes object stays as it was.
    out = ckptio.load(bytearray(data))
    out["small.3"].fill_(0)
    assert torch.equal(ckptio.load(data)["small.3"], sd["small.3"])


def test_torch_bytes_load_builds_the_object():
    base = torch.randn(8, 8)
    obj = {"w": torch.nn.Parameter(torch.randn(4)), "view": base[2:5], "base": base, "n": [1, "x"]}
    buf = io.BytesIO()
    torch.save(obj, buf)
    out = ckptio.load(buf.getvalue())
    assert isinstance(out["w"], torch.nn.Parameter) and out["n"] == [1, "x"]
    assert torch.equal(out["view"], base[2:5]) and torch.equal(out["base"], base)
    assert out["view"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()


def test_mapped_tensors_of_a_truncated_file_save_to_bytes_as_a_clear_error(tmp_path):
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.randn(100000), "b": torch.randn(3)}, path)
    child = textwrap.dedent(f"""
        import os, ckptio
        sd = ckptio.load({str(path)!r}, mmap=True)
        os.truncate({str(path)!r}, 8)
        try:
            ckptio.save(sd)
        except ckptio.CkptioError as exc:
            print("ERROR", exc.status_name, exc)
    """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"the child died (status {r.returncode}): {r.stderr[-2000:]}"
    assert r.stdout.startswith("ERROR E_TRUNCATED") and str(path) in r.stdout, r.stdout + r.stderr


def test_a_few_small_tensors_from_bytes_each_own_their_storage():
    sd = {f"t{i}": torch.arange(256, dtype=torch.float32) + i for i in range(4)}
    out = ckptio.load(ckptio.save(sd))
    assert sorted(out) == sorted(sd)
    for name, t in out.items():
        assert torch.equal(t, sd[name])
        assert t.untyped_storage().nbytes() == t.nbytes
    assert len({t.untyped_storage().data_ptr() for t in out.values()}) == 4


@pytest.mark.parametrize("split", ["inside_a_tensor", "between_tensors"])
def test_a_large_load_from_bytes_copied_on_two_threads_is_exact(split):
    """From 8 MiB in all, a load from bytes copies the second half of the bytes on a thread of its own, cutting a
    tensor where the half falls: every tensor, packed small ones too, comes back bit for bit."""
    g = torch.Generator().manual_seed(7)
    if split == "inside_a_tensor":
        sd = {"big": torch.randn(3 << 20, generator=g), "odd": torch.randint(0, 255, (1234567,), dtype=torch.uint8,
                                                                            generator=g)}
    else:
        sd = {f"w{i}": torch.randn(1 << 20, generator=g) for i in range(4)}
    sd.update({f"small.{i}": torch.randn(7, generator=g).to(torch.bfloat16) for i in range(40)})
    data = ckptio.save(sd)
    assert len(data) > 8 << 20
    out = ckptio.load(data)
    assert set(out) == set(sd)
    for k, v in sd.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k


def test_large_tensors_from_bytes_are_ordinary():
    """Tensors of 2 MiB or more loaded from bytes come from torch's allocator: ordinary tensors that outlive the
    bytes, exact, writable, with their dtype, shape and strides, a storage that can be resized, saved and pickled
    as any other."""
    import pickle

    g = torch.Generator().manual_seed(11)
    sd = {"a": torch.randn(1 << 20, generator=g), "b": torch.randn(1024, 1024, generator=g).to(torch.bfloat16),
          "odd": torch.randint(0, 255, ((2 << 20) + 5,), dtype=torch.uint8, generator=g),
          "small": torch.randn(3, 5, generator=g)}
    data = ckptio.save(sd)
    out = ckptio.load(bytearray(data))
    del data
    _equal(out, sd)
    for k, v in sd.items():
        assert out[k].shape == v.shape and out[k].stride() == v.stride() and out[k].is_contiguous(), k
    for k in ("a", "b", "odd"):
        storage = out[k].untyped_storage()
        assert storage.resizable() and storage.nbytes() == out[k].nbytes, k
    out["a"][3] = 42.0
    assert out["a"][3] == 42.0
    out["odd"].untyped_storage().resize_(out["odd"].nbytes + 11)
    assert torch.equal(out["odd"], sd["odd"])
    buf = io.BytesIO()
    torch.save(out, buf)
    again = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    _equal(again, out)
    assert torch.equal(pickle.loads(pickle.dumps(out["b"])), out["b"])


def _safetensors_bytes(entries):
    """A safetensors file of (name, dtype, shape, data) laid out in the order given (not name order)."""
    import json
    import struct

    header, blobs, offset = {}, [], 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def test_a_few_tensors_from_bytes_every_dtype_in_name_order():
    """Up to 16 tensors are made one by one: every dtype (float4 packed two to a byte included), empty and 0-d
    tensors, come back exact, in name order whatever the order of the file."""
    g = torch.Generator().manual_seed(9)
    names = ST_DTYPES + (["float4_e2m1fn_x2"] if hasattr(torch, "float4_e2m1fn_x2") else [])
    for start in range(0, len(names), 8):
        sd = {f"t.{name}": torch.randint(0, 256, (3, 4 * torch.empty((), dtype=getattr(torch, name)).element_size()),
                                         generator=g, dtype=torch.uint8).view(getattr(torch, name))
              for name in names[start:start + 8]}
        if "t.bool" in sd:
            sd["t.bool"] = sd["t.bool"].view(torch.uint8).remainder(2).bool()
        sd["empty"] = torch.empty(0, 4)
        sd["scalar"] = torch.tensor(1.5)
        out = ckptio.load(ckptio.save(sd))
        assert list(out) == sorted(sd)
        for k, t in sd.items():
            assert out[k].dtype == t.dtype and out[k].shape == t.shape, k
            assert torch.equal(out[k].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), k
    data = _safetensors_bytes([("z", "F32", (2,), struct_f32(1.0, 2.0)),
                               ("a", "I16", (3,), b"\x01\x00\x02\x00\x03\x00"), ("m", "U8", (0,), b"")])
    out = ckptio.load(data)
    assert list(out) == ["a", "m", "z"]
    assert out["z"].tolist() == [1.0, 2.0] and out["a"].tolist() == [1, 2, 3] and out["m"].shape == (0,)


def struct_f32(*values):
    import struct

    return struct.pack(f"<{len(values)}f", *values)
