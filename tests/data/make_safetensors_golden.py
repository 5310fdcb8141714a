#!/usr/bin/env python3
"""Writes the safetensors golden files in tests/data/safetensors/.

Made with the safetensors Python package (0.8.0 when they were committed),
so the C tests can check that ckptio reads what the reference writes and,
with CKPTIO_SAFETENSORS_ALIGN_8, writes the very same bytes.

Tensor contents follow one formula that the C tests repeat: byte j of the tensor at position k
of its list is (j * 131 + k * 17 + 7) & 0xff, and & 1 of that for BOOL.
The lists below and tests/data/safetensors/golden_tables.h must match.

Run from anywhere:  python3 tests/data/make_safetensors_golden.py
"""
import json
import os
import struct
import sys

import numpy as np
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors")

# (name, safetensors dtype, shape). Names exercise the JSON escapes: a
# non-ASCII letter, quote and backslash, control characters, '/' and DEL.
NUMPY_TENSORS = [
    ("model.embed_tokens.weight", "F32", [4, 3]),
    ("layers.0.attn.q_proj.weight", "F16", [2, 5]),
    ("layers.0.attn.scale", "F64", []),
    ("layers.0.mlp.up", "I64", [3]),
    ("layers.0.mlp.down", "I32", [2, 2]),
    ("emb\u00e9d", "I16", [3]),
    ("quote\"back\\slash", "I8", [5]),
    ("ctl\x01\x1f\t\n", "U8", [7]),
    ("slash/and\x7f", "U16", [2]),
    ("u32", "U32", [1, 2]),
    ("u64", "U64", [2]),
    ("mask", "BOOL", [3, 3]),
    ("complex", "C64", [2]),
    ("empty", "F32", [0]),
    ("empty3d", "I16", [2, 0, 3]),
]
NUMPY_METADATA = {"format": "np"}

TORCH_TENSORS = [
    ("bf16", "BF16", [2, 3]),
    ("f8_e4m3", "F8_E4M3", [5]),
    ("f8_e5m2", "F8_E5M2", [4]),
    ("f8_e4m3fnuz", "F8_E4M3FNUZ", [3]),
    ("f8_e5m2fnuz", "F8_E5M2FNUZ", [2]),
    ("f8_e8m0", "F8_E8M0", [3]),
    ("f4", "F4", [2, 6]),      # torch float4_e2m1fn_x2 [2, 3]: 6 bytes, 12 elements
    ("w", "F32", [2]),
    ("step", "I64", []),
]

NP_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
             "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
             "U64": np.uint64, "BOOL": np.bool_, "C64": np.complex64}
TORCH_DTYPES = {"BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
                "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
                "F8_E8M0": torch.float8_e8m0fnu, "F4": torch.float4_e2m1fn_x2, "F32": torch.float32,
                "I64": torch.int64}
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    assert n * BITS[dtype] % 8 == 0
    return n * BITS[dtype] // 8


def pattern(k, length, dtype):
    data = bytes((j * 131 + k * 17 + 7) & 0xFF for j in range(length))
    if dtype == "BOOL":
        data = bytes(b & 1 for b in data)
    return data


def write_numpy():
    tensors = {}
    for k, (name, dtype, shape) in enumerate(NUMPY_TENSORS):
        raw = pattern(k, nbytes(dtype, shape), dtype)
        tensors[name] = np.frombuffer(raw, dtype=NP_DTYPES[dtype]).reshape(shape)
    path = os.path.join(OUT, "ref_numpy.safetensors")
    safetensors.numpy.save_file(tensors, path, metadata=NUMPY_METADATA)
    return path


def write_torch():
    tensors = {}
    for k, (name, dtype, shape) in enumerate(TORCH_TENSORS):
        torch_shape = list(shape)
        if dtype == "F4":  # two 4-bit elements per torch element
            torch_shape[-1] //= 2
        raw = bytearray(pattern(k, nbytes(dtype, shape), dtype))
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        tensors[name] = t.view(TORCH_DTYPES[dtype]).reshape(torch_shape).clone()
    path = os.path.join(OUT, "ref_torch.safetensors")
    safetensors.torch.save_file(tensors, path)
    return path


def write_empty():
    path = os.path.join(OUT, "empty.safetensors")
    safetensors.numpy.save_file({}, path)
    return path


def write_unaligned_f6():
    """Some writers do not pad: the compact header here is 226 bytes, so the
    data starts at file offset 234, not a multiple of 8. F6 dtypes have no
    writer in the Python package, so the header is written by hand; the
    reference reader must accept it."""
    header = {
        "__metadata__": {"writer": "hand", "note": "unpadded"},
        "f6a": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]},
        "f6b": {"dtype": "F6_E3M2", "shape": [2, 4], "data_offsets": [3, 9]},
        "u8": {"dtype": "U8", "shape": [2], "data_offsets": [9, 11]},
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    data = pattern(0, 3, "F6_E2M3") + pattern(1, 6, "F6_E3M2") + pattern(2, 2, "U8")
    blob = struct.pack("<Q", len(text)) + text + data
    assert (8 + len(text)) % 8 != 0, "the point of this file is an unaligned data start"
    safetensors.deserialize(blob)  # the reference accepts it
    path = os.path.join(OUT, "unaligned_f6.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    return path


def main():
    os.makedirs(OUT, exist_ok=True)
    for path in (write_numpy(), write_torch(), write_empty(), write_unaligned_f6()):
        with open(path, "rb") as f:
            blob = f.read()
        n = struct.unpack("<Q", blob[:8])[0]
        print(f"{os.path.basename(path)}: {len(blob)} bytes, data at {8 + n}")
    print("safetensors", safetensors.__version__, "numpy", np.__version__, "torch", torch.__version__,
          file=sys.stderr)


if __name__ == "__main__":
    main()
