"""ckptio.dcp.FileSystemWriter's staging: per_thread_copy_ahead sizes the
engine's staging memory, and a save that fails anywhere (in this writer's
hooks or in torch's code between them) leaves the writer free for the next
save, not "in flight" with data it will never write."""
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from ckptio.dcp import _writer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def test_per_thread_copy_ahead_sets_staging_per_worker(tmp_path):
    default = cdcp.FileSystemWriter(tmp_path / "a")
    assert default.engine.get("staging_bytes") == ckptio.Engine().get("staging_bytes")
    w = cdcp.FileSystemWriter(tmp_path / "b", per_thread_copy_ahead=3 << 20)
    workers = max(w.engine.get("threads"), 1)
    assert w.engine.get("staging_bytes") == (3 << 20) * workers
    # Clamped to the engine's bounds (torch accepts 0: no copy-ahead).
    assert cdcp.FileSystemWriter(tmp_path / "c", per_thread_copy_ahead=0).engine.get("staging_bytes") == \
        ckptio.Engine.bounds("staging_bytes")[0]
    # An engine passed in keeps its own settings.
    eng = ckptio.Engine(staging_bytes=64 << 20)
    assert cdcp.FileSystemWriter(tmp_path / "d", per_thread_copy_ahead=1 << 20, engine=eng).engine is eng
    assert eng.get("staging_bytes") == 64 << 20


def test_small_copy_ahead_bounds_staging_and_round_trips(tmp_path):
    sd = {"w": torch.randn(1 << 20), "v": torch.arange(1000)}  # 4 MiB
    w = cdcp.FileSystemWriter(tmp_path / "c", per_thread_copy_ahead=1 << 20)
    # Unaligned host memory bounces through staging. The engine is the
    # process's shared one for this configuration: the setting is put back.
    direct = w.engine.get("direct")
    w.engine.set("direct", "on")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(sd, storage_writer=w, no_dist=True)
    finally:
        w.engine.set("direct", direct)
    stats = w.engine.stats()
    assert stats["staging_peak"] <= w.engine.get("staging_bytes")
    out = {"w": torch.zeros(1 << 20), "v": torch.zeros(1000, dtype=torch.int64)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=cdcp.FileSystemReader(tmp_path / "c"), no_dist=True)
    assert torch.equal(out["w"], sd["w"]) and torch.equal(out["v"], sd["v"])


class FailingPlanner(DefaultSavePlanner):
    """Raises in torch's own planning step, between the writer's hooks."""

    def create_local_plan(self):
        raise RuntimeError("planner exploded")


def _async(sd, writer, path, planner=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dcp.async_save(sd, checkpoint_id=path, storage_writer=writer, planner=planner, no_dist=True)


def _second_save_completes(writer, path, value, timeout=30):
    """Runs a second async save in a thread: it must not hang in stage()."""
    box = {}

    def go():
        try:
            box["fut"] = _async({"w": torch.full((10,), value)}, writer, path)
            box["fut"].result(timeout)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["err"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the save after a failed one hangs"
    assert "err" not in box, box.get("err")
    out = {"w": torch.zeros(10)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    assert torch.equal(out["w"], torch.full((10,), value))


def _fail_in_hook(monkeypatch):
    calls = {"n": 0}
    real = _writer.FileSystemWriter._new_token

    def token(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("no token today")
        return real(self)

    monkeypatch.setattr(_writer.FileSystemWriter, "_new_token", token)


@pytest.mark.parametrize("busy", ["error", "wait"])
@pytest.mark.parametrize("where", ["torch_planner", "writer_hook"])
def test_failed_async_save_releases_the_writer(tmp_path, monkeypatch, busy, where):
    writer = cdcp.FileSystemWriter(tmp_path / "x", cache_staged_state_dict=True, async_busy=busy)
    planner = None
    if where == "torch_planner":
        planner = FailingPlanner()
    else:
        _fail_in_hook(monkeypatch)
    fut = _async({"w": torch.ones(10)}, writer, tmp_path / "first", planner)
    with pytest.raises(BaseException) as exc:  # CheckpointException is a BaseException
        fut.result(30)
    assert ("planner exploded" if where == "torch_planner" else "no token today") in str(exc.value)
    assert writer.wait_staging(timeout=10)
    _second_save_completes(writer, tmp_path / "second", 5.0)
    # And the writer still guards a save that is really in flight.
    gate = threading.Event()
    real = _writer.FileSystemWriter._write
    monkeypatch.setattr(_writer.FileSystemWriter, "_write", lambda self, p, pl: (gate.wait(30), real(self, p, pl))[1])
    fut = _async({"w": torch.ones(10)}, writer, tmp_path / "third")
    try:
        assert not writer.wait_staging(timeout=0.3)
        if busy == "error":
            with pytest.raises(RuntimeError, match="still writing its staged data"):
                _async({"w": torch.ones(10)}, writer, tmp_path / "fourth")
    finally:
        gate.set()
    fut.result(30)
    assert writer.wait_staging(timeout=10)


def test_failed_sync_save_then_async_save(tmp_path, monkeypatch):
    """dcp.save (no stage()) failing in a hook leaves nothing behind either."""
    writer = cdcp.FileSystemWriter(tmp_path / "x", async_busy="error")
    _fail_in_hook(monkeypatch)
    with pytest.raises(BaseException, match="no token today"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"w": torch.ones(3)}, checkpoint_id=tmp_path / "a", storage_writer=writer, no_dist=True)
    _second_save_completes(writer, tmp_path / "b", 2.0)
