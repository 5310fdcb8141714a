"""ckptio.save / load / open with safetensors files, and interop with the
safetensors package (torch and numpy bindings) in both directions.

Reference values come from safetensors itself, from torch, or from parsing
the file header here; never from ckptio.
"""
import errno
import json
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save as st_save_bytes
from safetensors.torch import save_file as st_save_file

import ckptio
from conftest import TORCH_DTYPES, random_tensor, safetensors_header, tensor_bytes

ST_DTYPES = [name for name, in_st in TORCH_DTYPES if in_st]
SHAPES = [(), (0,), (3, 0, 2), (7,), (4, 6), (2, 3, 4)]


def _shape_for(dtype_name, shape):
    # float4_e2m1fn_x2 has no 0-d safetensors form (one byte holds two values).
    if dtype_name == "float4_e2m1fn_x2" and shape == ():
        return (1,)
    return shape


# ---- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ST_DTYPES)
def test_roundtrip_every_dtype_and_shape(tmp_path, dtype_name):
    dtype = getattr(torch, dtype_name)
    sd = {f"t{i}": random_tensor(dtype, _shape_for(dtype_name, s), seed=i) for i, s in enumerate(SHAPES)}
    path = tmp_path / "m.safetensors"
    ckptio.save(sd, path)
    out = ckptio.load(path)
    assert list(out) == sorted(sd)
    for name, t in sd.items():
        assert out[name].dtype == dtype
        assert out[name].shape == t.shape
        assert tensor_bytes(out[name]) == tensor_bytes(t), name
    # safetensors reads the same bytes back.
    ref = st_load_file(str(path))
    for name, t in sd.items():
        assert ref[name].dtype == dtype and ref[name].shape == t.shape
        assert tensor_bytes(ref[name]) == tensor_bytes(t), name


@pytest.mark.parametrize("dtype_name", ST_DTYPES)
def test_reads_files_written_by_safetensors(tmp_path, dtype_name):
    dtype = getattr(torch, dtype_name)
    sd = {f"w.{i}": random_tensor(dtype, _shape_for(dtype_name, s), seed=10 + i) for i, s in enumerate(SHAPES)}
    path = tmp_path / "ref.safetensors"
    st_save_file(sd, str(path), metadata={"format": "pt"})
    out = ckptio.load(path)
    assert set(out) == set(sd)
    for name, t in sd.items():
        assert out[name].dtype == dtype and out[name].shape == t.shape
        assert tensor_bytes(out[name]) == tensor_bytes(t), name
    with ckptio.open(path) as f:
        assert f.metadata() == {"format": "pt"}


def _model_state():
    g = torch.Generator().manual_seed(3)
    return {
        "embed.weight": torch.randn(64, 32, generator=g),
        "layers.0.attn.qkv": torch.randn(32, 96, generator=g).to(torch.bfloat16),
        "layers.0.norm": torch.randn(32, generator=g).half(),
        "layers.0.count": torch.tensor(7, dtype=torch.int64),
        "mask": torch.randint(0, 2, (5, 5), generator=g).bool(),
        "empty": torch.zeros(0, 4),
        "ids": torch.arange(11, dtype=torch.int32),
    }


def test_reference_layout_is_byte_identical_to_safetensors(tmp_path):
    sd = _model_state()
    path = tmp_path / "m.safetensors"
    ckptio.save(sd, path, align=8)
    assert path.read_bytes() == st_save_bytes(sd)
    # One key only: safetensors orders several metadata keys by a hash map.
    meta = {"format": "pt"}
    ckptio.save(sd, path, metadata=meta, align=8)
    assert path.read_bytes() == st_save_bytes(sd, metadata=meta)


def test_default_layout_aligns_data_to_4k_and_stays_valid(tmp_path):
    sd = _model_state()
    path = tmp_path / "m.safetensors"
    ckptio.save(sd, path, metadata={"k": "v"})
    header, data_offset = safetensors_header(path)
    assert data_offset % 4096 == 0
    assert header["__metadata__"] == {"k": "v"}
    # Same tensors, same order, same data bytes as the reference writer.
    ref_path = tmp_path / "ref.safetensors"
    st_save_file(sd, str(ref_path), metadata={"k": "v"})
    ref_header, ref_offset = safetensors_header(ref_path)
    assert header == ref_header
    assert path.read_bytes()[data_offset:] == ref_path.read_bytes()[ref_offset:]
    with safe_open(str(path), "pt") as f:
        for name, t in sd.items():
            assert tensor_bytes(f.get_tensor(name)) == tensor_bytes(t)


def test_numpy_interop_both_directions(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {
        "f32": rng.standard_normal((4, 5)).astype(np.float32),
        "f64": rng.standard_normal(3),
        "i16": rng.integers(-1000, 1000, (2, 2, 2)).astype(np.int16),
        "u64": rng.integers(0, 2**63, 4, dtype=np.uint64),
        "c64": (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64),
        "b": rng.integers(0, 2, 6).astype(bool),
        "scalar": np.array(2.5, dtype=np.float16),
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
        "strided": np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2],
    }
    mine = tmp_path / "np.safetensors"
    ckptio.save(arrays, mine)
    back = np_load_file(str(mine))
    for k, a in arrays.items():
        np.testing.assert_array_equal(back[k], a)
    ref = tmp_path / "np_ref.safetensors"
    np_save_file({k: np.ascontiguousarray(v.astype(v.dtype.newbyteorder("<"))) for k, v in arrays.items()},
                 str(ref))
    got = ckptio.load(ref, framework="numpy")
    for k, a in arrays.items():
        assert isinstance(got[k], np.ndarray)
        assert got[k].dtype == a.dtype.newbyteorder("<")
        np.testing.assert_array_equal(got[k], a)


def test_numpy_refuses_dtypes_it_lacks(tmp_path):
    path = tmp_path / "bf.safetensors"
    st_save_file({"x": torch.ones(2, dtype=torch.bfloat16)}, str(path))
    with pytest.raises(TypeError, match="BF16"):
        ckptio.load(path, framework="numpy")


def test_non_contiguous_inputs_are_saved_by_value(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    other = torch.arange(30, dtype=torch.int16).reshape(5, 6)
    sd = {"t": base.t(), "cols": other[:, 1::2], "expanded": torch.ones(3, 1).expand(3, 4)}
    path = tmp_path / "nc.safetensors"
    ckptio.save(sd, path)
    out = st_load_file(str(path))
    for k, v in sd.items():
        assert torch.equal(out[k], v.contiguous()), k


def test_shared_memory_is_refused_like_safetensors(tmp_path):
    a = torch.arange(10, dtype=torch.float32)
    path = tmp_path / "s.safetensors"
    with pytest.raises(ValueError, match=r"share memory.*\{a, b\}"):
        ckptio.save({"a": a, "b": a[2:5]}, path)
    assert not path.exists()
    with pytest.raises(ValueError, match="share memory"):
        ckptio.save({"a": a, "same": a}, path)
    # Disjoint slices of one storage do not overlap: allowed, as in safetensors.
    ckptio.save({"lo": a[:5], "hi": a[5:]}, path)
    out = ckptio.load(path)
    assert torch.equal(out["lo"], a[:5]) and torch.equal(out["hi"], a[5:])


def test_nested_dicts_are_flattened_with_dots(tmp_path):
    sd = {"model": {"w": torch.ones(2), "sub": {"b": torch.zeros(3)}}, "step": torch.tensor(5)}
    path = tmp_path / "n.safetensors"
    ckptio.save(sd, path)
    assert set(st_load_file(str(path))) == {"model.w", "model.sub.b", "step"}
    with pytest.raises(ValueError, match="collides"):
        ckptio.save({"a": {"b": torch.ones(1)}, "a.b": torch.ones(1)}, path)
    with pytest.raises(TypeError, match="'x'.*int"):
        ckptio.save({"x": 3}, path)


def test_complex32_and_complex128_have_no_safetensors_name(tmp_path):
    path = tmp_path / "c.safetensors"
    for dt in (torch.complex128, torch.complex32):
        with pytest.raises(ckptio.CkptioError) as info:
            ckptio.save({"zz": torch.zeros(2, dtype=dt)}, path)
        assert "zz" in str(info.value)
    assert not path.exists()


# ---- open(): lazy access -----------------------------------------------------------------


def test_open_lists_reads_and_reports_offsets(tmp_path):
    sd = _model_state()
    path = tmp_path / "m.safetensors"
    st_save_file(sd, str(path), metadata={"a": "b"})
    header, data_offset = safetensors_header(path)
    with ckptio.open(path) as f:
        assert f.format == "safetensors"
        assert f.keys() == sorted(sd)
        assert len(f) == len(sd) and "mask" in f and "nope" not in f
        assert f.metadata() == {"a": "b"}
        by_offset = sorted((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
        assert f.offset_keys() == [k for _, k in by_offset]
        for name in sd:
            info = f.info(name)
            begin, end = header[name]["data_offsets"]
            assert info.offset == data_offset + begin and info.nbytes == end - begin
            assert info.dtype == header[name]["dtype"] and list(info.shape) == header[name]["shape"]
        t = f.get_tensor("layers.0.attn.qkv")
        assert torch.equal(t, sd["layers.0.attn.qkv"])
        with pytest.raises(KeyError, match="nope"):
            f.get_tensor("nope")
    assert f.closed
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("mask")


def test_load_selected_keys_and_into_existing_tensors(tmp_path):
    sd = _model_state()
    path = tmp_path / "m.safetensors"
    ckptio.save(sd, path)
    part = ckptio.load(path, keys=["ids", "mask"])
    assert list(part) == ["ids", "mask"]
    assert torch.equal(part["ids"], sd["ids"]) and torch.equal(part["mask"], sd["mask"])
    dest = {"embed.weight": torch.empty(64, 32), "ids": torch.full((11,), -1, dtype=torch.int32)}
    got = ckptio.load(path, out=dest)
    assert got["embed.weight"] is dest["embed.weight"]
    assert torch.equal(dest["embed.weight"], sd["embed.weight"]) and torch.equal(dest["ids"], sd["ids"])
    with pytest.raises(KeyError, match="missing"):
        ckptio.load(path, keys=["ids", "missing"])


def test_dtype_and_shape_mismatch_into_existing_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({"w": torch.ones(4, 4)}, path)
    keep = torch.full((4, 4), 9, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"'w' is F32 in the file but the destination tensor is torch.int32"):
        ckptio.load(path, out={"w": keep})
    assert torch.equal(keep, torch.full((4, 4), 9, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"shape \[4, 4\] in the file.*\[16\]"):
        ckptio.load(path, out={"w": torch.empty(16)})
    with pytest.raises(ValueError, match="contiguous"):
        ckptio.load(path, out={"w": torch.empty(4, 4).t()})


# ---- errors -------------------------------------------------------------------------------------


def test_missing_file_is_file_not_found(tmp_path):
    path = tmp_path / "absent.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        ckptio.load(path)
    e = info.value
    assert isinstance(e, ckptio.CkptioError)
    assert e.errno == errno.ENOENT and e.status_name == "E_NOT_FOUND" and e.status == -6
    assert e.path == str(path) and str(path) in str(e)


def test_garbage_file_is_a_format_error(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load(path)
    assert info.value.status_name == "E_FORMAT" and str(path) in str(info.value)


def _corrupt(tmp_path, header_obj, data_len):
    raw = json.dumps(header_obj).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * data_len)
    return path


def test_corrupt_headers_name_the_tensor_and_rule(tmp_path):
    # Offsets leave a gap: the reader must refuse and name the tensor.
    path = _corrupt(tmp_path, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "gap": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, 16)
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load(path)
    assert info.value.status_name == "E_FORMAT"
    assert "gap" in str(info.value) and str(path) in str(info.value)
    # Byte count disagrees with shape x dtype.
    path = _corrupt(tmp_path, {"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}}, 8)
    with pytest.raises(ckptio.CkptioError, match="w") as info:
        ckptio.load(path)
    assert info.value.status_name == "E_FORMAT"
    # Unknown dtype.
    path = _corrupt(tmp_path, {"q": {"dtype": "F17", "shape": [1], "data_offsets": [0, 2]}}, 2)
    with pytest.raises(ckptio.CkptioError, match="F17"):
        ckptio.load(path)


def test_truncated_file_names_file_and_size(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({"big": torch.arange(1000, dtype=torch.float64)}, path)
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load(path)
    assert str(path) in str(info.value)
    assert info.value.status_name in ("E_FORMAT", "E_TRUNCATED")


def test_failed_save_keeps_the_old_file(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(3)}, path)
    before = path.read_bytes()
    with pytest.raises(ckptio.CkptioError, match="__metadata__"):
        ckptio.save({"__metadata__": torch.ones(2)}, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_wrong_devices_are_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(3)}, path)
    with pytest.raises(ValueError, match="mps"):
        ckptio.load(path, device="mps")
    with pytest.raises(ValueError, match="cuda:x"):
        ckptio.load(path, device="cuda:x")
    with pytest.raises(ValueError, match="numpy"):
        ckptio.load(path, device="cuda", framework="numpy")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            ckptio.load(path, device="cuda")
    else:
        with pytest.raises(ValueError, match="does not exist"):
            ckptio.load(path, device=torch.cuda.device_count())
    with pytest.raises(ValueError, match="meta"):
        ckptio.save({"m": torch.empty(2, device="meta")}, tmp_path / "meta.safetensors")


def test_a_non_tensor_value_names_its_key_and_the_format_that_keeps_it(tmp_path):
    path = tmp_path / "state.safetensors"
    sd = {"w": torch.ones(2), "step": 5, "opt": {"lr": 0.1}}
    with pytest.raises(TypeError) as exc:
        ckptio.save(sd, path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: 'step' is an int, not a tensor, and safetensors stores only tensors")
    assert "a path ending in .pt, or format='torch'" in msg
    assert not path.exists()
    with pytest.raises(TypeError, match=r"^<bytes>: 'opt.lr' is a float, not a tensor"):
        ckptio.save({"w": torch.ones(2), "opt": {"lr": 0.1}})
    # The suggestion works.
    ckptio.save(sd, tmp_path / "state.pt")
    back = ckptio.load(tmp_path / "state.pt")
    assert back["step"] == 5 and back["opt"] == {"lr": 0.1} and torch.equal(back["w"], sd["w"])
