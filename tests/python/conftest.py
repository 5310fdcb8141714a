"""Shared setup of the Python tests.

The ckptio package is normally installed (scripts/setup.sh runs
``pip install -e .``). Where it is not (the GPU machine, which gets the
working tree with the built module under python/ckptio), python/ is put on
sys.path so ``import ckptio`` finds the module built in place.
"""
import importlib.util
import os
import struct
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("ckptio") is None:
    sys.path.insert(0, str(REPO / "python"))


def _find_cli():
    """The ckptio binary: $CKPTIO_BUILD_DIR/ckptio, then $PATH, then build/ckptio."""
    import shutil

    build = os.environ.get("CKPTIO_BUILD_DIR")
    if build and (Path(build) / "ckptio").is_file():
        return str(Path(build) / "ckptio")
    found = shutil.which("ckptio")
    if found:
        return found
    local = REPO / "build" / "ckptio"
    return str(local) if local.is_file() else None


CKPTIO_CLI = _find_cli()
requires_cli = pytest.mark.skipif(CKPTIO_CLI is None, reason="ckptio binary not built (set CKPTIO_BUILD_DIR)")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")


def safetensors_header(path):
    """(header dict, data offset) parsed independently of ckptio."""
    import json

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return header, 8 + n


@pytest.fixture
def engine():
    """A private engine, so a test's settings never leak into others."""
    import ckptio

    return ckptio.Engine()


@pytest.fixture(autouse=True)
def _no_stray_temporaries(request):
    """Every test_py_* test: ckptio leaves no temporary files behind in tmp_path."""
    if not request.node.path.name.startswith("test_py_") or "tmp_path" not in request.fixturenames:
        yield
        return
    tmp = request.getfixturevalue("tmp_path")
    yield
    leftovers = [p.name for p in tmp.rglob("*") if ".ckptio-tmp-" in p.name]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def pytest_report_header(config):
    try:
        import ckptio

        where = os.path.dirname(ckptio.__file__)
        return f"ckptio {ckptio.__version__} from {where}; CUDA: {cuda_available()}"
    except Exception as exc:  # the tests will fail and say why
        return f"ckptio not importable: {exc}"


# ---- tensors with known bytes ------------------------------------------------------

# Every torch dtype ckptio maps, with whether safetensors has a name for it.
TORCH_DTYPES = [
    ("bool", True), ("uint8", True), ("int8", True), ("uint16", True), ("int16", True), ("uint32", True),
    ("int32", True), ("uint64", True), ("int64", True), ("float16", True), ("bfloat16", True),
    ("float32", True), ("float64", True), ("complex64", True), ("complex32", False), ("complex128", False),
    ("float8_e5m2", True), ("float8_e4m3fn", True), ("float8_e5m2fnuz", True), ("float8_e4m3fnuz", True),
    ("float8_e8m0fnu", True), ("float4_e2m1fn_x2", True),
]


def random_tensor(dtype, shape, seed=0):
    """A CPU tensor of `dtype` filled from seeded random bytes (any bit
    pattern, NaNs included; bool gets 0/1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    numel = 1
    for d in shape:
        numel *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=g, dtype=torch.uint8).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * size,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(tuple(shape))


def tensor_bytes(t) -> bytes:
    """The tensor's elements as raw little-endian bytes, in C order."""
    import torch

    t = t.detach().cpu().contiguous().reshape(-1)
    return bytes(t.view(torch.uint8).numpy().tobytes())
