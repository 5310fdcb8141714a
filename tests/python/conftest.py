"""Shared setup of the Python tests.

The tests use the ckptio package that Python imports, never one they find themselves:

* CI (scripts/test.sh) and the GPU runs (scripts/gpu_wheel.sh) install the wheel into a new virtual
  environment and set CKPTIO_TEST_INSTALLED=1: the package and the ``ckptio`` command must then come from
  that installation (tests/python/test_installed.py checks it), and the CLI is the ``ckptio`` on PATH;
* in a development tree, PYTHONPATH=python (or scripts/setup.sh --python's .venv) imports the package
  built in place (-DCKPTIO_PYTHON=ON), and the CLI is $CKPTIO_TEST_BUILD_DIR/ckptio, then the ``ckptio`` on
  PATH, then build/ckptio.

CKPTIO_TEST_BUILD_DIR also names where C test programs used as helpers live (test_crash_cli.py).
"""
import os
import struct
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("CKPTIO_TEST_INSTALLED") == "1"


def _find_cli():
    """The ckptio command the tests run (see the module's docstring)."""
    import shutil

    if INSTALLED:
        return shutil.which("ckptio")
    build = os.environ.get("CKPTIO_TEST_BUILD_DIR")
    if build and (Path(build) / "ckptio").is_file():
        return str(Path(build) / "ckptio")
    found = shutil.which("ckptio")
    if found:
        return found
    local = REPO / "build" / "ckptio"
    return str(local) if local.is_file() else None


CKPTIO_CLI = _find_cli()
requires_cli = pytest.mark.skipif(CKPTIO_CLI is None, reason="no ckptio command (install the wheel, or build build/)")
if INSTALLED and CKPTIO_CLI is None:
    raise RuntimeError("CKPTIO_TEST_INSTALLED=1 but no ckptio command on PATH: is the wheel installed?")


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
        mode = "installed" if INSTALLED else "development"
        return f"ckptio {ckptio.__version__} from {where} ({mode}); CLI: {CKPTIO_CLI}; CUDA: {cuda_available()}"
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


# ---- a real S3 server (scripts/s3_server.sh; scripts/test.sh starts it) -------------------------------

requires_s3 = pytest.mark.skipif(not os.environ.get("AWS_ENDPOINT_URL") or not os.environ.get("CKPTIO_TEST_S3_BUCKET"),
                                 reason='no S3 server: eval "$(scripts/s3_server.sh start)" first')


@pytest.fixture
def s3_prefix(request):
    """A new "s3://BUCKET/py-PID-RAND/TEST" prefix for the test (nothing under it yet)."""
    import uuid

    bucket = os.environ.get("CKPTIO_TEST_S3_BUCKET")
    if not os.environ.get("AWS_ENDPOINT_URL") or not bucket:
        pytest.skip('no S3 server: eval "$(scripts/s3_server.sh start)" first')
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"s3://{bucket}/py-{os.getpid()}-{uuid.uuid4().hex[:8]}/{name}"


def s3_no_secret(text: str) -> None:
    """Fails when `text` holds a credential or a signature."""
    for var in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"):
        value = os.environ.get(var)
        if value and len(value) >= 4:
            assert value not in text, f"{var} in: {text}"
    assert "Signature=" not in text and "Credential=" not in text, text


def reference_split(sizes, limit):
    """huggingface_hub's split_state_dict_into_shards_factory written out: (name, size) pairs in order into
    lists of names, one per shard (a tensor over the limit alone; one that would tip a shard over closes it)."""
    shards, current, cur_size = [], [], 0
    for name, size in sizes:
        if size > limit:
            shards.append([name])
            continue
        if cur_size + size > limit:
            shards.append(current)
            current, cur_size = [], 0
        current.append(name)
        cur_size += size
    if current:
        shards.append(current)
    return shards
