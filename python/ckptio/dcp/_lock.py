"""The lock that serializes the saves of one DCP checkpoint directory.

libckptio takes and holds it (ckptio_dcp_lock_acquire, src/ckpt/dcp_lock.c,
which says why it is flock on ``DIR/.ckptio-dcp.lock``): exclusive for a save
with a cleanup, from before the global plan is returned (no rank writes a
data file before that) until the cleanup's file list is taken and the
foreground removal is done; shared for saves without collectives (per-rank
``__{rank}.metadata``), which delete nothing (in object storage a mark that
a cleanup honours, docs/OBJECT_STORAGE.md 4.2). A forked child closes its
copy of the descriptor there, too.

What stays here is what only Python can know: whether the save that took
a lock is still running. A save that dies between the writer's hooks (a
peer's failure reported by a collective: ``finish`` never runs) leaves its
lock held; a watcher thread releases it once the save's thread has left
torch.distributed.checkpoint code, and a save of this process that finds
the directory busy releases such locks at once.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import threading
import weakref
from typing import Dict, List, Optional, Set, Tuple, Union

from .. import _ckptio, _memory
from .._errors import CkptioError, amend_error

LOCK_NAME = _ckptio.DCP_LOCK_NAME
_BUSY_HINT = ", or create the writer with dir_busy='wait' or a number of seconds"
_WATCH_SECONDS = 0.2
_log = logging.getLogger("ckptio.dcp")

# The locks this process holds, by the lock file's (st_dev, st_ino) (a
# lease in object storage: by its directory): a save that finds the
# directory busy first releases those of saves that ended without finishing
# (a failure on another rank), which flock (or the lease) would otherwise
# count as a second holder even inside one process.
_held: Dict[object, "weakref.WeakSet[DirectoryLock]"] = {}
_held_mutex = threading.Lock()
# Leases being released in the background (release_in_background), by directory.
_releasing: Dict[str, List[threading.Thread]] = {}
_releasing_mutex = threading.Lock()
_warned_unsupported: Set[str] = set()


_DCP_PATHS = ("/torch/distributed/checkpoint/", "/ckptio/dcp/")
_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")


def in_dcp_code(thread: Optional[threading.Thread]) -> bool:
    """True while `thread` is alive and runs code of
    torch.distributed.checkpoint or ckptio.dcp (i.e. a save or load is in
    progress on it).

    The other thread's stack is read by faulthandler, which walks the
    interpreter's frames in C without creating frame objects or letting go
    of the GIL. Walking ``sys._current_frames()`` through ``f_back`` from
    Python instead lets that thread run (and pop the frames being read)
    between two steps of the walk, which crashes CPython 3.11. Where the
    dump is cut short (over 100 frames or threads) before the answer is
    certain, the thread counts as in DCP code: its lock stays held rather
    than being released under a save that still runs."""
    if thread is None or not thread.is_alive() or thread.ident is None:
        return False
    # In memory (no file system to depend on), read back from its start. Where the stacks cannot be read,
    # the thread counts as in DCP code (its lock stays held).
    try:
        with os.fdopen(_memory._memfd(), "w+b") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            text = f.read().decode("ascii", "replace")
    except OSError:
        return True
    found = cut = False
    for line in text.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            if found:
                return False
            found = int(header.group(1), 16) == thread.ident
            continue
        if found:
            if line.startswith("  File ") and any(p in line for p in _DCP_PATHS):
                return True
            if line.strip() == "...":
                return True
        elif line.strip() == "...":
            cut = True
    return cut and not found


class DirectoryLock:
    """One lock on DIR/.ckptio-dcp.lock held by libckptio for a save (on a
    file system without flock, ``locked`` is False and nothing is held).
    release() is idempotent; the lock is also released when the object is
    collected."""

    def __init__(self, dirpath: str, native, key: Tuple[int, int], locked: bool) -> None:
        self.dirpath = dirpath
        self.path = dirpath + LOCK_NAME if dirpath.endswith("/") else f"{dirpath}/{LOCK_NAME}"
        self._native = native
        self._key = key
        self.locked = locked
        self.owner = threading.current_thread()  # the thread running the save
        self._mutex = threading.Lock()
        self._stop = threading.Event()

    @property
    def held(self) -> bool:
        return self._native is not None

    def release(self, why: Optional[str] = None) -> None:
        with self._mutex:
            native, self._native = self._native, None
        if native is None:
            return
        self._stop.set()
        _ckptio.dcp_lock_release(native)
        if why:
            _log.warning("%s: released the lock of the directory: %s", self.dirpath, why)

    def check(self) -> None:
        """Raises CkptioError E_BUSY once the lock no longer holds the
        directory: a lease in object storage that another save took over or
        that lapsed (a flock always holds)."""
        native = self._native
        if native is not None:
            _ckptio.dcp_lock_check(native)

    def check_started(self) -> "PendingCheck":
        """check() on a thread of its own (its GET runs while the caller
        writes); PendingCheck.result() waits for it and raises its error."""
        return PendingCheck(self)

    def stale(self) -> bool:
        """The save that took it is over without releasing it: its thread is
        gone, has left DCP code, or is the caller's own thread (one thread
        runs one save at a time)."""
        return self.owner is threading.current_thread() or not in_dcp_code(self.owner)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass


class PendingCheck:
    """A DirectoryLock.check() running on a thread of its own."""

    def __init__(self, lock: DirectoryLock) -> None:
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(lock,), name="ckptio-dcp-lock-check", daemon=True)
        self._thread.start()

    def _run(self, lock: DirectoryLock) -> None:
        try:
            lock.check()
        except BaseException as e:  # noqa: BLE001 - raised by result()
            self.error = e

    def result(self) -> None:
        self._thread.join()
        err, self.error = self.error, None
        if err is not None:
            raise err


def _watch(ref: "weakref.ReferenceType[DirectoryLock]") -> None:
    """Releases the lock of a save that died between the writer's hooks (a
    peer's failure reported by a collective: finish() never runs). Holds
    only a weak reference, so a collected lock ends it too."""
    while True:
        lock = ref()
        if lock is None or not lock.held:
            return
        stop = lock._stop
        if not in_dcp_code(lock.owner):
            lock.release("the save that held it ended without finishing")
            return
        del lock
        if stop.wait(_WATCH_SECONDS):
            return


def _forget_in_child() -> None:
    """In a forked child: libckptio closed the inherited lock descriptors
    (without unlocking the parent's lock); forget the parent's saves and
    their releases (the parent's threads)."""
    global _held_mutex, _releasing_mutex
    _held_mutex = threading.Lock()  # another thread may have held it at the fork
    _releasing_mutex = threading.Lock()
    _held.clear()
    _releasing.clear()


def _key(dirpath) -> str:
    return os.fspath(dirpath).rstrip("/")


def release_in_background(lock: DirectoryLock) -> None:
    """lock.release() on a thread of its own: a lease's release (a GET and a
    DELETE) once its save is committed and needs it no more. The thread is
    not a daemon, so the interpreter finishes it before exiting, and the
    next acquire() of the directory in this process (wait_released) waits
    for it: a process never finds its own save's lease in its way."""
    thread = threading.Thread(target=lock.release, name="ckptio-dcp-lease-release", daemon=False)
    with _releasing_mutex:
        _releasing.setdefault(_key(lock.dirpath), []).append(thread)
    thread.start()


def wait_released(dirpath, timeout: Optional[float] = None) -> bool:
    """Waits for this process's background releases of `dirpath`'s lease;
    False when `timeout` seconds passed first (they go on)."""
    with _releasing_mutex:
        threads = _releasing.pop(_key(dirpath), [])
    for thread in threads:
        thread.join(timeout)
    left = [t for t in threads if t.is_alive()]
    if left:
        with _releasing_mutex:
            _releasing.setdefault(_key(dirpath), []).extend(left)
    return not left


os.register_at_fork(after_in_child=_forget_in_child)


def _held_key(dirpath: str, path: str) -> Optional[object]:
    """Where _held keeps the locks of `dirpath` (lock file `path`); None for
    a lock file that cannot be stat'ed."""
    if _ckptio.path_is_object(dirpath):
        return ("lease", _key(dirpath))
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _release_stale(dirpath: str, path: str) -> None:
    """Releases this process's locks of `dirpath` (lock file `path`) whose
    saves ended without finishing: flock counts them as another holder even
    inside one process, and a lease holds until it is released or lapses."""
    key = _held_key(dirpath, path)
    if key is None:
        return
    with _held_mutex:
        holders = list(_held.get(key, ()))
    for lock in holders:
        if lock.held and lock.stale():
            lock.release("the save that held it ended without finishing")


def acquire(dirpath, exclusive: bool, busy: Union[str, float], reference: Optional[str] = None,
            confirm_later: bool = False) -> DirectoryLock:
    """Locks `dirpath` for one save (exclusive: a save with a cleanup;
    shared: one that deletes nothing). `busy`: "wait" blocks until the other
    save is done, "error" raises CkptioError E_BUSY at once, a number of
    seconds waits at most that long. `reference`: the metadata file whose
    attributes a new lock file takes (_commit.reference_stat).
    `confirm_later`: a lease in object storage written without a conditional
    write is read back by the first check() instead of before this returns
    (CKPTIO_DCP_LOCK_CONFIRM_LATER: for a save whose objects carry its own
    token and that checks before its .metadata)."""
    dirpath = os.fspath(dirpath)
    wait_released(dirpath)  # this process's previous save of it
    path = os.path.join(dirpath, LOCK_NAME)
    timeout = -1.0 if busy == "wait" else 0.0 if busy == "error" else float(busy)
    checks = 0

    def on_wait(waited: float) -> None:
        # Every busy check: this process's own dead saves go first; the
        # first check of a save that will wait says so.
        nonlocal checks
        checks += 1
        _release_stale(dirpath, path)
        if checks == 1 and busy != "error":
            _log.info("%s: waiting for another save of the directory (lock %s)", dirpath, LOCK_NAME)

    try:
        native = _ckptio.dcp_lock_acquire(dirpath, reference, not exclusive, timeout, on_wait, False,
                                          bool(confirm_later))
    except CkptioError as e:
        if e.status_name == "E_BUSY":
            raise amend_error(e, _BUSY_HINT) from None
        raise
    locked, err, dev, ino = _ckptio.dcp_lock_info(native)
    lock = DirectoryLock(dirpath, native, (dev, ino), locked)
    if _ckptio.path_is_object(dirpath):  # a lease (no descriptor): kept by its directory, not by an inode
        with _held_mutex:
            _held.setdefault(_held_key(dirpath, path), weakref.WeakSet()).add(lock)
        threading.Thread(target=_watch, args=(weakref.ref(lock),), name="ckptio-dcp-lock-watch", daemon=True).start()
        return lock
    if not locked:
        if dirpath not in _warned_unsupported:
            _warned_unsupported.add(dirpath)
            _log.warning("%s: the file system cannot lock %s (%s): saves into this directory are not "
                         "serialized; never run two at once", dirpath, LOCK_NAME, os.strerror(err))
        return lock
    with _held_mutex:
        _held.setdefault((dev, ino), weakref.WeakSet()).add(lock)
    threading.Thread(target=_watch, args=(weakref.ref(lock),), name="ckptio-dcp-lock-watch", daemon=True).start()
    return lock


def check_busy_option(busy) -> Union[str, float]:
    """Validates a dir_busy value: "wait", "error" or seconds >= 0."""
    if isinstance(busy, str):
        if busy not in ("wait", "error"):
            raise ValueError(f"dir_busy must be 'wait', 'error' or a number of seconds, not {busy!r}")
        return busy
    if isinstance(busy, bool) or not isinstance(busy, (int, float)) or not busy >= 0 or busy == float("inf"):
        raise ValueError(f"dir_busy must be 'wait', 'error' or a number of seconds, not {busy!r}")
    return float(busy)
