"""Two saves into one DCP checkpoint directory at once.

ckptio.dcp.FileSystemWriter serializes the saves of one directory with a lock
(docs/DCP.md "Concurrent saves"): the coordinator takes it before the global
plan is returned (so no rank writes a data file before it holds it) and keeps
it until the files of older saves are removed. A second save waits
(dir_busy="wait", the default), or fails at once with a clear error
(dir_busy="error"), or after a number of seconds; it never deletes what the
other committed.

Two long-lived worker processes (torch imported once) save different
versions into one directory over an older checkpoint, started together,
round after round. After each round the directory loads with ckptio's and
torch's FileSystemReader, every tensor and the byte item equal one version a
writer reported as saved (never a mix, never a missing file),
ckptio.dcp.verify passes, and only that save's files are left; each writer
either succeeded or failed with the documented busy error.
"""
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

HERE = str(Path(__file__).resolve().parent)
LOCK = ".ckptio-dcp.lock"
BUSY = re.compile(r"another save holds the directory")


def make_version(v):
    g = torch.Generator().manual_seed(500 + v)
    sd = {f"t{i}": torch.randn(1 << 16, generator=g) for i in range(4)}
    sd["nested"] = {"i": torch.arange(1000, dtype=torch.int64) * v}
    sd["step"] = v
    return sd


def blank():
    sd = make_version(0)
    return {k: ({kk: torch.full_like(vv, -1) for kk, vv in v.items()} if isinstance(v, dict) else
                torch.full_like(v, -1) if isinstance(v, torch.Tensor) else None) for k, v in sd.items()}


def load(path, reader):
    out = blank()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def version_of(got, what):
    """The version every entry of `got` equals (asserts there is one)."""
    v = got["step"]
    assert isinstance(v, int) and v > 0, f"{what}: step {v!r}"
    want = make_version(v)
    bad = [k for k in want if k != "step" and not (
        all(torch.equal(got[k][kk], want[k][kk]) for kk in want[k]) if isinstance(want[k], dict)
        else torch.equal(got[k], want[k]))]
    assert not bad, f"{what}: step says version {v} but {bad} differ from it (a mix of saves)"
    return v


def referenced(path):
    with open(os.path.join(path, ".metadata"), "rb") as f:
        md = pickle.load(f)
    return {info.relative_path for info in md.storage_data.values()}


def check_directory(path, saved, what):
    """The directory holds exactly one whole checkpoint, of a version in
    `saved`, and nothing else of a DCP save (but the lock file)."""
    names = set(os.listdir(path))
    files = referenced(path)
    missing = files - names
    assert not missing, f"{what}: .metadata names missing files {sorted(missing)}; directory {sorted(names)}"
    v = version_of(load(path, cdcp.FileSystemReader(path)), f"{what} (ckptio reader)")
    assert v in saved, f"{what}: version {v} is not one a writer reported as saved ({saved})"
    assert version_of(load(path, dcp.FileSystemReader(path)), f"{what} (torch reader)") == v
    report = cdcp.verify(path)
    assert report["checked"] == report["items"], f"{what}: verify {report}"
    (manifest,) = [n for n in names if n.startswith(".ckptio-manifest-")] or [None]
    assert names - {LOCK} == files | {".metadata", manifest}, f"{what}: left over {sorted(names - files)}"
    return v


def shm_dir(tmp_path):
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path(tempfile.mkdtemp(prefix="ckptio-dcp-concurrent-", dir="/dev/shm"))
    return Path(tempfile.mkdtemp(dir=tmp_path))


@pytest.fixture
def base(tmp_path):
    d = shm_dir(tmp_path)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# A worker imports torch once, then runs "save PATH VERSION DIR_BUSY" lines
# from stdin: one dcp.save with a new writer each, answering "ok" or
# "err MESSAGE" (DIR_BUSY "-" passes no dir_busy).
WORKER = r"""
import os, sys, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
import torch.distributed.checkpoint as dcp
import ckptio.dcp as cdcp
sys.path.insert(0, sys.argv[1])
from test_dcp_concurrent import make_version
versions = {}
print("ready", flush=True)
for line in sys.stdin:
    _, path, v, busy = line.split()
    v = int(v)
    sd = versions.setdefault(v, make_version(v))
    kwargs = {} if busy == "-" else {"dir_busy": float(busy) if busy[0].isdigit() else busy}
    try:
        dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path, thread_count=2, **kwargs), no_dist=True)
        print("ok", flush=True)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        print("err " + " ".join(str(e).split()), flush=True)
"""


class Workers:
    def __init__(self, n):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.procs = [subprocess.Popen([sys.executable, "-c", WORKER, HERE], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=env)
                      for _ in range(n)]
        for p in self.procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", f"worker did not start: {line}{p.stdout.read()[-3000:]}"

    def save_all(self, path, versions, busy):
        """Starts one save per worker together; returns their answers."""
        for p, v in zip(self.procs, versions):
            p.stdin.write(f"save {path} {v} {busy}\n")
            p.stdin.flush()
        return [p.stdout.readline().strip() for p in self.procs]

    def close(self):
        for p in self.procs:
            p.stdin.close()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def workers():
    w = Workers(2)
    yield w
    w.close()


def _rounds(workers, base, busy, rounds):
    import time

    pristine, path = base / "pristine", base / "ckpt"
    dcp.save(make_version(9), storage_writer=cdcp.FileSystemWriter(pristine, thread_count=2), no_dist=True)
    outcomes = []
    t0 = time.monotonic()
    for r in range(rounds):
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(pristine, path)
        versions = (1 + 2 * r, 2 + 2 * r)
        answers = workers.save_all(path, versions, busy)
        what = f"round {r} (dir_busy {busy}): writers said {answers}"
        for a in answers:
            assert a == "ok" or (busy != "-" and BUSY.search(a)), what
        saved = {v for v, a in zip(versions, answers) if a == "ok"}
        assert saved, what
        check_directory(str(path), saved, what)
        outcomes.append(tuple(a == "ok" for a in answers))
    print(f"{rounds} rounds in {time.monotonic() - t0:.2f} s: {outcomes}")
    return outcomes


def test_two_processes_save_into_one_directory(workers, base):
    """Default (wait): both saves succeed, one after the other; the directory
    always holds exactly the later one."""
    outcomes = _rounds(workers, base, "-", 40)
    assert all(o == (True, True) for o in outcomes), outcomes


def test_two_processes_with_dir_busy_error(workers, base):
    """dir_busy="error": a writer that finds the directory busy fails with
    the documented error, having changed nothing; the other's save is whole."""
    _rounds(workers, base, "error", 30)


# ---- one save holds the directory ----------------------------------------------------

# Holds the directory's lock as another process would ("EX" or "SH") until
# stdin closes; "pause" instead runs a real save that stops (holding the
# lock) after its data files are committed, until it is killed.
HOLDER = r"""
import fcntl, os, sys, time
path, how = sys.argv[1], sys.argv[2]
if how == "pause":
    import warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed.checkpoint as dcp
    import ckptio.dcp as cdcp
    from ckptio.dcp import _writer
    sys.path.insert(0, sys.argv[3])
    from test_dcp_concurrent import make_version
    def pause(stage):
        if stage == "data_committed":
            print("held", flush=True)
            time.sleep(600)
    _writer._crash_point = pause
    dcp.save(make_version(int(sys.argv[4])), storage_writer=cdcp.FileSystemWriter(path), no_dist=True)
    sys.exit(3)
os.makedirs(path, exist_ok=True)
fd = os.open(os.path.join(path, ".ckptio-dcp.lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX if how == "EX" else fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""


class Holder:
    def __init__(self, path, how, version=0):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), how, HERE, str(version)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.strip() == "held", line

    def release(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


def save(path, v, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(make_version(v), storage_writer=cdcp.FileSystemWriter(path, **kwargs), no_dist=True)


def save_per_rank(path, v, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.distributed.checkpoint.state_dict_saver import _save_state_dict

        writer = cdcp.FileSystemWriter(path, **kwargs)
        writer.reset()
        _save_state_dict(make_version(v), writer, no_dist=True, use_collectives=False)


def busy_failure(exc_info):
    """The CkptioError a busy directory gives (in torch's CheckpointException,
    except without collectives, where torch calls the hook directly)."""
    from torch.distributed.checkpoint.api import CheckpointException

    err = exc_info.value
    if isinstance(err, CheckpointException):
        (err,) = [e for e, _ in err.failures.values()]
    assert isinstance(err, ckptio.CkptioError) and err.status_name == "E_BUSY" and err.operation == "lock", err
    assert BUSY.search(str(err)) and "this save wrote nothing and the checkpoint is unchanged" in str(err), err
    return err


def test_second_save_waits_or_fails_as_documented(base):
    """While another process holds the directory: dir_busy="error" fails at
    once naming the holder's pid, a number of seconds fails after that long,
    "wait" writes nothing until the holder is gone, then saves; nothing of
    the directory changes while it waits or after it fails."""
    path = base / "ckpt"
    save(path, 1)
    before = sorted(os.listdir(path))
    holder = Holder(path, "EX")
    try:
        with pytest.raises(BaseException) as e:
            save(path, 2, dir_busy="error")
        err = busy_failure(e)
        assert f"held by pid {holder.proc.pid}" in str(err), err
        assert sorted(os.listdir(path)) == before
        import time

        t0 = time.monotonic()
        with pytest.raises(BaseException) as e:
            save(path, 2, dir_busy=0.3)
        assert time.monotonic() - t0 >= 0.3 and "after waiting" in str(busy_failure(e))
        assert sorted(os.listdir(path)) == before

        import threading

        done = []
        t = threading.Thread(target=lambda: done.append(save(path, 3)))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not done, "the save did not wait for the other one"
        assert sorted(os.listdir(path)) == before, "a waiting save wrote into the directory"
    finally:
        holder.release()
    t.join(30)
    assert done == [None]
    assert check_directory(str(path), {3}, "after waiting") == 3
    for bad in ("soon", -1, float("nan"), True):
        with pytest.raises(ValueError, match="dir_busy"):
            cdcp.FileSystemWriter(path, dir_busy=bad)


def test_killed_holder_releases_the_directory(base):
    """A save killed with SIGKILL while it holds the directory (its data
    files committed, .metadata not yet replaced) does not block the next
    one: flock dies with the process. While it lives, it is busy."""
    path = base / "ckpt"
    save(path, 1)
    holder = Holder(path, "pause", version=2)
    try:
        with pytest.raises(BaseException) as e:
            save(path, 3, dir_busy="error")
        busy_failure(e)
    finally:
        holder.kill()
    assert check_directory_loads(path) == 1  # the killed save's data files are unreferenced
    save(path, 3, dir_busy="error")
    assert check_directory(str(path), {3}, "after the kill") == 3


def test_a_waiting_save_stays_interruptible(base):
    """dir_busy="wait" waits in libckptio with the GIL released, yet Ctrl-C
    (a KeyboardInterrupt from a signal handler) ends the wait at once, and
    the save wrote nothing."""
    import signal
    import time

    from ckptio import _ckptio

    path = base / "ckpt"
    save(path, 1)
    held = _ckptio.dcp_lock_acquire(str(path), None, False, 0.0)  # another save holds the directory

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(BaseException) as e:  # torch wraps it in a CheckpointException
            save(path, 2, dir_busy="wait")
        assert time.monotonic() - t0 < 5
        assert isinstance(e.value, KeyboardInterrupt) or "KeyboardInterrupt" in str(e.value), repr(e.value)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        _ckptio.dcp_lock_release(held)
    assert check_directory_loads(path) == 1
    save(path, 2, dir_busy="error")  # the interrupted save left the directory free
    assert check_directory(str(path), {2}, "after the interrupted wait") == 2


def check_directory_loads(path):
    return version_of(load(str(path), cdcp.FileSystemReader(str(path))), "load")


def test_saves_without_collectives_share_the_directory(base):
    """Per-rank saves (use_collectives=False, __{rank}.metadata) delete
    nothing: they take the lock shared, beside each other, never beside a
    collective save (whose cleanup would delete their new files)."""
    path = base / "ckpt"
    shared = Holder(path, "SH")
    try:
        save_per_rank(path, 1, dir_busy="error")
        with pytest.raises(BaseException) as e:
            save(path, 2, dir_busy="error")
        busy_failure(e)
    finally:
        shared.release()
    exclusive = Holder(path, "EX")
    try:
        with pytest.raises(BaseException) as e:
            save_per_rank(path, 3, dir_busy="error")
        busy_failure(e)
    finally:
        exclusive.release()
    assert os.path.exists(path / "__0.metadata")
    # A collective save keeps what the per-rank metadata references.
    save(path, 4)
    with open(path / "__0.metadata", "rb") as f:
        per_rank = {i.relative_path for i in pickle.load(f).storage_data.values()}
    assert per_rank <= set(os.listdir(path))
    (token,) = {n.split("_")[3] for n in per_rank}
    assert f".ckptio-manifest-{token}.json" in os.listdir(path)  # its manifest stays with its data files
    assert check_directory_loads(path) == 4


class RankZeroReader(cdcp.FileSystemReader):
    """Loads the checkpoint __0.metadata describes (torch's loader reads .metadata)."""

    def read_metadata(self, *args, **kwargs):
        return super().read_metadata(rank=0)


def test_a_save_with_a_cleanup_waits_for_a_save_without_collectives(base, monkeypatch):
    """A save without collectives whose data files are written (its metadata not yet): a save with a
    cleanup fails with dir_busy="error" and with "wait" commits only after it, keeping its files and
    manifest: both checkpoints load whole."""
    import threading

    from ckptio.dcp import _writer

    path = base / "ckpt"
    save(path, 1)
    outcome = {}

    def run(name, *args, **kwargs):
        try:
            save(*args, **kwargs)
            outcome[name] = "saved"
        except BaseException as e:  # noqa: BLE001 - checked below
            outcome[name] = e

    waiting = threading.Thread(target=run, args=("wait", path, 3))

    def meanwhile(stage):
        if stage != "data_committed":
            return
        monkeypatch.setattr(_writer, "_crash_point", None)
        busy = threading.Thread(target=run, args=("error", path, 2), kwargs={"dir_busy": "error"})
        busy.start()
        busy.join()
        waiting.start()
        time.sleep(0.3)
        assert "wait" not in outcome  # still waiting for this save

    monkeypatch.setattr(_writer, "_crash_point", meanwhile)
    save_per_rank(path, 4)
    monkeypatch.setattr(_writer, "_crash_point", None)
    waiting.join(60)
    assert outcome["wait"] == "saved", outcome
    assert isinstance(outcome["error"], BaseException), outcome  # the save with dir_busy="error" failed ...
    busy_failure(pytest.ExceptionInfo.from_exception(outcome["error"]))  # ... as a busy directory fails
    assert check_directory_loads(path) == 3
    assert version_of(load(str(path), RankZeroReader(str(path))), "per-rank load") == 4
    names = os.listdir(path)
    tokens = {n.split("_")[3] for n in names if n.startswith("__") and n.endswith(".distcp")}
    assert len(tokens) == 2 and all(f".ckptio-manifest-{t}.json" in names for t in tokens), names


def test_async_save_holds_the_directory_until_it_commits(base):
    """dcp.async_save: the background save holds the directory; another
    writer is busy until the future is done."""
    import threading

    from ckptio.dcp import _writer

    path = base / "ckpt"
    save(path, 1)
    gate, reached = threading.Event(), threading.Event()
    main = threading.current_thread()

    def pause(stage):
        if stage == "data_committed" and threading.current_thread() is not main:
            reached.set()
            gate.wait(30)

    _writer._crash_point = pause
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fut = dcp.async_save(make_version(2), storage_writer=cdcp.FileSystemWriter(path), no_dist=True)
        assert reached.wait(30)
        with pytest.raises(BaseException) as e:
            save(path, 3, dir_busy="error")
        busy_failure(e)
    finally:
        gate.set()
        _writer._crash_point = None
    fut.result(timeout=30)
    save(path, 3, dir_busy="error")
    assert check_directory(str(path), {3}, "after the async save") == 3


def test_a_save_that_fails_between_hooks_releases_the_directory(base):
    """A save that dies in torch's code after the coordinator took the lock
    (here the planner's finish_plan raises: write_data and finish never run)
    releases it without another call on its writer."""
    import fcntl
    import time

    from torch.distributed.checkpoint import DefaultSavePlanner

    class Failing(DefaultSavePlanner):
        def finish_plan(self, plan):
            raise RuntimeError("injected planner failure")

    path = base / "ckpt"
    save(path, 1)
    writer = cdcp.FileSystemWriter(path)  # stays referenced: not collected
    with pytest.raises(BaseException, match="injected planner failure"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(make_version(2), storage_writer=writer, planner=Failing(), no_dist=True)
    fd = os.open(path / LOCK, os.O_RDWR)
    try:
        deadline = time.monotonic() + 5
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "the failed save still holds the directory"
                time.sleep(0.05)
    finally:
        os.close(fd)
    assert writer._dir_lock is None or not writer._dir_lock.held
    assert check_directory_loads(path) == 1


# ---- what the cleanup deletes ----------------------------------------------------------


def test_cleanup_keeps_a_live_writers_temporary(base):
    """A temporary a live writer holds (its flock) survives the cleanup of
    a save into the same directory; a dead writer's is removed."""
    from ckptio.dcp import _commit

    path = base / "ckpt"
    save(path, 1)
    live_fd, live = _commit._create_temporary(str(path), "other.bin", str(path / "other.bin"))
    dead_fd, dead = _commit._create_temporary(str(path), ".metadata", str(path / ".metadata"))
    os.close(dead_fd)
    try:
        save(path, 2)
        assert os.path.exists(live) and not os.path.exists(dead)
    finally:
        os.close(live_fd)
    save(path, 3)
    assert not os.path.exists(live)
    assert check_directory(str(path), {3}, "after the live writer closed") == 3


def test_background_cleanup_keeps_what_the_current_metadata_references(base, monkeypatch):
    """cleanup="background" takes its list at commit and runs without the
    lock: before deleting it reads .metadata again, so files a later save
    committed under the same names (torch's writer reuses __0_0.distcp and
    takes no lock) survive."""
    import threading

    from ckptio.dcp import _commit

    path = base / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(make_version(1), storage_writer=dcp.FileSystemWriter(path), no_dist=True)  # __0_0.distcp
    gate = threading.Event()
    real_remove = _commit.remove_files

    def slow_remove(*args, **kwargs):
        gate.wait(30)
        return real_remove(*args, **kwargs)

    monkeypatch.setattr(_commit, "remove_files", slow_remove)
    writer = cdcp.FileSystemWriter(path, cleanup="background")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(make_version(2), storage_writer=writer, no_dist=True)
        dcp.save(make_version(3), storage_writer=dcp.FileSystemWriter(path), no_dist=True)  # torch, no lock
    gate.set()
    assert writer.wait_cleanup(timeout=30)
    assert "__0_0.distcp" in os.listdir(path)
    assert check_directory_loads(path) == 3
    assert version_of(load(str(path), dcp.FileSystemReader(str(path))), "torch reader") == 3


def test_cleanup_keeps_everything_a_metadata_file_might_reference(base):
    """A metadata file the cleanup cannot read (here a per-rank
    __7.metadata that is no pickle) might reference any data file: the
    cleanup keeps them all and says why."""
    path = base / "ckpt"
    save(path, 1)
    old = {n for n in os.listdir(path) if n.endswith(".distcp")}
    (path / "__7.metadata").write_bytes(b"not a pickle")
    import logging

    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("ckptio.dcp").addHandler(handler)
    try:
        save(path, 2)
    finally:
        logging.getLogger("ckptio.dcp").removeHandler(handler)
    assert old <= set(os.listdir(path))
    assert any("__7.metadata cannot be read" in r.getMessage() for r in records), records
    assert check_directory_loads(path) == 2


def test_overwrite_false_is_checked_again_under_the_lock(base):
    """overwrite=False: torch checks for .metadata before the lock; a save
    that committed while this one waited is not overwritten either."""
    import threading

    path = base / "ckpt"
    other = base / "other"
    save(other, 1)
    holder = Holder(path, "EX")
    errors = []

    def waiting_save():
        try:
            save(path, 2, overwrite=False)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=waiting_save)
    t.start()
    t.join(0.5)
    assert t.is_alive()
    for n in os.listdir(other):  # "another save" commits meanwhile
        if n != LOCK:
            shutil.copy(other / n, path / n)
    holder.release()
    t.join(30)
    assert errors and "Checkpoint already exists" in str(errors[0]), errors
    assert check_directory_loads(path) == 1


# ---- two ranks ---------------------------------------------------------------------

RANKS = r"""
import logging, os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
torch.set_num_threads(1)
import torch.distributed.checkpoint as dcp
import ckptio.dcp as cdcp
rank, path, store = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if rank == 0:
    handler = logging.StreamHandler(sys.stdout)
    logging.getLogger("ckptio.dcp").addHandler(handler)
    logging.getLogger("ckptio.dcp").setLevel(logging.INFO)
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)

def sd(v):
    return {"shared": torch.full((100,), float(v)), f"r{rank}": torch.full((1000,), float(10 * v + rank)), "step": v}

dcp.save(sd(2), storage_writer=cdcp.FileSystemWriter(path))
print("saved 2", flush=True)
sys.stdin.readline()
try:
    dcp.save(sd(3), storage_writer=cdcp.FileSystemWriter(path, dir_busy="error"))
    print("saved 3", flush=True)
except BaseException as e:
    print("busy" if "another save holds the directory" in str(e) else "other " + " ".join(str(e).split()), flush=True)
dist.barrier()
dist.destroy_process_group()
print("OK", flush=True)
os._exit(0)
"""


def test_ranks_write_nothing_before_the_coordinator_holds_the_directory(base, tmp_path):
    """Two gloo ranks: the coordinator takes the lock in prepare_global_plan,
    before torch scatters the plans, so while another process holds the
    directory no rank writes a data file; then the save completes. With
    dir_busy="error" every rank fails with the busy error."""
    import queue
    import threading

    def ranks_sd(v):
        return {"shared": torch.full((100,), float(v)), "r0": torch.full((1000,), float(10 * v)),
                "r1": torch.full((1000,), float(10 * v + 1)), "step": v}

    path = base / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(ranks_sd(1), storage_writer=cdcp.FileSystemWriter(path), no_dist=True)

    def loaded():
        out = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None) for k, v in ranks_sd(0).items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(out, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
        v = out["step"]
        assert all(torch.equal(out[k], ranks_sd(v)[k]) for k in out if k != "step"), out
        return v

    before = sorted(os.listdir(path))
    holder = Holder(path, "EX")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", RANKS, str(r), str(path), str(tmp_path / "store")], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    lines = [queue.Queue(), queue.Queue()]
    for p, q in zip(procs, lines):
        threading.Thread(target=lambda p=p, q=q: [q.put(line.strip()) for line in p.stdout], daemon=True).start()

    def expect(r, predicate, what):
        seen = []
        while True:
            try:
                line = lines[r].get(timeout=60)
            except queue.Empty:
                raise AssertionError(f"rank {r}: no {what}; output {seen}") from None
            seen.append(line)
            if predicate(line):
                return line

    try:
        expect(0, lambda s: "waiting for another save of the directory" in s, "wait for the lock")
        import time

        time.sleep(0.5)  # rank 1 waits in torch's scatter of the plans meanwhile
        assert sorted(os.listdir(path)) == before, "a rank wrote while another process held the directory"
        holder.release()
        for r in range(2):
            expect(r, lambda s: s == "saved 2", "save after the holder released")
        assert loaded() == 2
        saved = sorted(os.listdir(path))
        holder = Holder(path, "EX")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for r in range(2):
            assert expect(r, lambda s: s in ("busy", "saved 3") or s.startswith("other"), "result") == "busy"
        assert sorted(os.listdir(path)) == saved
    finally:
        holder.release() if holder.proc.poll() is None else None
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
    for r, p in enumerate(procs):
        assert p.wait(timeout=60) == 0
        expect(r, lambda s: s == "OK", "clean exit")
    assert loaded() == 2


def test_a_save_threads_dcp_code_is_seen_from_another_thread():
    """The lock's watcher asks whether a save's thread still runs DCP code:
    true while a frame of ckptio.dcp (or torch.distributed.checkpoint) is on
    its stack, under deeper frames of other code too; false for a thread
    outside it and once the thread has ended. Asked many times while the
    threads call and return, the answer never crashes the interpreter."""
    import threading

    from ckptio.dcp import _lock, _staging

    # A function whose frame counts as ckptio.dcp code: its file and its module's name are those of one of the
    # package's DCP modules.
    ns = {"__name__": _staging.__name__}
    exec(compile("def in_dcp(fn, *a):\n    return fn(*a)\n", _staging.__file__, "exec"), ns)
    stop = threading.Event()

    def deep(n):
        return deep(n - 1) if n else stop.wait()

    inside = threading.Thread(target=ns["in_dcp"], args=(deep, 30))
    outside = threading.Thread(target=deep, args=(30,))

    def churn():  # threads that call and return all the time while the stacks are read
        while not stop.is_set():
            ns["in_dcp"](lambda: sum(range(100)))

    churners = [threading.Thread(target=churn) for _ in range(2)]
    for t in [inside, outside, *churners]:
        t.start()
    try:
        for _ in range(300):
            assert _lock.in_dcp_code(inside)
            assert not _lock.in_dcp_code(outside)
    finally:
        stop.set()
        for t in [inside, outside, *churners]:
            t.join()
    assert not _lock.in_dcp_code(inside)
    assert not _lock.in_dcp_code(None)
