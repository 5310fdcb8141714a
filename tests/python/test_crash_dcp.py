"""kill -9 while ckptio.dcp.FileSystemWriter overwrites a checkpoint directory.

A directory holds version A of a DCP checkpoint. A child process overwrites
it in a loop (version B, A, B, ...; overwrite=True) and is killed with
SIGKILL at a random moment. After every kill:

- the directory loads with ckptio.dcp.FileSystemReader and (TORCH_SAVE) with
  torch's stock FileSystemReader, and every tensor and the byte item equal
  version A or version B, all from the same version;
- ckptio.dcp.verify passes (the manifest matches .metadata and the bytes);
- every name in the directory is one a DCP save makes (so the next save can
  recognise and remove it), and every file .metadata references exists.

The loop asserts that kills really landed mid-save (unreferenced data files,
manifests or temporaries seen) and that the checkpoint version changed under
it; a final clean save leaves only .metadata, its manifest and its data files.

Importing torch takes seconds here, so the children are forked from one
"zygote" process (started with sys.executable -c) that imported torch and
ckptio once; each child starts from a fresh fork, builds its own writer and
engine, prints "ready" and saves until it is killed.
"""
import os
import pickle
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat  # noqa: E402

import ckptio.dcp as cdcp  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

NTENSORS = 3
NUMEL = 1 << 18  # 1 MiB of float32 per tensor


def make_version(v: int):
    """Version v of the state dict: NTENSORS random tensors and a byte item."""
    g = torch.Generator().manual_seed(1000 + v)
    sd = {f"t{i}": torch.randn(NUMEL, generator=g) for i in range(NTENSORS)}
    sd["step"] = v
    return sd


# The zygote: imports once, then on "fork SYNC" forks a child that saves B, A,
# B, ... into the directory until killed, printing "saved V" after each save;
# on "reap PID" waits for it and reports its wait status. The child never
# returns into the zygote's loop.
ZYGOTE = r"""
import os, sys, traceback, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)  # no OpenMP pool to break across fork()
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import SerializationFormat
import ckptio.dcp as cdcp
sys.path.insert(0, sys.argv[3])
from test_crash_dcp import make_version
path, fmt = sys.argv[1], SerializationFormat[sys.argv[2]]
versions = [make_version(1), make_version(2)]

def child(sync):
    try:
        out = os.fdopen(1, "w", closefd=False)
        out.write(f"ready {os.getpid()}\n")
        out.flush()
        n = 1
        while True:
            w = cdcp.FileSystemWriter(path, overwrite=True, sync_files=sync, serialization_format=fmt)
            dcp.save(versions[n % 2], storage_writer=w, no_dist=True)
            out.write(f"saved {versions[n % 2]['step']}\n")
            out.flush()
            n += 1
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(3)

print("zygote", flush=True)
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == "fork":
        pid = os.fork()
        if pid == 0:
            child(arg == "1")
    elif cmd == "reap":
        _, status = os.waitpid(int(arg), 0)
        print(f"reaped {status}", flush=True)
"""

DATA_RE = re.compile(r"^__0_([0-9a-f]{12})_\d+\.distcp$")
MANIFEST_RE = re.compile(r"^\.ckptio-manifest-([0-9a-f]{12})\.json$")
# The block hashes a SAFETENSORS data file's save leaves for the writer to read
# (removed by it; a kill can leave one, which the next save removes).
BLOB_MANIFEST_RE = re.compile(r"^__0_[0-9a-f]{12}_\d+\.distcp\.ckptio-manifest\.json$")
TEMP_RE = re.compile(r"^\..+\.ckptio-tmp-[0-9A-Za-z]+$")


def _env():
    # The zygote must import the same package the tests use (installed, or
    # built in place under python/, which conftest puts on sys.path).
    import ckptio

    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(ckptio.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _save(sd, writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=True)


def _load(reader):
    out = {f"t{i}": torch.full((NUMEL,), float("nan")) for i in range(NTENSORS)}
    out["step"] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def _which_version(got, versions, what):
    """1 or 2 when every entry of `got` equals that version exactly."""
    for v, want in versions.items():
        if got["step"] == v:
            bad = [k for k in want if k != "step" and not torch.equal(got[k], want[k])]
            assert not bad, f"{what}: step says version {v} but {bad} differ from it (a mix of versions)"
            return v
    raise AssertionError(f"{what}: step {got['step']!r} is neither version")


def _referenced(path: Path):
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    return {info.relative_path for info in md.storage_data.values()}


def _check_directory(path: Path, fmt, versions, what):
    """Asserts the invariants; returns (version, unreferenced names)."""
    names = set(os.listdir(path))
    assert ".metadata" in names, f"{what}: no .metadata in {sorted(names)}"
    files = _referenced(path)
    missing = files - names
    assert not missing, f"{what}: .metadata references missing {sorted(missing)}; directory {sorted(names)}"
    tokens = {DATA_RE.match(n).group(1) for n in files if DATA_RE.match(n)}
    assert len(tokens) == 1 and all(DATA_RE.match(n) for n in files), f"{what}: referenced {sorted(files)}"
    token = tokens.pop()
    manifest = f".ckptio-manifest-{token}.json"
    assert manifest in names, f"{what}: no manifest for token {token}; directory {sorted(names)}"
    strange = [n for n in names if n not in (".metadata", ".ckptio-dcp.lock") and not (DATA_RE.match(n) or MANIFEST_RE.match(n)
                                                               or TEMP_RE.match(n) or BLOB_MANIFEST_RE.match(n))]
    assert not strange, f"{what}: names no DCP save makes: {strange}; directory {sorted(names)}"

    v = _which_version(_load(cdcp.FileSystemReader(path)), versions, f"{what} (ckptio reader)")
    if fmt == SerializationFormat.TORCH_SAVE:  # torch's reader cannot read SAFETENSORS data files
        v2 = _which_version(_load(dcp.FileSystemReader(path)), versions, f"{what} (torch reader)")
        assert v2 == v, f"{what}: ckptio reader loads version {v}, torch's reader {v2}"
    report = cdcp.verify(path)
    assert report["checked"] == report["items"] == NTENSORS + 1, f"{what}: verify {report}"
    return v, sorted(names - files - {".metadata", manifest, ".ckptio-dcp.lock"})


class _Zygote:
    def __init__(self, path: Path, fmt, log: Path):
        self.log_path = log
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, str(path), fmt.name, str(Path(__file__).resolve().parent)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=_env())
        # A reader thread, so that waiting for a line can time out.
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.expect("zygote", timeout=120)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def expect(self, *words, timeout=60.0):
        """The next line starting with one of `words` (others are skipped); its other fields."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic())).split()
            except queue.Empty:
                line = None
            if not line or line[0] not in ("saved", *words):
                self.log.flush()
                raise AssertionError(f"zygote: expected {words}, got {line!r}; stderr:\n"
                                     f"{self.log_path.read_text()[-4000:]}")
            if line[0] in words:
                return line[1:]

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def run_and_kill(self, sync: bool, delay: float, after_saved=None) -> int:
        """Forks a saver and kills it `delay` s after it is ready (or, with
        after_saved=V, after it committed version V); returns its wait status."""
        self.send(f"fork {int(sync)}")
        pid = int(self.expect("ready")[0])
        while after_saved is not None and int(self.expect("saved")[0]) != after_saved:
            pass
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        self.send(f"reap {pid}")
        return int(self.expect("reaped")[0])

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


@pytest.mark.parametrize("fmt,iterations", [(SerializationFormat.TORCH_SAVE, 36),
                                            (SerializationFormat.SAFETENSORS, 24)])
def test_kill_loop_keeps_a_whole_checkpoint(tmp_path, fmt, iterations):
    path = tmp_path / "ckpt"
    versions = {1: make_version(1), 2: make_version(2)}
    _save(versions[1], cdcp.FileSystemWriter(path, serialization_format=fmt))  # version A, written once
    assert _check_directory(path, fmt, versions, "initial save") == (1, [])

    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    zygote = _Zygote(path, fmt, tmp_path / "zygote.log")
    seen_versions, mid_save, changes, forced, history = [1], 0, 0, 0, []
    kinds = {"temporary": 0, "data file": 0, "manifest": 0}  # new leftovers, by kind
    before = set()
    start = time.monotonic()
    try:
        for it in range(iterations):
            # 0-150 ms after "ready"; every 6th kill 0-150 ms after the child
            # committed the other version, so that the version surely changes
            # under the loop however long a save takes on a busy machine.
            after = (3 - seen_versions[-1]) if it % 6 == 5 else None
            # Right after the commit for the forced kills: on an idle machine the
            # next save can commit within 150 ms too, and the version flips back.
            delay = rng.uniform(0.0, 0.15) if after is None else rng.uniform(0.0, 0.005)
            sync = it % 3 == 2  # fsync on a third of the saves (another code path)
            status = zygote.run_and_kill(sync, delay, after)
            what = (f"seed {seed} iteration {it} (kill {delay * 1e3:.0f} ms after "
                    f"{'ready' if after is None else f'committing version {after}'}, sync_files={sync})")
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
                f"{what}: the saver died on its own (wait status {status}); see {tmp_path / 'zygote.log'}"
            v, leftovers = _check_directory(path, fmt, versions, what)
            new = set(leftovers) - before  # left by this kill, not by an earlier one
            before = set(leftovers)
            history.append((round(delay * 1e3), after, v, len(new)))
            if after is not None and v == after:
                forced += 1  # (v is the other one when the next save also committed in time)
            if new:
                mid_save += 1
            for n in new:
                kinds["temporary" if TEMP_RE.match(n) else "manifest" if MANIFEST_RE.match(n) else "data file"] += 1
            if v != seen_versions[-1]:
                changes += 1
            seen_versions.append(v)
            assert time.monotonic() - start < 40, f"kill loop too slow: {it + 1} kills in 40 s"
    finally:
        zygote.close()

    # The kills landed in the middle of saves (files of an unfinished save
    # appeared that were not there after the previous kill), and saves also
    # committed between kills.
    summary = (f"seed {seed}; new leftovers {kinds}; "
               f"(delay ms, after committing, version, new leftovers) per kill: {history}")
    assert mid_save >= 3, f"only {mid_save} kills left an unfinished save behind; {summary}"
    assert forced >= 1 and changes >= 1 and set(seen_versions) == {1, 2}, f"the version never changed; {summary}"

    # A clean save removes everything the killed saves left.
    _save(versions[2], cdcp.FileSystemWriter(path, serialization_format=fmt))
    v, leftovers = _check_directory(path, fmt, versions, "final save")
    assert v == 2 and leftovers == []
    files = _referenced(path)
    token = DATA_RE.match(next(iter(files))).group(1)
    assert sorted(os.listdir(path)) == sorted(files | {".metadata", f".ckptio-manifest-{token}.json",
                                                        ".ckptio-dcp.lock"})
