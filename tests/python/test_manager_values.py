"""The manager and the values a training loop saves besides tensors: numpy's
RNG state, numpy scalars and arrays load back as they were saved; a value
the reader would refuse fails the save before the root is touched; a step
the reader refuses (written by another tool) is reported and kept, never
removed or replaced as damage (docs/MANAGER.md, "Values that are not
tensors")."""
import argparse
import hashlib
import io
import logging
import os
import pickle
import subprocess

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from conftest import CKPTIO_CLI, requires_cli  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def training_values():
    """What training loops keep beside their tensors."""
    np.random.seed(1234)
    np.random.rand(3)  # a state past its start (pos != 624)
    return {
        "w": torch.arange(12.0).reshape(3, 4),
        "np_rng": np.random.get_state(),
        "pcg64": np.random.default_rng(7).bit_generator.state,
        "mt19937": np.random.Generator(np.random.MT19937(11)).bit_generator.state,
        "loss": np.float64(0.1 + 0.2),
        "lr": np.float32(3e-4),
        "epoch": np.int64(-3),
        "done": np.bool_(True),
        "z": np.complex128(1 - 2j),
        "half": np.float16(0.5),
        "arrays": {
            "u8": np.arange(7, dtype=np.uint8),
            "i16": np.array([[-1, 2], [3, -4]], dtype=np.int16),
            "be_i4": np.arange(6, dtype=">i4").reshape(2, 3),
            "f2": np.linspace(0, 1, 5, dtype=np.float16),
            "c16": np.array([1 + 1j, np.nan - 2j]),
            "b": np.array([True, False, True]),
            "fortran": np.arange(12.0).reshape(3, 4).T,
            "empty": np.zeros((0, 3), dtype=np.uint16),
            "zero_d": np.array(7, dtype=np.uint32),
            "nan_bits": np.array([0x7FF8000000000123], dtype=np.uint64).view(np.float64),
        },
        "dtype": np.dtype("int16"),
    }


def as_loaded(values):
    """What torch's own reader gives back: numpy's unpickling (arrays in native byte order)."""
    return pickle.loads(pickle.dumps(values, protocol=2))


def template(values=None):
    """What a job passes to load: the same keys (dicts nest, as DCP flattens
    them), tensors of the right shape, anything else None."""
    values = training_values() if values is None else values
    if isinstance(values, dict):
        return {k: template(v) for k, v in values.items()}
    return torch.zeros_like(values) if isinstance(values, torch.Tensor) else None


def same(a, b, where="value"):
    """Equal values of the same types, bit for bit (arrays: dtype, shape, memory order)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape, a.flags.f_contiguous) == (b.dtype, b.shape, b.flags.f_contiguous), where
        assert a.tobytes(order="A") == b.tobytes(order="A"), where
        assert b.flags.writeable, where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def cli(*args):
    return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def tree_digest(path):
    """Names and bytes of every file under `path`."""
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            h.update(os.path.relpath(p, path).encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


# ---- numpy values load back --------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True])
def test_manager_loads_back_numpy_values(tmp_path, async_save):
    root = tmp_path / "run"
    saved = training_values()
    with ckptio.CheckpointManager(root, async_save=async_save) as mgr:
        mgr.save(100, saved)
        mgr.wait()
        assert mgr.latest_step() == 100
        got = template()
        assert mgr.load(got) == 100  # the full check: every byte item through the restricted unpickler
    same(as_loaded(saved), got)
    np.random.set_state(got["np_rng"])  # the state is usable as numpy's
    assert np.random.rand() == (np.random.seed(1234), np.random.rand(4))[1][3]
    if CKPTIO_CLI:
        r = cli("verify", root)
        assert r.returncode == 0 and "step 100: ok" in r.stdout, r.stderr


def test_dcp_reader_loads_numpy_values_of_both_writers(tmp_path):
    saved = training_values()
    for name, writer in (("torch", dcp.FileSystemWriter), ("ckptio", cdcp.FileSystemWriter)):
        path = tmp_path / name
        dcp.save(saved, storage_writer=writer(path), no_dist=True)
        got = template()
        dcp.load(got, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
        same(as_loaded(saved), got, name)
        if CKPTIO_CLI:
            r = cli("verify", path)
            assert r.returncode == 0, r.stderr


def test_torch_save_files_with_numpy_values(tmp_path):
    """ckptio.load reads numpy values from torch.save files; ckptio.save, which
    writes no numpy values, refuses them before it writes anything."""
    saved = {"rng": np.random.get_state(), "step": np.int64(5), "w": torch.ones(2)}
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    same(torch.load(buf, weights_only=False), ckptio.load(buf.getvalue()))
    path = tmp_path / "x.pt"
    with pytest.raises(TypeError) as ei:
        ckptio.save(saved, path)
    assert "numpy.ndarray at 'rng.1'" in str(ei.value) and "torch.from_numpy" in str(ei.value)
    assert os.listdir(tmp_path) == []


# ---- a value the reader would refuse fails the save up front ---------------------------------


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("where,key", [("top", "args"), ("nested", "cfg.ns")])
def test_refused_value_fails_the_save_and_writes_nothing(tmp_path, async_save, where, key):
    root = tmp_path / "run"
    ns = argparse.Namespace(lr=0.1, model="small")
    state = {"w": torch.ones(4), "args": ns} if where == "top" else {"w": torch.ones(4), "cfg": {"ns": ns}}
    mgr = ckptio.CheckpointManager(root, async_save=async_save)
    with pytest.raises(TypeError) as ei:
        mgr.save(100, state)
    msg = str(ei.value)
    assert f"cannot save '{key}' (argparse.Namespace)" in msg, msg
    assert "global 'argparse.Namespace'" in msg and "vars()" in msg, msg
    assert str(root) in msg and "step 100" in msg, msg
    assert not os.path.exists(root)  # nothing written: no root, no step, no lock file
    # The job stores vars(ns) instead: saved and loaded back.
    good = {"w": torch.ones(4), "args": vars(ns)}
    mgr.save(100, good)
    mgr.wait()
    got = {"w": torch.zeros(4), "args": {"lr": None, "model": None}}
    assert mgr.load(got) == 100 and got["args"] == vars(ns)
    mgr.close()


class _App:
    """A torch.distributed.checkpoint Stateful, as training loops pass one to dcp.save."""

    def __init__(self, extra):
        self.extra, self.calls = extra, 0

    def state_dict(self):
        self.calls += 1
        return {"w": torch.ones(2), "extra": self.extra}

    def load_state_dict(self, sd):
        self.extra = sd["extra"]


def test_stateful_values_are_checked_and_asked_once(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, async_save=True)
    bad = _App(argparse.Namespace(lr=0.1))
    with pytest.raises(TypeError) as ei:
        mgr.save(1, {"app": bad})
    assert "cannot save 'app.extra' (argparse.Namespace)" in str(ei.value) and not os.path.exists(root)
    good = _App({"lr": 0.1})
    mgr.save(1, {"app": good})
    mgr.wait()
    assert good.calls == 1  # as dcp.save alone: state_dict() once per save
    got = _App({"lr": None})
    assert mgr.load({"app": got}) == 1 and got.extra == {"lr": 0.1}
    mgr.close()


def test_dcp_writer_refuses_unless_allow_pickle(tmp_path):
    state = {"w": torch.ones(4), "args": argparse.Namespace(lr=0.1)}
    path = tmp_path / "c"
    with pytest.raises(BaseException) as ei:  # torch's CheckpointException around the writer's TypeError
        dcp.save(state, storage_writer=cdcp.FileSystemWriter(path), no_dist=True)
    assert "cannot save 'args' (argparse.Namespace)" in str(ei.value) and "allow_pickle=True" in str(ei.value)
    assert not os.path.exists(path / ".metadata")
    assert not [f for f in os.listdir(path) if f.endswith(".distcp")]  # no data file was written
    # Opting in saves it as torch does; only a reader that opts in too loads it.
    dcp.save(state, storage_writer=cdcp.FileSystemWriter(path, allow_pickle=True), no_dist=True)
    got = {"w": torch.zeros(4), "args": None}
    dcp.load(got, storage_reader=cdcp.FileSystemReader(path, allow_pickle=True), no_dist=True)
    assert got["args"] == argparse.Namespace(lr=0.1)
    with pytest.raises(TypeError):
        cdcp.FileSystemWriter(path, allow_pickle=1)


# ---- a step the reader refuses is reported, never removed ---------------------------------------


WRITERS = {
    "torch": dcp.FileSystemWriter,  # no manifest: the full check reads structure and byte items
    "ckptio": lambda p: cdcp.FileSystemWriter(p, allow_pickle=True),  # with a manifest whose hashes all match
}


def refused_step(root, step, writer="torch"):
    """A committed step whose byte item the reader refuses, as another tool
    (or an older ckptio) could have written it."""
    path = os.path.join(root, ckptio._ckptio.steps_dir_name(step))
    dcp.save({"w": torch.full((4,), float(step)), "args": argparse.Namespace(lr=0.1)},
             storage_writer=WRITERS[writer](path), no_dist=True)
    ckptio._ckptio.steps_commit(str(root), step)
    return path


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_refused_step_is_reported_and_never_removed(tmp_path, caplog, writer):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, keep_last=2, async_save=False)
    mgr.save(50, {"w": torch.full((4,), 50.0), "args": {"lr": 0.1}})
    step100 = refused_step(root, 100, writer)
    before = tree_digest(step100)

    # load: the refused step is skipped with its reason, named as a refusal, not as damage.
    got = {"w": torch.zeros(4), "args": {"lr": None}}
    with caplog.at_level(logging.WARNING, logger="ckptio.manager"):
        assert mgr.load(got) == 50
    skipped = [r.getMessage() for r in caplog.records if "skipping step 100" in r.getMessage()]
    assert len(skipped) == 1 and "(refused)" in skipped[0], skipped
    assert "global 'argparse.Namespace'" in skipped[0] and "not damage" in skipped[0], skipped[0]
    info = ckptio._ckptio.steps_check(str(root), 100, "full", engine=ckptio.Engine())
    assert info[1] == "refused"

    # A later save of the same step number does not replace it: it fails, the step stays.
    with pytest.raises(ckptio.CkptioError) as ei:
        mgr.save(100, {"w": torch.full((4,), 100.0), "args": {"lr": 0.1}})
    assert ei.value.status_name == "E_EXISTS", ei.value
    assert tree_digest(step100) == before
    # Retention counts it as a step like any other; it is not removed as damage.
    mgr.save(150, {"w": torch.full((4,), 150.0), "args": {"lr": 0.1}})
    assert [s for s in mgr.all_steps()] == [100, 150]
    assert tree_digest(step100) == before
    # Those who trust it load it as torch does.
    got = {"w": torch.zeros(4), "args": None}
    dcp.load(got, storage_reader=cdcp.FileSystemReader(step100, allow_pickle=True), no_dist=True)
    assert got["args"] == argparse.Namespace(lr=0.1)


@requires_cli
def test_cli_reports_a_refused_step_and_keeps_it(tmp_path):
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, async_save=False)
    mgr.save(50, {"w": torch.ones(4)})
    step100 = refused_step(root, 100)
    before = tree_digest(step100)
    r = cli("inspect", root)  # the fast check does not unpickle byte items
    assert r.returncode == 0 and "2 steps (2 complete, 0 partial, 0 damaged, 0 foreign)" in r.stdout, r.stdout
    r = cli("verify", root)
    assert r.returncode == 1, r.stdout
    assert "step 100: refused: ckptio's reader refuses it (not damage; the step is kept)" in r.stderr, r.stderr
    assert "global 'argparse.Namespace'" in r.stderr and "damaged" not in r.stderr, r.stderr
    r = cli("verify", "--latest", root)
    assert r.returncode == 0 and "step 50 is the newest complete step" in r.stdout, r.stderr
    assert "step 100 skipped (refused)" in r.stderr, r.stderr
    r = cli("clean", root)
    assert r.returncode == 0 and "removed 0 partial steps" in r.stdout, r.stdout
    assert tree_digest(step100) == before


def test_step_saved_without_checksums_is_not_damaged(tmp_path):
    """A step saved with checksums=False has no manifest: the full check reads
    its structure and byte items instead of calling it damaged."""
    root = tmp_path / "run"
    mgr = ckptio.CheckpointManager(root, async_save=False, writer_options={"checksums": False})
    mgr.save(10, {"w": torch.ones(4), "rng": np.random.get_state()})
    assert ckptio._ckptio.steps_check(str(root), 10, "full", engine=ckptio.Engine())[1] == "complete"
    got = {"w": torch.zeros(4), "rng": None}
    assert mgr.load(got) == 10 and torch.equal(got["w"], torch.ones(4))
    mgr.save(20, {"w": torch.ones(4), "rng": np.random.get_state()})
    assert mgr.all_steps() == [10, 20]
