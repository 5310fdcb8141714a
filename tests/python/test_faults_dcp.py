"""Fault injection over the commit sequence of ckptio.dcp.FileSystemWriter.

What tests/test_faults.c proves for single files, for DCP directories. A
directory holds version 1 of a checkpoint (saved by ckptio.dcp); a second
save writes version 2 while the n-th call of one native step fails, for
every step the save makes and n = 1, 2, ... up to the number of calls a
fault-free save makes (counted by a dry run, which is the "no fault fires"
case). The steps are the libckptio calls the writer makes, through a proxy
in place of ``_ckptio`` in ckptio.dcp's _writer, _data_files, _commit and _lock:

- the data path: File(...) open, dcp_write, commit_unreferenced (the data
  files' commit: renamed, then fsynced with the directory at once),
  File.commit (SAFETENSORS: the byte items' file), safetensors_save,
  SafetensorsReader;
- the directory commit (src/ckpt/dcp_*.c): dcp_lock_acquire,
  dcp_create_file (the data files' placeholders), then the steps of
  ckptio_dcp_commit, through its step callback: the manifest
  (dcp_manifest_write), .metadata (dcp_write_file), the list of stale files
  (dcp_stale_files) and their removal (dcp_remove_files);

faults ENOSPC and EIO raised before the call (as a failed write, fsync or
rename does: nothing is committed), and EIO after a call that did commit
(as a failed directory fsync after the rename does). The system calls
inside the commit steps (every open, write, fsync, rename, unlink, listing
and read, failing with ENOSPC/EIO, and short writes) are swept by
tests/test_dcp_commit.c through libckptio's fault injection.

After every run:
- a failing save raised CheckpointException carrying the error, which names
  the operation and the file or directory and the errno's text;
- .metadata is version 1's, or version 2's when the fault fired after the
  atomic replace of .metadata (or the save succeeded); it loads with
  ckptio.dcp.FileSystemReader and (TORCH_SAVE) torch's stock
  FileSystemReader to exactly that version, and ckptio.dcp.verify passes;
- besides what .metadata references and its manifest, the directory holds
  only files the next save removes (data files, a SAFETENSORS file's
  block-hash manifest and manifests of version 1's save or of the failed
  save: what the cleanup lists as stale); no temporary is left;
- a fault-free save of version 2 then succeeds, loads, verifies and leaves
  exactly its own files.
Then version 1's directory is restored for the next run.

One case runs on two gloo ranks (faults on the coordinator, which commits,
and on the other rank's data writes). The directory is on /dev/shm when
possible, so that the many fsyncs cost nothing.
"""
import errno
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from ckptio import _ckptio, _errors  # noqa: E402
from ckptio.dcp import _commit, _data_files, _lock, _writer  # noqa: E402
from conftest import CKPTIO_CLI, requires_cli  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

DATA_OPS = ("File", "dcp_write", "commit_unreferenced", "File.commit", "safetensors_save", "SafetensorsReader")
COMMIT_OPS = ("dcp_lock_acquire", "dcp_create_file", "dcp_manifest_write", "dcp_write_file", "dcp_stale_files",
              "dcp_remove_files")
NATIVE_OPS = DATA_OPS + COMMIT_OPS
# The steps of libckptio's commit (ckptio_dcp_commit, one call: faults go in
# through its step callback), by the name of what each does.
COMMIT_STEPS = {_ckptio.DCP_STEP_MANIFEST: "dcp_manifest_write", _ckptio.DCP_STEP_METADATA: "dcp_write_file",
                _ckptio.DCP_STEP_LIST: "dcp_stale_files", _ckptio.DCP_STEP_REMOVE: "dcp_remove_files"}
# Steps that commit something: a fault after them is a failure found after
# the rename (the directory fsync).
AFTER_OPS = ("commit_unreferenced", "File.commit", "safetensors_save", "dcp_manifest_write", "dcp_write_file", "dcp_remove_files")

LOCK = ".ckptio-dcp.lock"  # the directory's lock file (src/ckpt/dcp_lock.c): empty, kept
DATA_RE = re.compile(r"^__\d+_([0-9a-f]{12})_\d+\.distcp(\.ckptio-manifest\.json)?$")
MANIFEST_RE = re.compile(r"^\.ckptio-manifest-([0-9a-f]{12})\.json$")


def kinds_of(op):
    kinds = ["ENOSPC", "EIO"]
    if op in AFTER_OPS:
        kinds.append("EIO-after")
    return kinds


def make_version(v, rank=None):
    """Version v of the state dict; with `rank`, that rank's view (shared
    entries plus its own), else every entry (what a load asks for)."""
    g = torch.Generator().manual_seed(100 + v)
    sd = {"w": torch.randn(3000, generator=g), "i": torch.arange(40, dtype=torch.int64) * v,
          "nested": {"m": torch.randn(4, 5, generator=g).to(torch.bfloat16)}, "step": v}
    for r in range(2):
        t = torch.full((257,), float(10 * v + r))
        if rank is None or rank == r:
            sd[f"rank{r}"] = t
    return sd


def blank_like(sd):
    return {k: blank_like(v) if isinstance(v, dict) else
            torch.full_like(v, -1) if isinstance(v, torch.Tensor) else None for k, v in sd.items()}


def which_version(got, versions, what):
    for v, want in versions.items():
        if got["step"] == v:
            def same(a, b):
                if isinstance(b, dict):
                    return all(same(a[k], b[k]) for k in b)
                return torch.equal(a, b) if isinstance(b, torch.Tensor) else a == b
            bad = [k for k in want if not same(got[k], want[k])]
            assert not bad, f"{what}: step says version {v} but {bad} differ from it"
            return v
    raise AssertionError(f"{what}: step {got['step']!r} is neither version")


# ---- the injection ----------------------------------------------------------------


class Faults:
    """Counts calls per operation; the armed (op, n, kind) fires on the n-th."""

    def __init__(self):
        self.arm(None, 0, None)

    def arm(self, op, n, kind):
        self.armed = (op, n, kind)
        self.counts = {}
        self.fired = None
        self.metadata_replaced = False

    def hit(self, op, path=None):
        c = self.counts[op] = self.counts.get(op, 0) + 1
        if self.armed[0] == op and self.armed[1] == c:
            self.fired = {"op": op, "kind": self.armed[2], "n": c, "path": path,
                          "after_commit": self.metadata_replaced}
            return self.armed[2]
        return None


def _native_error(kind, op, path):
    err = errno.EIO if kind.startswith("EIO") else errno.ENOSPC
    name = "E_IO" if err == errno.EIO else "E_NOSPC"
    return _errors.make_error(getattr(_ckptio, name), name, err, 0, op, path, -1, None,
                              f"{path}: {op}: {os.strerror(err)} (injected by test_faults_dcp)")


class _File:
    """A ckptio File whose commit can fail; dcp_write gets the real one."""

    def __init__(self, native, path, real):
        self._n, self.path, self.real = native, path, real

    def commit(self):
        return self._n._call("File.commit", self.path, self.real.commit)

    def __getattr__(self, name):
        return getattr(self.real, name)


class _Native:
    """Stands in for _ckptio in ckptio.dcp's _writer, _data_files, _commit and _lock."""

    def __init__(self, faults):
        self._f = faults

    def __getattr__(self, name):
        return getattr(_ckptio, name)

    def _call(self, op, path, fn, *args, **kwargs):
        kind = self._f.hit(op, path)
        if kind in ("ENOSPC", "EIO"):
            raise _native_error(kind, op, path)
        out = fn(*args, **kwargs)
        if op == "dcp_write_file" and os.path.basename(path) == ".metadata":
            self._f.metadata_replaced = True
        if kind == "EIO-after":
            raise _native_error(kind, op, path)
        return out

    def File(self, path, *args, **kwargs):
        return _File(self, path, self._call("File", path, _ckptio.File, path, *args, **kwargs))

    def dcp_write(self, payloads, *args, **kwargs):
        path = payloads[0][0].path if payloads else None
        real = [(p[0].real if isinstance(p[0], _File) else p[0],) + tuple(p[1:]) for p in payloads]
        return self._call("dcp_write", path, _ckptio.dcp_write, real, *args, **kwargs)

    def commit_unreferenced(self, files, *args, **kwargs):
        path = files[0].path if files else None
        real = [f.real if isinstance(f, _File) else f for f in files]
        return self._call("commit_unreferenced", path, _ckptio.commit_unreferenced, real, *args, **kwargs)

    def safetensors_save(self, path, *args, **kwargs):
        return self._call("safetensors_save", path, _ckptio.safetensors_save, path, *args, **kwargs)

    def SafetensorsReader(self, path, *args, **kwargs):
        return self._call("SafetensorsReader", path, _ckptio.SafetensorsReader, path, *args, **kwargs)

    # The directory commit: `path` is the file the step writes, else the directory.
    def dcp_lock_acquire(self, dirpath, *args):
        return self._call("dcp_lock_acquire", os.fspath(dirpath), _ckptio.dcp_lock_acquire, dirpath, *args)

    def dcp_create_file(self, dirpath, name, *args):
        return self._call("dcp_create_file", os.path.join(dirpath, name), _ckptio.dcp_create_file, dirpath, name,
                          *args)

    def dcp_commit(self, dirpath, metadata_name, metadata, files, items, sync, cleanup, on_step=None, data_files=None,
                   engine=None):
        """The commit is one libckptio call: its steps fail through the step
        callback, before the step or after it (the step done)."""
        pending = {}

        def step(n, path, done):
            op = COMMIT_STEPS[n]
            if not done:
                kind = pending[n] = self._f.hit(op, path)
                if kind in ("ENOSPC", "EIO"):
                    raise _native_error(kind, op, path)
            else:
                if n == _ckptio.DCP_STEP_METADATA and os.path.basename(path) == ".metadata":
                    self._f.metadata_replaced = True
                if pending.get(n) == "EIO-after":
                    raise _native_error("EIO-after", op, path)
            if on_step is not None:
                on_step(n, path, done)

        real = None if data_files is None else [f.real if isinstance(f, _File) else f for f in data_files]
        return _ckptio.dcp_commit(dirpath, metadata_name, metadata, files, items, sync, cleanup, step, real, engine)


class injected:
    """Context manager installing the proxy around `faults`."""

    def __init__(self, faults):
        self.faults = faults

    def __enter__(self):
        self.saved = (_writer._ckptio, _data_files._ckptio, _commit._ckptio, _lock._ckptio)
        native = _Native(self.faults)
        _writer._ckptio = _data_files._ckptio = _commit._ckptio = _lock._ckptio = native
        return self.faults

    def __exit__(self, *exc):
        _writer._ckptio, _data_files._ckptio, _commit._ckptio, _lock._ckptio = self.saved
        return False


# ---- saving and checking ------------------------------------------------------------


def save(sd, path, fmt, threads=1, no_dist=True):
    writer = cdcp.FileSystemWriter(path, serialization_format=fmt, thread_count=threads, sync_files=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=no_dist)


def load(path, reader):
    out = blank_like(make_version(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def token_of_dir(path):
    with open(os.path.join(path, ".metadata"), "rb") as f:
        md = pickle.load(f)
    files = {info.relative_path for info in md.storage_data.values()}
    tokens = {m.group(1) for m in map(DATA_RE.match, files) if m}
    assert len(tokens) == 1 and all(map(DATA_RE.match, files)), \
        f"{path}: .metadata references {sorted(files)}, not one ckptio save"
    return files, tokens.pop(), len(md.storage_data)


def check_directory(path, fmt, versions, old_token, what):
    """The invariants after a save, failed or not; returns the version."""
    names = set(os.listdir(path))
    files, token, nitems = token_of_dir(path)
    manifest = f".ckptio-manifest-{token}.json"
    missing = (files | {manifest}) - names
    assert not missing, f"{what}: missing {sorted(missing)}; directory {sorted(names)}"
    v = which_version(load(path, cdcp.FileSystemReader(path)), versions, f"{what} (ckptio reader)")
    if fmt == SerializationFormat.TORCH_SAVE:  # torch's reader cannot read SAFETENSORS data files
        v2 = which_version(load(path, dcp.FileSystemReader(path)), versions, f"{what} (torch reader)")
        assert v2 == v, f"{what}: ckptio's reader loads version {v}, torch's {v2}"
    report = cdcp.verify(path)
    assert report["checked"] == report["items"] == nitems, f"{what}: verify {report}"
    # Leftovers: only what the next save removes, from version 1's save or
    # from the failed one; never a temporary.
    leftovers = names - files - {".metadata", manifest, LOCK}
    stale = set(_commit.stale_files(path, files | {".metadata", manifest}))
    tokens = {token}
    for n in sorted(leftovers):
        m = DATA_RE.match(n) or MANIFEST_RE.match(n)
        assert m, f"{what}: {n!r} is neither referenced nor a file the next save removes; {sorted(names)}"
        assert n in stale, f"{what}: the next save would not remove {n!r}"
        tokens.add(m.group(1))
    assert len(tokens - {old_token}) <= 1, f"{what}: files of more than two saves: {sorted(names)}"
    return v


def check_error(exc, fired, path, rank, what):
    """The error of a failed save names the operation, the file and the errno."""
    assert isinstance(exc, CheckpointException), f"{what}: {type(exc).__name__}: {exc}"
    assert rank in exc.failures, f"{what}: failures of ranks {list(exc.failures)}"
    orig = exc.failures[rank][0]
    kind, op = fired["kind"], fired["op"]
    err = errno.EIO if kind.startswith("EIO") else errno.ENOSPC
    text = str(orig)
    assert isinstance(orig, OSError), f"{what}: {type(orig).__name__}: {text}"
    assert text in str(exc), f"{what}: the exception does not show the error: {exc}"
    # "PATH: OPERATION: STRERROR (what it was doing, what it leaves)". Across
    # ranks the error arrives pickled, as a plain message (see test notes).
    m = re.match(r"^(/[^:]*): ([\w.]+): ([^(]*) \((.*)\)$", text, re.S)
    assert m and m.group(3) == os.strerror(err), f"{what}: {text!r}"
    where, operation, why = m.group(1), m.group(2), m.group(4)
    if orig.errno is not None:  # not pickled: the attributes say the same
        assert isinstance(orig, ckptio.CkptioError) and orig.errno == err, f"{what}: {type(orig)} {orig.errno}"
        assert (orig.path, orig.operation) == (where, operation), f"{what}: {orig.path} {orig.operation}"
    assert (where, operation, why) == (fired["path"], op, "injected by test_faults_dcp"), f"{what}: {text!r}"
    assert where == path or os.path.dirname(where) == path, f"{what}: names {where!r}"


def _shm_dir(tmp_path):
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path(tempfile.mkdtemp(prefix="ckptio-faults-dcp-", dir="/dev/shm"))
    return Path(tempfile.mkdtemp(dir=tmp_path))


class Sweep:
    """One sweep: directory, format, rank layout; run(op, n, kind) does one
    faulted save and every check. In a two-rank job every rank makes the
    same calls in the same order; only rank 0 checks the directory."""

    def __init__(self, base, fmt, threads=1, rank=0, world=1, barrier=None):
        self.fmt, self.threads, self.rank, self.world = fmt, threads, rank, world
        self.barrier = barrier or (lambda: None)
        self.versions = {1: make_version(1), 2: make_version(2)}
        self.path = os.path.join(base, "ckpt")
        self.pristine = os.path.join(base, "pristine")
        save(self.sd(1), self.pristine, fmt, threads, no_dist=world == 1)
        self.barrier()
        self.old_token = token_of_dir(self.pristine)[1] if rank == 0 else None
        self.faults = Faults()
        self.runs = {"failed": 0, "succeeded": 0}

    def sd(self, v):
        return make_version(v, self.rank if self.world > 1 else None)

    def restore(self):
        if self.rank == 0:
            shutil.rmtree(self.path, ignore_errors=True)
            shutil.copytree(self.pristine, self.path)
        self.barrier()

    def run(self, op, n, kind, fault_rank=0):
        """One faulted save of version 2 over version 1; returns the counts
        of this rank's calls (with op=None: a dry run)."""
        self.restore()
        what = f"{self.fmt.name} threads={self.threads} rank {fault_rank}: {kind} at call {n} of {op}"
        mine = op is not None and self.rank == fault_rank
        self.faults.arm(op if mine else None, n, kind)
        error = None
        with injected(self.faults):
            try:
                save(self.sd(2), self.path, self.fmt, self.threads, no_dist=self.world == 1)
            except CheckpointException as e:
                error = e
        fired = self.faults.fired
        counts = dict(self.faults.counts)
        if mine:
            assert fired, f"{what}: the fault did not fire (calls: {counts})"
            assert error is not None, f"{what}: the save did not fail"
            check_error(error, fired, self.path, self.rank, what)
        if self.rank == 0:
            self.runs["failed" if error else "succeeded"] += 1
            v = check_directory(self.path, self.fmt, self.versions, self.old_token, what)
            after = error is None or self.faults.metadata_replaced
            assert v == (2 if after else 1), f"{what}: version {v} after {'success' if error is None else error}"
        self.barrier()
        if op is None:  # the dry run
            return counts
        # The next fault-free save succeeds and leaves exactly its own files.
        save(self.sd(2), self.path, self.fmt, self.threads, no_dist=self.world == 1)
        if self.rank == 0:
            assert check_directory(self.path, self.fmt, self.versions, self.old_token, f"{what}, then a clean save") == 2
            files, token, _ = token_of_dir(self.path)
            assert sorted(os.listdir(self.path)) == sorted(files | {".metadata", f".ckptio-manifest-{token}.json",
                                                                    LOCK}), \
                f"{what}, then a clean save: {sorted(os.listdir(self.path))}"
        self.barrier()
        return counts

    def sweep(self, plan):
        """plan: [(fault_rank, op, kinds)]. The dry run counts the calls of
        each op on each rank; every call of every op then fails once."""
        dry = self.run(None, 0, None)
        counts = [dry] if self.world == 1 else self.gather(dry)
        total = 0
        for fault_rank, op, kinds in plan:
            calls = counts[fault_rank].get(op, 0)
            for kind in kinds:
                for n in range(1, calls + 1):
                    self.run(op, n, kind, fault_rank)
                    total += 1
        return counts, total

    def gather(self, obj):
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


@pytest.fixture
def base(tmp_path):
    d = _shm_dir(tmp_path)
    yield str(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("fmt,threads", [(SerializationFormat.TORCH_SAVE, 1), (SerializationFormat.TORCH_SAVE, 2),
                                         (SerializationFormat.SAFETENSORS, 1)])
def test_every_commit_call_fails_once(base, fmt, threads):
    s = Sweep(base, fmt, threads)
    plan = [(0, op, kinds_of(op)) for op in NATIVE_OPS]
    counts, total = s.sweep(plan)
    calls = counts[0]
    # The sweep covered the whole commit sequence (lock, placeholders of the
    # data files over version 1, manifest, .metadata, the list and removal
    # of version 1's files) and every native step of the data path.
    assert [calls.get(op) for op in ("dcp_lock_acquire", "dcp_manifest_write", "dcp_write_file", "dcp_stale_files",
                                     "dcp_remove_files")] == [1, 1, 1, 1, 1], calls
    if fmt == SerializationFormat.TORCH_SAVE:
        assert calls["File"] == calls["dcp_create_file"] == threads, calls
        # The data files are renamed by commit_unreferenced; the process that commits leaves their fsyncs
        # to dcp_commit, with .metadata's (tests/test_dcp_commit.c sweeps the system calls of that).
        assert calls["dcp_write"] == calls["commit_unreferenced"] == 1 and "File.commit" not in calls, calls
    else:
        assert calls["safetensors_save"] >= 1 and calls["SafetensorsReader"] == calls["safetensors_save"], calls
        assert calls["File"] == calls["File.commit"] == calls["dcp_write"] == 1, calls  # the byte items' file
        assert calls["dcp_create_file"] == calls["safetensors_save"] + 1, calls
    # Every fault failed the save (the dry run succeeded).
    assert s.runs == {"failed": total, "succeeded": 1}, (s.runs, total)


@requires_cli
def test_cli_clean_knows_dcp_temporaries(tmp_path):
    """The commit's temporaries are named and locked as libckptio's are:
    `ckptio clean` removes one a dead save left and keeps one a live save
    holds (its flock), in the same directory."""
    dead_fd, dead = _commit._create_temporary(str(tmp_path), ".metadata", str(tmp_path / ".metadata"))
    os.write(dead_fd, b"x" * 100)
    os.close(dead_fd)  # the lock goes with the descriptor, as when a save is killed
    live_fd, live = _commit._create_temporary(str(tmp_path), ".ckptio-manifest-0123456789ab.json", "m")
    try:
        assert re.fullmatch(r"\.\.metadata\.ckptio-tmp-[A-Za-z0-9]{6}", os.path.basename(dead)), dead
        out = subprocess.run([CKPTIO_CLI, "clean", str(tmp_path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert re.search(r"removed 1 stale temporar", out.stdout), out.stdout
        assert not os.path.exists(dead) and os.path.exists(live), out.stdout
    finally:
        os.close(live_fd)
    out = subprocess.run([CKPTIO_CLI, "clean", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0 and re.search(r"removed 1 stale temporar", out.stdout), out.stdout + out.stderr
    assert os.listdir(tmp_path) == []


# ---- two gloo ranks -----------------------------------------------------------------

RANKS = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[4])
    import test_faults_dcp as t
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    rank, base, store = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    s = t.Sweep(base, SerializationFormat.TORCH_SAVE, rank=rank, world=2, barrier=dist.barrier)
    # The coordinator commits: every step of it fails; rank 1 writes its own
    # data files: every native step of it fails.
    plan = [(0, op, ["ENOSPC"]) for op in t.NATIVE_OPS]
    plan += [(1, op, ["EIO"]) for op in t.DATA_OPS + ("dcp_create_file",)]
    counts, total = s.sweep(plan)
    dist.barrier()
    dist.destroy_process_group()
    print("OK", rank, total, counts[1], s.runs if rank == 0 else "", flush=True)
    os._exit(0)  # torch's gloo may abort in interpreter teardown after a clean run
    """
)


def test_two_ranks_commit_faults(base, tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    root = str(Path(ckptio.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    here = str(Path(__file__).resolve().parent)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), base, str(tmp_path / "store"), here], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {r}" in out, f"rank {r}:\n{out[-4000:]}"
    # Every commit step of the coordinator (9 calls) and rank 1's native
    # steps (a placeholder and a data file written and committed) were swept.
    last = outs[1].strip().splitlines()[-1].split(" ", 3)
    assert int(last[2]) == 13 and "'commit_unreferenced': 1" in last[3] and "'dcp_create_file': 1" in last[3], \
        outs[1][-2000:]


# ---- cleanup="background" ----------------------------------------------------------------


def test_background_cleanup_removes_the_old_files_off_the_critical_path(tmp_path, monkeypatch):
    """The old checkpoint's files are removed by a thread of the writer; the
    list is taken at commit, so a later save's files are never touched; a
    failed removal is logged and raised by wait_cleanup(), and the next save
    removes what is left."""
    import threading

    from ckptio.dcp import _commit

    path = tmp_path / "bg"
    writer = cdcp.FileSystemWriter(path, cleanup="background")
    dcp.save({"w": torch.ones(1000)}, storage_writer=writer, no_dist=True)
    first = set(os.listdir(path)) - {LOCK}
    gate = threading.Event()
    real_remove = _commit.remove_files

    def slow_remove(dirpath, names, sync, *args, **kwargs):
        gate.wait(30)
        return real_remove(dirpath, names, sync, *args, **kwargs)

    monkeypatch.setattr(_commit, "remove_files", slow_remove)
    dcp.save({"w": torch.full((1000,), 2.0)}, storage_writer=writer, no_dist=True)
    # save() returned with the old data files still there (the thread waits on the gate) ...
    assert first - {".metadata"} <= set(os.listdir(path))
    assert writer.wait_cleanup(timeout=0.05) is False
    gate.set()
    assert writer.wait_cleanup(timeout=30) is True
    # ... and now only the new checkpoint is left; it loads and verifies.
    after = set(os.listdir(path))
    assert not (after & (first - {".metadata"})), after
    assert cdcp.verify(path)["checked"] >= 1
    out = {"w": torch.zeros(1000)}
    dcp.load(out, storage_reader=cdcp.FileSystemReader(path), no_dist=True)
    assert torch.equal(out["w"], torch.full((1000,), 2.0))

    # A failing removal: logged, raised by wait_cleanup(), cleaned by the next
    # save. What fails is real: a stale data file made immutable (chattr +i),
    # which not even root may unlink (EPERM). (A directory under a data file's
    # name is not a failure: the cleanup leaves what is not a regular file.)
    monkeypatch.setattr(_commit, "remove_files", real_remove)
    blocker = path / "__0_aaaaaaaaaaaa_0.distcp"
    blocker.write_bytes(b"x")
    if subprocess.run(["chattr", "+i", str(blocker)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a file system with the immutable flag)")

    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("ckptio.dcp").addHandler(handler)
    try:
        dcp.save({"w": torch.full((1000,), 3.0)}, storage_writer=writer, no_dist=True)
        with pytest.raises(ckptio.CkptioError) as e:
            writer.wait_cleanup(timeout=30)
    finally:
        logging.getLogger("ckptio.dcp").removeHandler(handler)
        subprocess.run(["chattr", "-i", str(blocker)], capture_output=True)
    assert e.value.operation == "unlink" and e.value.errno == errno.EPERM, e.value
    assert e.value.path == str(blocker) and "the new checkpoint is committed" in str(e.value)
    assert any("unlink" in r.getMessage() and "committed" in r.getMessage() for r in records)
    assert blocker.exists()
    dcp.save({"w": torch.full((1000,), 4.0)}, storage_writer=writer, no_dist=True)
    assert writer.wait_cleanup(timeout=30) is True
    files = sorted(os.listdir(path))
    with open(os.path.join(path, glob_one(path, ".ckptio-manifest-*.json"))) as f:
        referenced = set(json.load(f)["files"])
    assert {n for n in files if n.endswith(".distcp")} == referenced, files
    with pytest.raises(ValueError, match="cleanup"):
        cdcp.FileSystemWriter(path, cleanup="later")


def glob_one(path, pattern):
    import glob

    (name,) = glob.glob(os.path.join(path, pattern))
    return os.path.basename(name)
