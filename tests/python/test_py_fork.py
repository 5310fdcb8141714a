"""ckptio in fork()ed children: multiprocessing's default start method on
Linux and DataLoader workers fork a process that already used ckptio.

The parent runs transfers first (the default engine's worker threads, an
explicit Engine's threads and io_uring rings exist), then children load and
save through the same objects. Every wait has a timeout, so a child that
hangs fails the test instead of blocking the run.
"""
import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

import ckptio

CHILD_TIMEOUT = 60
N = 8 << 20  # int32 elements: 32 MiB, several engine tasks per transfer

# What the children inherit (set by the test before forking): an explicit
# engine and an open CheckpointFile.
_ENGINE = None
_OPEN = None


def _expected(seed: int) -> torch.Tensor:
    return torch.arange(N, dtype=torch.int32) * 3 + seed


def _child_job(args):
    """In a pool worker: load the parent's file through the default engine
    and the inherited explicit one, then save a file of its own."""
    src, dst, seed = args
    torch.set_num_threads(1)  # as DataLoader workers do: torch's OpenMP pool does not survive fork()
    assert torch.equal(ckptio.load(src)["w"], _expected(1))
    assert torch.equal(ckptio.load(src, engine=_ENGINE)["w"], _expected(1))
    assert torch.equal(_OPEN.get_tensor("w"), _expected(1))
    ckptio.save({"w": _expected(seed)}, dst)
    ckptio.save({"w": _expected(seed)}, dst + ".pt", format="torch", engine=_ENGINE)
    return os.getpid()


def _parent_uses_ckptio(path: str) -> None:
    global _ENGINE, _OPEN
    ckptio.save({"w": _expected(1)}, path)
    assert torch.equal(ckptio.load(path)["w"], _expected(1))
    _ENGINE = ckptio.Engine(threads=4, chunk_bytes=1 << 20)
    assert torch.equal(ckptio.load(path, engine=_ENGINE)["w"], _expected(1))
    _OPEN = ckptio.open(path, engine=_ENGINE)
    assert torch.equal(_OPEN.get_tensor("w"), _expected(1))


def test_multiprocessing_fork_children_load_and_save(tmp_path):
    src = str(tmp_path / "parent.safetensors")
    _parent_uses_ckptio(src)
    ctx = multiprocessing.get_context("fork")
    jobs = [(src, str(tmp_path / f"child{i}.safetensors"), 10 + i) for i in range(4)]
    pool = ctx.Pool(2)
    try:
        pids = pool.map_async(_child_job, jobs).get(timeout=CHILD_TIMEOUT)
    except multiprocessing.TimeoutError:
        pytest.fail(f"fork()ed children hung in ckptio (no result after {CHILD_TIMEOUT} s)")
    finally:
        pool.terminate()
        pool.join()
    assert os.getpid() not in pids
    for _, dst, seed in jobs:
        assert torch.equal(ckptio.load(dst)["w"], _expected(seed))
        assert torch.equal(torch.load(dst + ".pt", weights_only=True)["w"], _expected(seed))
    # The parent's engines still work after their children used their copies.
    assert torch.equal(ckptio.load(src, engine=_ENGINE)["w"], _expected(1))
    assert torch.equal(ckptio.load(src)["w"], _expected(1))
    assert torch.equal(_OPEN.get_tensor("w"), _expected(1))
    _OPEN.close()


class _Shards(torch.utils.data.Dataset):
    """Item i is tensor 'shard.i' of a checkpoint, read through ckptio."""

    def __init__(self, path: str, n: int):
        self.path, self.n = path, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with ckptio.open(self.path) as f:
            return f.get_tensor(f"shard.{i}")


def test_dataloader_fork_workers_read_through_ckptio(tmp_path):
    path = str(tmp_path / "shards.safetensors")
    shards = {f"shard.{i}": torch.full((1 << 20,), float(i)) for i in range(8)}
    ckptio.save(shards, path)
    ckptio.load(path)  # the default engine's threads run in the parent
    loader = torch.utils.data.DataLoader(_Shards(path, 8), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", timeout=CHILD_TIMEOUT)
    got = []
    try:
        for item in loader:
            got.append(item)
    except RuntimeError as exc:  # DataLoader's "timed out after N seconds"
        pytest.fail(f"DataLoader workers hung in ckptio: {exc}")
    assert len(got) == 8
    for i, t in enumerate(got):
        assert torch.equal(t, shards[f"shard.{i}"])


def test_fork_while_another_thread_is_inside_a_call(tmp_path):
    """A parent thread inside ckptio.load (the default engine's locks held,
    its workers busy) at the moment of fork(): the child's loads must not
    wait for that thread."""
    path = str(tmp_path / "busy.safetensors")
    ckptio.save({"w": _expected(1)}, path)
    stop = threading.Event()
    loads = []

    def keep_loading():
        while not stop.is_set():
            loads.append(ckptio.load(path)["w"].sum().item())

    t = threading.Thread(target=keep_loading)
    t.start()
    try:
        while not loads:
            time.sleep(0.01)
        pid = os.fork()
        if pid == 0:  # the child: exit code says what happened, never returns to pytest
            code = 1
            try:
                signal.alarm(CHILD_TIMEOUT)
                torch.set_num_threads(1)
                ok = torch.equal(ckptio.load(path)["w"], _expected(1))
                ckptio.save({"w": _expected(2)}, path + ".child")
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        stop.set()
        t.join()
    assert not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM), \
        f"the child hung in ckptio (killed after {CHILD_TIMEOUT} s)"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
    assert torch.equal(ckptio.load(path + ".child")["w"], _expected(2))


def test_a_child_whose_cuda_is_unusable_still_saves_and_loads_cpu_tensors(tmp_path, monkeypatch):
    """In a child forked after its parent initialised CUDA, torch's
    is_pinned() raises ("CUDA error: initialization error"; found by this
    file's tests on the GPU machine after the CUDA tests had run). ckptio
    then treats cpu memory as not pinned: saves and loads into existing
    tensors work. (tests/python/test_py_gpu.py forks such a child for real.)"""
    from ckptio import _adapt

    def unusable(self):
        raise RuntimeError("CUDA error: initialization error (simulated forked child)")
    monkeypatch.setattr(torch.Tensor, "is_pinned", unusable)
    assert _adapt.host_kind(torch.zeros(2)) == _adapt.MEM_HOST
    path = str(tmp_path / "child.safetensors")
    ckptio.save({"w": _expected(5)}, path)
    out = {"w": torch.zeros(N, dtype=torch.int32)}
    ckptio.load(path, out=out)
    assert torch.equal(out["w"], _expected(5))
    ckptio.save({"w": _expected(6)}, path + ".pt", format="torch")
    assert torch.equal(ckptio.load(path + ".pt")["w"], _expected(6))
