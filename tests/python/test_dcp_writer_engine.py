"""The engine of ckptio.dcp.FileSystemWriters made without engine=: one per
configuration for the whole process, so that a new writer per save (the usual
``dcp.save(sd, storage_writer=FileSystemWriter(path))`` every N steps) reuses
its threads and memory; never the default engine that loads use, so that an
async save writing in the background does not hold up a load; and working in
fork()ed children."""
import multiprocessing
import os
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from ckptio import _ckptio  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

CHILD_TIMEOUT = 60


def _save(sd, writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=True)


def _load(template, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(template, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    return template


def _state(seed, n=1 << 16):
    return {"w": torch.arange(n, dtype=torch.float32) + seed, "b": torch.full((7,), float(seed)), "step": seed}


def _template(n=1 << 16):
    return {"w": torch.zeros(n), "b": torch.zeros(7), "step": 0}


def _assert_state(got, seed, n=1 << 16):
    want = _state(seed, n)
    assert torch.equal(got["w"], want["w"]) and torch.equal(got["b"], want["b"]) and got["step"] == seed


def test_successive_saves_through_new_writers_use_one_engine(tmp_path):
    first = cdcp.FileSystemWriter(tmp_path / "s1")
    _save(_state(1), first)
    written = first.engine.stats()["bytes_written"]
    assert written > 0
    second = cdcp.FileSystemWriter(tmp_path / "s2")
    assert second.engine is first.engine
    _save(_state(2), second)
    # The second save moved its bytes through the first save's engine.
    assert first.engine.stats()["bytes_written"] > written
    _assert_state(_load(_template(), tmp_path / "s1"), 1)
    _assert_state(_load(_template(), tmp_path / "s2"), 2)


def test_the_shared_engine_follows_sync_files_and_copy_ahead(tmp_path):
    synced = cdcp.FileSystemWriter(tmp_path / "a")
    unsynced = cdcp.FileSystemWriter(tmp_path / "b", sync_files=False)
    assert synced.engine.get("sync") == 1 and unsynced.engine.get("sync") == 0
    assert unsynced.engine is not synced.engine
    assert cdcp.FileSystemWriter(tmp_path / "c", sync_files=False).engine is unsynced.engine
    small = cdcp.FileSystemWriter(tmp_path / "d", per_thread_copy_ahead=3 << 20)
    assert small.engine is not synced.engine
    assert small.engine.get("staging_bytes") == (3 << 20) * max(small.engine.get("threads"), 1)
    assert cdcp.FileSystemWriter(tmp_path / "e", per_thread_copy_ahead=3 << 20).engine is small.engine
    # Not the default engine, which loads and ckptio.save/load use.
    assert synced.engine is not ckptio.default_engine()
    # engine= keeps its own engine.
    own = ckptio.Engine()
    assert cdcp.FileSystemWriter(tmp_path / "f", engine=own).engine is own


def test_thread_count_still_splits_the_files_on_the_shared_engine(tmp_path):
    sd = {f"t{i}": torch.full((1000 + i,), float(i)) for i in range(6)}
    one = cdcp.FileSystemWriter(tmp_path / "one")
    three = cdcp.FileSystemWriter(tmp_path / "three", thread_count=3)
    assert three.engine is one.engine
    _save(sd, one)
    _save(sd, three)
    assert len([n for n in os.listdir(tmp_path / "one") if n.endswith(".distcp")]) == 1
    assert len([n for n in os.listdir(tmp_path / "three") if n.endswith(".distcp")]) == 3
    out = _load({k: torch.zeros_like(v) for k, v in sd.items()}, tmp_path / "three")
    assert all(torch.equal(out[k], sd[k]) for k in sd)


class _HeldWrite:
    """Keeps the writer's engine inside its data write (its lock held) until
    released: the write's first progress report blocks on an event. In this
    process only: a forked child writes freely."""

    def __init__(self, monkeypatch):
        self.inside = threading.Event()
        self.release = threading.Event()
        real = _ckptio.dcp_write
        pid = os.getpid()

        def held(*args):
            if os.getpid() != pid:
                return real(*args)

            def report(done, total):
                self.inside.set()
                self.release.wait(CHILD_TIMEOUT)

            previous = _ckptio.set_progress(report)
            try:
                return real(*args)
            finally:
                _ckptio.set_progress(previous)

        monkeypatch.setattr(_ckptio, "dcp_write", held)


def _async_save(sd, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dcp.async_save(sd, storage_writer=cdcp.FileSystemWriter(path), no_dist=True)


def test_a_load_runs_while_an_async_save_holds_the_writer_engine(tmp_path, monkeypatch):
    _save(_state(3), cdcp.FileSystemWriter(tmp_path / "old"))
    held = _HeldWrite(monkeypatch)
    fut = _async_save(_state(4, 1 << 20), tmp_path / "new")
    try:
        assert held.inside.wait(CHILD_TIMEOUT), "the async save never reached its data write"
        out = {}
        loader = threading.Thread(target=lambda: out.update(_load(_template(), tmp_path / "old")))
        loader.start()
        loader.join(CHILD_TIMEOUT)
        assert not loader.is_alive(), "the load waited for the async save's write"
        _assert_state(out, 3)
    finally:
        held.release.set()
    fut.result(timeout=CHILD_TIMEOUT)
    _assert_state(_load(_template(1 << 20), tmp_path / "new"), 4, 1 << 20)


def test_concurrent_saves_through_new_writers_take_turns_and_both_commit(tmp_path):
    errors = []

    def save(seed):
        try:
            for k in range(3):
                _save(_state(seed + k, 1 << 18), cdcp.FileSystemWriter(tmp_path / f"t{seed}"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(s,)) for s in (10, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    assert not any(t.is_alive() for t in threads) and not errors
    _assert_state(_load(_template(1 << 18), tmp_path / "t10"), 12, 1 << 18)
    _assert_state(_load(_template(1 << 18), tmp_path / "t20"), 22, 1 << 18)


def _child_saves(path, engine_id, result):
    torch.set_num_threads(1)  # torch's OpenMP pool does not survive fork()
    writer = cdcp.FileSystemWriter(path)
    result.put(id(writer.engine) == engine_id)
    _save(_state(6), writer)
    _assert_state(_load(_template(), path), 6)
    result.put("ok")


def test_a_forked_child_saves_through_the_inherited_engine(tmp_path, monkeypatch):
    parent = cdcp.FileSystemWriter(tmp_path / "p")
    _save(_state(5), parent)
    # Fork while a parent thread is inside the shared engine's call: the
    # child must not wait for a lock nobody there will release.
    held = _HeldWrite(monkeypatch)
    fut = _async_save(_state(7, 1 << 20), tmp_path / "bg")
    try:
        assert held.inside.wait(CHILD_TIMEOUT)
        ctx = multiprocessing.get_context("fork")
        result = ctx.Queue()
        child = ctx.Process(target=_child_saves, args=(str(tmp_path / "c"), id(parent.engine), result))
        child.start()
        child.join(CHILD_TIMEOUT)
        if child.is_alive():
            child.kill()
            pytest.fail(f"the forked child hung in its save (no exit after {CHILD_TIMEOUT} s)")
        assert child.exitcode == 0
        assert result.get(timeout=5) is True  # the child's new writer took the inherited engine
        assert result.get(timeout=5) == "ok"
    finally:
        held.release.set()
    fut.result(timeout=CHILD_TIMEOUT)
    _assert_state(_load(_template(), tmp_path / "c"), 6)
    _assert_state(_load(_template(1 << 20), tmp_path / "bg"), 7, 1 << 20)
    _save(_state(8), cdcp.FileSystemWriter(tmp_path / "p"))  # the parent's engine still works
    _assert_state(_load(_template(), tmp_path / "p"), 8)
