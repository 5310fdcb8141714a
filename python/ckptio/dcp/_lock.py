"""The lock that serializes the saves of one DCP checkpoint directory.

A save's commit replaces ``.metadata`` and then deletes the files of older
saves; two saves into one directory at once would each delete what the
other wrote (docs/DCP.md "Concurrent saves"). So the coordinator of a save
takes ``flock(LOCK_EX)`` on ``DIR/.ckptio-dcp.lock`` before the global plan
is returned (no rank writes a data file before that) and keeps it until
the cleanup's file list is taken and the foreground removal is done. Saves
without collectives (per-rank ``__{rank}.metadata``) delete nothing and take
it shared (``LOCK_SH``): they run beside each other, never beside a
collective save.

Why flock on a lock file (not on the directory's descriptor, not a pid
file): the kernel drops an flock when the holder's last descriptor goes
away, also on SIGKILL, so a dead save never blocks the next one and there
is nothing stale to recognise (a pid says nothing across containers or
hosts); flock on a directory is local to the client on NFS, while on a
regular file opened for writing NFS emulates it with a byte-range lock on
the server, which other clients see (unless mounted ``local_lock=flock``;
a dead client's lock is then released when the server reclaims its lease,
not at once). The file is empty, never removed (removing it would let a
waiter lock an orphaned inode while a third save locks a new one) and
created with the mode of the checkpoint's ``.metadata``. File systems
without flock keep working, unserialized, with a logged warning.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import logging
import os
import stat
import sys
import threading
import time
import weakref
from typing import Dict, Optional, Set, Tuple, Union

from .. import _ckptio
from .._errors import make_error
from . import _commit

LOCK_NAME = ".ckptio-dcp.lock"
# flock failures that mean "this file system cannot lock", not "busy".
_UNSUPPORTED = {_errno.ENOLCK, _errno.EOPNOTSUPP, _errno.ENOTSUP, _errno.ENOSYS, _errno.EINVAL, _errno.EBADF}
_WATCH_SECONDS = 0.2
_log = logging.getLogger("ckptio.dcp")

# The locks this process holds, by the lock file's (st_dev, st_ino): a save
# that finds the directory busy first releases those of saves that ended
# without finishing (a failure on another rank), which flock would
# otherwise count as a second holder even inside one process.
_held: Dict[Tuple[int, int], "weakref.WeakSet[DirectoryLock]"] = {}
_held_mutex = threading.Lock()
_warned_unsupported: Set[str] = set()


def in_dcp_code(thread: Optional[threading.Thread]) -> bool:
    """True while `thread` is alive and runs code of
    torch.distributed.checkpoint or ckptio.dcp (i.e. a save or load is in
    progress on it)."""
    if thread is None or not thread.is_alive():
        return False
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(("torch.distributed.checkpoint", "ckptio.dcp")):
            return True
        frame = frame.f_back
    return False


def _holders(path: str, st: os.stat_result) -> str:
    """', held by pid N[, M]' from /proc/locks for the lock file, or ''."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("->" marks waiters)
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == key:
                    pids.append(parts[4])
    except OSError:
        return ""
    return f", held by pid {', '.join(pids)}" if pids else ""


class DirectoryLock:
    """One held (or, on a file system without flock, merely opened) lock on
    DIR/.ckptio-dcp.lock. release() is idempotent; the descriptor is also
    closed when the object is collected."""

    def __init__(self, dirpath: str, fd: int, key: Tuple[int, int], locked: bool) -> None:
        self.dirpath = dirpath
        self.path = os.path.join(dirpath, LOCK_NAME)
        self._fd: Optional[int] = fd
        self._key = key
        self.locked = locked
        self.owner = threading.current_thread()  # the thread running the save
        self._mutex = threading.Lock()
        self._stop = threading.Event()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, why: Optional[str] = None) -> None:
        with self._mutex:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        self._stop.set()
        try:
            # LOCK_UN, not only close: a child forked meanwhile (a DataLoader
            # worker) shares the open file description, and the lock with it.
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        os.close(fd)
        if why:
            _log.warning("%s: released the lock of the directory: %s", self.dirpath, why)

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
    """In a forked child: close the inherited lock descriptors (without
    LOCK_UN, which would release the parent's lock), so that the lock dies
    with the parent and the child never counts as holding it."""
    global _held_mutex
    _held_mutex = threading.Lock()  # another thread may have held it at the fork
    for locks in list(_held.values()):
        for lock in list(locks):
            fd, lock._fd = lock._fd, None
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _open_lock_file(path: str, reference: Optional[os.stat_result]) -> int:
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, os.O_RDWR | flags, _commit.create_mode(reference))
    except PermissionError:
        # Someone else's lock file we may not write (flock needs only an open
        # descriptor locally; NFS needs write access, see the module notes).
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            raise _commit.fail("open", path, e, "locking the directory against concurrent saves; the checkpoint "
                               "is unchanged") from e
        return fd
    except OSError as e:
        raise _commit.fail("open", path, e, "locking the directory against concurrent saves; the checkpoint is "
                           "unchanged") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(_errno.EINVAL, "not a regular file")
        _commit.adopt_attributes(fd, reference)  # follows the checkpoint's mode
    except OSError as e:
        os.close(fd)
        raise _commit.fail("open", path, e, "locking the directory against concurrent saves; the checkpoint is "
                           "unchanged") from e
    return fd


def _release_stale(key: Tuple[int, int]) -> None:
    with _held_mutex:
        holders = list(_held.get(key, ()))
    for lock in holders:
        if lock.held and lock.stale():
            lock.release("the save that held it ended without finishing")


def _busy_error(dirpath: str, path: str, st: os.stat_result, waited: Optional[float]):
    when = "" if waited is None else f" after waiting {waited:g} s"
    message = (f"{dirpath}: another save holds the directory (lock {LOCK_NAME}{_holders(path, st)}){when}: "
               "this save wrote nothing and the checkpoint is unchanged; wait for the other save, or create the "
               "writer with dir_busy='wait' or a number of seconds")
    return make_error(_ckptio.E_BUSY, "E_BUSY", _errno.EWOULDBLOCK, 0, "lock", path, -1, None, message)


def acquire(dirpath, exclusive: bool, busy: Union[str, float],
            reference: Optional[os.stat_result] = None) -> DirectoryLock:
    """Locks `dirpath` for one save (exclusive: a save with a cleanup;
    shared: one that deletes nothing). `busy`: "wait" blocks until the other
    save is done, "error" raises CkptioError E_BUSY at once, a number of
    seconds waits at most that long. `reference`: attributes a new lock
    file takes (the checkpoint's .metadata)."""
    dirpath = os.fspath(dirpath)
    path = os.path.join(dirpath, LOCK_NAME)
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    start = time.monotonic()
    deadline = None if busy == "wait" else start + (0.0 if busy == "error" else float(busy))
    pause = 0.002
    while True:
        fd = _open_lock_file(path, reference)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            _release_stale(key)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise _busy_error(dirpath, path, st, None if busy == "error" else now - start) from None
            if pause == 0.002:
                _log.info("%s: waiting for another save of the directory (lock %s%s)", dirpath, LOCK_NAME,
                          _holders(path, st))
            time.sleep(pause if deadline is None else min(pause, max(deadline - now, 0.0)))
            pause = min(pause * 2, 0.05)
            continue
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                os.close(fd)
                raise _commit.fail("flock", path, e, "locking the directory against concurrent saves; the "
                                   "checkpoint is unchanged") from e
            if dirpath not in _warned_unsupported:
                _warned_unsupported.add(dirpath)
                _log.warning("%s: the file system cannot lock %s (%s): saves into this directory are not "
                             "serialized; never run two at once", dirpath, LOCK_NAME, os.strerror(e.errno))
            return DirectoryLock(dirpath, fd, key, locked=False)
        try:
            now_named = os.lstat(path)
        except OSError:
            now_named = None
        if now_named is None or (now_named.st_dev, now_named.st_ino) != key:
            os.close(fd)  # removed or replaced while we waited: lock the file that is there now
            continue
        lock = DirectoryLock(dirpath, fd, key, locked=True)
        with _held_mutex:
            _held.setdefault(key, weakref.WeakSet()).add(lock)
        threading.Thread(target=_watch, args=(weakref.ref(lock),), name="ckptio-dcp-lock-watch",
                         daemon=True).start()
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
