"""Loads into and saves from CUDA memory (skipped without a GPU).

Run on the GPU machine with `pytest tests/python`; every result is checked
against torch / safetensors on the CPU.
"""
import os

import pytest
import torch
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_file as st_save_file

import ckptio
from conftest import random_tensor, requires_cuda, tensor_bytes

pytestmark = requires_cuda


def _sd():
    return {
        "w": random_tensor(torch.bfloat16, (257, 129), seed=1),
        "b": random_tensor(torch.float32, (129,), seed=2),
        "s": torch.tensor(7, dtype=torch.int64),
        "e": torch.zeros(0, 5),
        "f8": random_tensor(torch.float8_e4m3fn, (33,), seed=3),
    }


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_load_to_cuda(tmp_path, fmt):
    sd = _sd()
    path = tmp_path / f"m.{fmt}"
    if fmt == "safetensors":
        st_save_file(sd, str(path))
    else:
        torch.save(sd, path)
    got = ckptio.load(path, device="cuda")
    for k, t in sd.items():
        assert got[k].device.type == "cuda" and got[k].device.index == torch.cuda.current_device()
        assert tensor_bytes(got[k]) == tensor_bytes(t), k


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_save_from_cuda(tmp_path, fmt):
    sd = {k: v.cuda() for k, v in _sd().items()}
    path = tmp_path / f"m.{fmt}"
    ckptio.save(sd, path, format=fmt)
    ref = st_load_file(str(path)) if fmt == "safetensors" else torch.load(path, map_location="cpu",
                                                                          weights_only=True)
    for k, t in sd.items():
        assert tensor_bytes(ref[k]) == tensor_bytes(t), k
    if fmt == "torch":
        with ckptio.open(path) as f:
            assert {s.location for s in f.storages()} == {f"cuda:{torch.cuda.current_device()}"}


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK), reason="needs /dev/shm")
@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_save_from_cuda_to_tmpfs(fmt):
    """Writes to a file in memory take turns (docs/ENGINE.md): 64 MiB from the GPU by 8 workers in 1 MiB windows,
    read back by safetensors / torch."""
    sd = {f"t{i}": random_tensor(torch.bfloat16, (2048, 2048), seed=10 + i).cuda() for i in range(8)}
    path = os.path.join("/dev/shm", f"ckptio-test-{os.getpid()}.{fmt}")
    try:
        ckptio.save(sd, path, format=fmt, engine=ckptio.Engine(threads=8, chunk_bytes=1 << 20))
        ref = st_load_file(path) if fmt == "safetensors" else torch.load(path, map_location="cpu", weights_only=True)
        for k, t in sd.items():
            assert tensor_bytes(ref[k]) == tensor_bytes(t), k
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_save_waits_for_work_on_the_current_stream(tmp_path):
    side = torch.cuda.Stream()
    path = tmp_path / "stream.safetensors"
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 22, device="cuda")
        torch.cuda._sleep(50_000_000)
        x.add_(5.0)
        ckptio.save({"x": x}, path)
    side.synchronize()
    assert torch.equal(st_load_file(str(path))["x"], torch.full((1 << 22,), 5.0))


def test_load_into_existing_cuda_tensors_and_views(tmp_path):
    base = torch.randn(64, 48)
    path = tmp_path / "v.pt"
    torch.save({"base": base, "view": base[:, ::3]}, path)
    dest = {"base": torch.empty(64, 48, device="cuda")}
    ckptio.load(path, out=dest)
    assert torch.equal(dest["base"].cpu(), base)
    # A strided view goes through host memory and ends up on the GPU.
    got = ckptio.load(path, device="cuda", keys=["view"])
    assert got["view"].is_cuda and torch.equal(got["view"].cpu(), base[:, ::3])
    # The whole object keeps the view sharing its storage, on the GPU.
    obj = ckptio.load(path, device="cuda")
    assert obj["view"].untyped_storage().data_ptr() == obj["base"].untyped_storage().data_ptr()
    assert torch.equal(obj["view"].cpu(), base[:, ::3])


def test_loads_and_saves_under_expandable_segments(tmp_path):
    """Under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torch maps memory in 20 MiB pieces that the driver
    reports apart, and 8 MiB tensors span two: loads into them and saves from them work (they were refused as
    running past their allocation)."""
    import subprocess
    import sys
    sd = {f"w{i}": random_tensor(torch.bfloat16, (1024, 4096), seed=i) for i in range(10)}
    path = tmp_path / "m.safetensors"
    st_save_file(sd, str(path))
    code = ("import sys, torch, ckptio; from safetensors.torch import load_file\n"
            "def raw(t): return t.cpu().reshape(-1).view(torch.uint8)  # bytes: random bf16 holds NaNs\n"
            "got = ckptio.load(sys.argv[1], device='cuda:0'); ref = load_file(sys.argv[1])\n"
            "assert torch.cuda.memory_snapshot()[0]['is_expandable'], 'not expandable segments'\n"
            "assert all(torch.equal(raw(got[k]), raw(ref[k])) for k in ref), 'bytes differ'\n"
            "out = {k: torch.empty_like(v, device='cuda:0') for k, v in ref.items()}\n"
            "ckptio.load(sys.argv[1], device='cuda:0', out=out)\n"
            "assert all(torch.equal(raw(out[k]), raw(ref[k])) for k in ref), 'bytes differ (out=)'\n"
            "ckptio.save(got, sys.argv[1] + '.out', format='safetensors'); back = load_file(sys.argv[1] + '.out')\n"
            "assert all(torch.equal(raw(back[k]), raw(ref[k])) for k in ref), 'saved bytes differ'\n")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    r = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def _column_slice_case(path, env):
    """Column and inner-box slices of `path` read to cuda:0 in a fresh process under `env`; checks every byte."""
    import subprocess
    import sys
    code = ("import sys, torch, ckptio\n"
            "from safetensors.torch import load_file\n"
            "def raw(t): return t.cpu().contiguous().reshape(-1).view(torch.uint8)\n"
            "ref = load_file(sys.argv[1])\n"
            "idx = {'m': (slice(None), slice(7, 1507)), 'q': (slice(None), slice(2048, 3072)),\n"
            "       'c': (slice(1, None), slice(None), slice(5, 9))}\n"
            "with ckptio.open(sys.argv[1], device='cuda:0') as f:\n"
            "    got = f.get_slices(idx)\n"
            "    one = f.get_slice('m')[:, 3:4]\n"
            "bad = [k for k in idx if not torch.equal(raw(got[k]), raw(ref[k][idx[k]]))]\n"
            "assert not bad, f'bytes differ: {bad}'\n"
            "assert torch.equal(raw(one), raw(ref['m'][:, 3:4])), 'one column differs'\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], env=dict(os.environ, **env), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("env", [{}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}],
                         ids=["pitched", "expandable-segments"])
def test_column_slices_to_cuda(tmp_path, env):
    """A column slice is one run per row, copied to the GPU as one pitched copy per staging window (under
    expandable segments no pitched copy leaves a mapped piece): every byte as safetensors gives it, for
    windows of many rows, unaligned widths, a single column and a 3-D inner box."""
    ref = {"m": random_tensor(torch.bfloat16, (4096, 3000), seed=1),
           "q": random_tensor(torch.float32, (1024, 4096), seed=2),
           "c": random_tensor(torch.int8, (33, 70, 17), seed=3)}
    path = tmp_path / "m.safetensors"
    st_save_file(ref, str(path))
    _column_slice_case(path, env)


def test_explicit_device_index_and_bad_index(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.arange(10.0)}, path)
    last = torch.cuda.device_count() - 1
    got = ckptio.load(path, device=f"cuda:{last}")
    assert got["a"].device == torch.device("cuda", last)
    with pytest.raises(ValueError, match="does not exist"):
        ckptio.load(path, device=last + 1)


def test_large_load_to_cuda_matches(tmp_path):
    n = 64 << 20  # 256 MiB of float32
    t = torch.arange(n, dtype=torch.float32)
    path = tmp_path / "big.safetensors"
    ckptio.save({"t": t}, path)
    got = ckptio.load(path, device="cuda")["t"]
    assert torch.equal(got.cpu(), t)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_tensors_on_a_device_that_is_not_current(tmp_path):
    """Device memory is looked up in its own device's context, not the
    caller's current one (cuMemGetAddressRange is per context)."""
    torch.cuda.set_device(0)
    t = torch.randn(3 << 20, device="cuda:1")
    for name in ("m.safetensors", "m.pt"):
        path = tmp_path / name
        ckptio.save({"t": t}, path)
        got = ckptio.load(path, device="cuda:1")["t"]
        assert got.device == torch.device("cuda", 1) and torch.equal(got, t)
        assert torch.equal(ckptio.load(path, device="cuda:0")["t"].cpu(), t.cpu())
    torch.cuda.set_device(1)
    assert torch.equal(ckptio.load(tmp_path / "m.safetensors", device="cuda:0")["t"].cpu(), t.cpu())
    torch.cuda.set_device(0)


def test_prepare_gpu_pins_the_staging_a_load_then_uses(tmp_path):
    """The engine's staging is pinned in the background after prepare_gpu; a
    load afterwards pins nothing more and returns the file's bytes."""
    import time
    sd = {"w": random_tensor(torch.bfloat16, (4096, 4096), seed=5)}
    path = tmp_path / "m.safetensors"
    st_save_file(sd, str(path))
    e = ckptio.Engine(gpu_path="pipeline")
    ckptio.prepare_gpu(torch.cuda.current_device(), engine=e)
    # Done when the pinned bytes stop growing (0.3 s unchanged, after some).
    deadline, reserved, still = time.monotonic() + 30, -1, 0.0
    while still < 0.3 and time.monotonic() < deadline:
        time.sleep(0.05)
        now = e.stats()["staging_reserved"]
        still = still + 0.05 if now == reserved and now > 0 else 0.0
        reserved = now
    assert reserved > 0
    got = ckptio.load(path, device="cuda", engine=e)
    assert tensor_bytes(got["w"]) == tensor_bytes(sd["w"])
    assert e.stats()["staging_reserved"] == reserved


def test_a_child_forked_after_cuda_saves_and_loads_cpu_tensors(tmp_path):
    """fork() after this process used CUDA (a DataLoader worker of a GPU
    job): in the child torch's is_pinned() raises, and ckptio's cpu saves
    and loads must still work (GPU transfers are refused there, see
    tests/gpu/fork_check.c)."""
    import os
    import signal
    ckptio.load(_save_for_fork(tmp_path), device="cuda")  # the parent's engine and CUDA in use
    path = str(tmp_path / "child.safetensors")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(60)
            torch.set_num_threads(1)
            t = torch.arange(1 << 20, dtype=torch.int32)
            ckptio.save({"t": t}, path)
            code = 0 if torch.equal(ckptio.load(path)["t"], t) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"


def _save_for_fork(tmp_path):
    path = tmp_path / "parent.safetensors"
    st_save_file({"w": random_tensor(torch.bfloat16, (1024, 1024), seed=9)}, str(path))
    return path
