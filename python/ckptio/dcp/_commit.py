"""Directory-level commit steps of a DCP save: atomic small files, the save
token in data file names, and removal of what older saves left behind.

Every failure is raised as a CkptioError naming the operation ("open",
"write", "fsync", "rename", "listdir", "unlink"), the file or directory, the
errno, and what it means for the checkpoint (unchanged, or new and in place).
tests/python/test_faults_dcp.py fails every call of these steps in turn."""

from __future__ import annotations

import errno as _errno
import fcntl
import os
import re
import secrets
import string
import logging
import threading
from typing import Iterable, List, Optional, Set

from .. import _ckptio
from .._errors import CkptioError, make_error

# __{rank}_{token}_{n}.distcp: the names ckptio.dcp gives data files.
_DATA_RE = re.compile(r"^__(\d+)_([0-9a-f]{12})_(\d+)\.distcp$")
# Anything a DCP writer (torch's or ckptio's) may leave in a checkpoint directory.
# (__*.distcp.ckptio-manifest.json: the block hashes a SAFETENSORS data file's
# save leaves for the writer to read; a crash can leave one.)
_STALE_RE = re.compile(r"^(__\d+_.*\.distcp(\.ckptio-manifest\.json)?|\.ckptio-manifest-[0-9a-f]+\.json"
                       r"|\.metadata\.tmp|__\d+\.metadata\.tmp)$")
# Temporaries are named as libckptio names its own (".NAME.ckptio-tmp-" and six
# characters of [A-Za-z0-9]) and locked the same way, so that
# ckptio_cleanup_temporaries / `ckptio clean` recognise them and never remove
# one a live save holds.
_TMP_ALPHABET = string.ascii_letters + string.digits
_TMP_TRIES = 16

_STATUS_OF_ERRNO = {
    _errno.ENOENT: "E_NOT_FOUND", _errno.ENOTDIR: "E_NOT_FOUND",
    _errno.EACCES: "E_PERMISSION", _errno.EPERM: "E_PERMISSION", _errno.EROFS: "E_PERMISSION",
    _errno.ENOSPC: "E_NOSPC", _errno.EDQUOT: "E_NOSPC", _errno.EFBIG: "E_NOSPC",
    _errno.ENOMEM: "E_NOMEM", _errno.EEXIST: "E_EXISTS",
}


def _fail(operation: str, path: str, exc: OSError, what: str) -> CkptioError:
    """The CkptioError for a failed system call on `path` (mapping errno to a
    status as libckptio does); `what` says what was being done and what the
    failure leaves behind."""
    err = exc.errno or _errno.EIO
    name = _STATUS_OF_ERRNO.get(err, "E_IO")
    message = f"{path}: {operation}: {os.strerror(err)} ({what})"
    return make_error(getattr(_ckptio, name), name, err, 0, operation, path, -1, None, message)


def token_of(files: Iterable[str]) -> Optional[str]:
    """The save token shared by ckptio-named data files, else None."""
    tokens = set()
    for name in files:
        m = _DATA_RE.match(name)
        if not m:
            return None
        tokens.add(m.group(2))
    return tokens.pop() if len(tokens) == 1 else None


def fsync_dir(path: str) -> None:
    """fsync of a directory: makes the renames and unlinks in it durable.
    Raises the plain OSError; callers say what it was for."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temporary(dirpath: str, name: str, final: str):
    """Creates and locks dirpath/.NAME.ckptio-tmp-XXXXXX; returns (fd, path).
    Like libckptio (src/io/file.c): the flock tells cleaners a live writer
    holds it, and a cleaner that locked or removed the brand-new file before
    us makes us pick another name."""
    for _ in range(_TMP_TRIES):
        suffix = "".join(secrets.choice(_TMP_ALPHABET) for _ in range(6))
        tmp = os.path.join(dirpath, f".{name}.ckptio-tmp-{suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        except OSError as e:
            raise _fail("open", tmp, e, f"creating the temporary of {final}; {final} is unchanged") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # a cleaner holds it and will remove it
            continue
        except OSError:
            return fd, tmp  # a file system without flock: keep working (cleaners then keep it)
        try:
            mine, named = os.fstat(fd), os.lstat(tmp)
            if (mine.st_ino, mine.st_dev) == (named.st_ino, named.st_dev):
                return fd, tmp
        except OSError:
            pass  # a cleaner removed the name
        os.close(fd)
    raise make_error(_ckptio.E_EXISTS, "E_EXISTS", _errno.EEXIST, 0, "open", final, -1, None,
                     f"{final}: open: no free temporary name after {_TMP_TRIES} tries; {final} is unchanged")


def write_atomic(dirpath, name: str, data: bytes, sync: bool) -> None:
    """Writes dirpath/name through a temporary: write, fsync, rename, fsync the
    directory (without sync: no fsyncs). A failure before the rename leaves the
    old file untouched and removes the temporary; a failure of the directory
    fsync after it says the new file is in place but may not survive a power
    loss."""
    dirpath = os.fspath(dirpath)
    final = os.path.join(dirpath, name)
    fd, tmp = _create_temporary(dirpath, name, final)
    try:
        try:
            view = memoryview(data)
            done = 0
            while done < len(view):
                try:
                    n = os.write(fd, view[done:])
                except OSError as e:
                    raise _fail("write", tmp, e, f"at offset {done} of {len(view)} bytes of {final}; "
                                f"{final} is unchanged") from e
                if n <= 0:  # a regular file never does this; do not spin on it
                    raise _fail("write", tmp, OSError(_errno.EIO, "wrote nothing"),
                                f"0 bytes written at offset {done} of {final}; {final} is unchanged")
                done += n  # a short write: go on from where it stopped
            if sync:
                try:
                    os.fsync(fd)
                except OSError as e:
                    raise _fail("fsync", tmp, e, f"flushing {final} before its rename; {final} is unchanged") from e
        finally:
            os.close(fd)
        try:
            os.replace(tmp, final)
        except OSError as e:
            raise _fail("rename", final, e, f"replacing it with {os.path.basename(tmp)}; {final} is unchanged") from e
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # the first error matters; a left temporary is recognisable and removed later
        raise
    if sync:
        try:
            fsync_dir(dirpath)
        except OSError as e:
            raise _fail("fsync", dirpath, e, f"flushing the directory after replacing {name}: the new {name} is "
                        "in place but may not survive a power loss") from e


_COMMITTED = "the new checkpoint is committed; the next save removes what is left"


def stale_files(dirpath, keep: Set[str]) -> List[str]:
    """Names of data files, manifests and temporaries of older saves in
    dirpath (anything a DCP writer names that is not in `keep`), listed now:
    files created later (by the next save) are never among them."""
    dirpath = os.fspath(dirpath)
    try:
        names = os.listdir(dirpath)
    except OSError as e:
        raise _fail("listdir", dirpath, e, f"looking for files of older saves; {_COMMITTED}") from e
    return sorted(n for n in names if n not in keep and (_STALE_RE.match(n) or ".ckptio-tmp-" in n))


def remove_files(dirpath, names: List[str], sync: bool) -> None:
    """Unlinks dirpath/name for each name, then (with sync, when something was
    removed) fsyncs the directory, so that a power loss cannot bring them
    back. An unlink failure does not stop the others; the first is raised
    after the directory fsync. Every error says the new checkpoint is
    committed (this runs after the new .metadata is in place)."""
    dirpath = os.fspath(dirpath)
    removed, first = 0, None
    for name in names:
        path = os.path.join(dirpath, name)
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as e:
            if first is None:
                first = _fail("unlink", path, e, f"removing a file of an older save; {_COMMITTED}")
                first.__cause__ = e
    if removed and sync:
        try:
            fsync_dir(dirpath)
        except OSError as e:
            raise _fail("fsync", dirpath, e, f"flushing the directory after removing {removed} files of older "
                        f"saves (a power loss may bring them back); {_COMMITTED}") from e
    if first is not None:
        raise first


def remove_stale(dirpath, keep: Set[str], sync: bool) -> None:
    """Deletes the files of older saves (stale_files, then remove_files)."""
    remove_files(dirpath, stale_files(dirpath, keep), sync)


class BackgroundRemoval:
    """remove_files on a thread of its own: unlinking the previous checkpoint's
    data files (ext4 frees their extents on unlink, which takes a while for
    large files) leaves the save's critical path. The thread is not a
    daemon, so the interpreter finishes it before exiting; a failure is kept
    for join() and logged (the next save removes what is left)."""

    def __init__(self, dirpath, names: List[str], sync: bool) -> None:
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(os.fspath(dirpath), names, sync),
                                        name="ckptio-dcp-cleanup", daemon=False)
        self._thread.start()

    def _run(self, dirpath: str, names: List[str], sync: bool) -> None:
        try:
            remove_files(dirpath, names, sync)
        except BaseException as e:  # noqa: BLE001 - reported by join() and the log
            self.error = e
            logging.getLogger("ckptio.dcp").warning("%s", e)

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits for the removal; False on timeout. Raises the removal's error."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return True
