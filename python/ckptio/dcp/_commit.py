"""Directory-level commit steps of a DCP save: atomic small files, the save
token in data file names, the attributes new files take, and removal of what
older saves left behind (only what no metadata file references and no live
writer holds).

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
import stat
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
# The metadata files a checkpoint directory can hold: .metadata (a collective
# save) and __{rank}.metadata (saves without collectives).
_METADATA_RE = re.compile(r"^(\.metadata|__\d+\.metadata)$")
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


def fail(operation: str, path: str, exc: OSError, what: str) -> CkptioError:
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


def reference_stat(dirpath, name: str) -> Optional[os.stat_result]:
    """The attributes the files of a save into `dirpath` take: those of the
    metadata file `name` the save replaces (lstat; None when it is missing
    or not a regular file, i.e. a new checkpoint: then files are created as
    any new file, 0666 & ~umask)."""
    try:
        st = os.lstat(os.path.join(os.fspath(dirpath), name))
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def create_mode(reference: Optional[os.stat_result]) -> int:
    """The mode to create a file with: the reference's permission bits (the
    umask may take more away; adopt_attributes restores them), else 0666."""
    return stat.S_IMODE(reference.st_mode) & 0o777 if reference is not None else 0o666


def adopt_attributes(fd: int, reference: Optional[os.stat_result]) -> None:
    """Gives the new file `fd` the owner and group of `reference` where
    permitted (root; a member of the group may still change the group) and
    its permission bits (set-id and sticky bits are not copied), as
    torch.save and safetensors keep them by rewriting the old file in
    place. Best effort: a file system that refuses keeps the file as
    created, which is never wider than the reference (create_mode)."""
    if reference is None:
        return
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (reference.st_uid, reference.st_gid):
        try:
            os.fchown(fd, reference.st_uid, reference.st_gid)
        except OSError:
            try:
                os.fchown(fd, -1, reference.st_gid)
            except OSError:
                pass
    mode = stat.S_IMODE(reference.st_mode) & 0o777
    if stat.S_IMODE(os.fstat(fd).st_mode) != mode:  # after fchown, which may clear set-id bits
        try:
            os.fchmod(fd, mode)
        except OSError:
            pass


def create_placeholder(dirpath, name: str, reference: Optional[os.stat_result]) -> None:
    """Creates the empty file dirpath/name (a data file's final name, new
    to this save) with the reference's attributes, so that the atomic save
    of libckptio that replaces it gives its temporary the same ones (a
    temporary takes the mode and owner of the file it replaces). A crash
    leaves an empty unreferenced data file that the next save removes."""
    path = os.path.join(os.fspath(dirpath), name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, create_mode(reference))
    except OSError as e:
        raise fail("open", path, e, "creating the data file with the checkpoint's mode; the checkpoint is "
                   "unchanged") from e
    try:
        adopt_attributes(fd, reference)
    finally:
        os.close(fd)


def _create_temporary(dirpath: str, name: str, final: str, reference: Optional[os.stat_result] = None):
    """Creates and locks dirpath/.NAME.ckptio-tmp-XXXXXX; returns (fd, path).
    Like libckptio (src/io/file.c): the flock tells cleaners a live writer
    holds it, and a cleaner that locked or removed the brand-new file before
    us makes us pick another name. It is created with the attributes of
    `reference` (never wider than its mode, see create_mode)."""
    for _ in range(_TMP_TRIES):
        suffix = "".join(secrets.choice(_TMP_ALPHABET) for _ in range(6))
        tmp = os.path.join(dirpath, f".{name}.ckptio-tmp-{suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         create_mode(reference))
        except FileExistsError:
            continue
        except OSError as e:
            raise fail("open", tmp, e, f"creating the temporary of {final}; {final} is unchanged") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # a cleaner holds it and will remove it
            continue
        except OSError:
            adopt_attributes(fd, reference)
            return fd, tmp  # a file system without flock: keep working (cleaners then keep it)
        try:
            mine, named = os.fstat(fd), os.lstat(tmp)
            if (mine.st_ino, mine.st_dev) == (named.st_ino, named.st_dev):
                adopt_attributes(fd, reference)
                return fd, tmp
        except OSError:
            pass  # a cleaner removed the name
        os.close(fd)
    raise make_error(_ckptio.E_EXISTS, "E_EXISTS", _errno.EEXIST, 0, "open", final, -1, None,
                     f"{final}: open: no free temporary name after {_TMP_TRIES} tries; {final} is unchanged")


def write_atomic(dirpath, name: str, data: bytes, sync: bool, reference: Optional[os.stat_result] = None) -> None:
    """Writes dirpath/name through a temporary: write, fsync, rename, fsync the
    directory (without sync: no fsyncs). A failure before the rename leaves the
    old file untouched and removes the temporary; a failure of the directory
    fsync after it says the new file is in place but may not survive a power
    loss. The file gets the attributes of `reference` (reference_stat)."""
    dirpath = os.fspath(dirpath)
    final = os.path.join(dirpath, name)
    fd, tmp = _create_temporary(dirpath, name, final, reference)
    try:
        try:
            view = memoryview(data)
            done = 0
            while done < len(view):
                try:
                    n = os.write(fd, view[done:])
                except OSError as e:
                    raise fail("write", tmp, e, f"at offset {done} of {len(view)} bytes of {final}; "
                                f"{final} is unchanged") from e
                if n <= 0:  # a regular file never does this; do not spin on it
                    raise fail("write", tmp, OSError(_errno.EIO, "wrote nothing"),
                                f"0 bytes written at offset {done} of {final}; {final} is unchanged")
                done += n  # a short write: go on from where it stopped
            if sync:
                try:
                    os.fsync(fd)
                except OSError as e:
                    raise fail("fsync", tmp, e, f"flushing {final} before its rename; {final} is unchanged") from e
        finally:
            os.close(fd)
        try:
            os.replace(tmp, final)
        except OSError as e:
            raise fail("rename", final, e, f"replacing it with {os.path.basename(tmp)}; {final} is unchanged") from e
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
            raise fail("fsync", dirpath, e, f"flushing the directory after replacing {name}: the new {name} is "
                        "in place but may not survive a power loss") from e


_COMMITTED = "the new checkpoint is committed; the next save removes what is left"


class Committed:
    """What a save just committed: its metadata file's name and bytes and
    the data files they reference. Lets the cleanup read the directory's
    current metadata without unpickling it again when it is still this
    save's."""

    def __init__(self, name: str, data: bytes, files: Set[str]) -> None:
        self.name, self.data, self.files = name, data, set(files)


class _NotRegular(Exception):
    pass


def _read_metadata_file(path: str) -> bytes:
    """The bytes of a metadata file. A symlink, FIFO or other non-regular
    file raises _NotRegular (never followed or waited on), a missing one
    FileNotFoundError, an I/O error CkptioError (nothing removed yet)."""
    what = f"reading it to find the files it references: nothing was removed; {_COMMITTED}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == _errno.ELOOP:
            raise _NotRegular("a symlink") from None
        raise fail("open", path, e, what) from e
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotRegular("not a regular file")
        try:
            return f.read()
        except OSError as e:
            raise fail("read", path, e, what) from e


def referenced_now(dirpath, names: Iterable[str], committed: Optional[Committed]) -> Optional[Set[str]]:
    """Every data file the metadata files among `names` (.metadata and
    __{rank}.metadata in dirpath) reference, read now with ckptio's
    restricted unpickler (not again when one still holds what `committed`
    wrote). None when one is no metadata ckptio can read (a symlink or other
    non-regular file, a pickle outside the allowlist, corrupt): nothing it
    might reference may be deleted, and a warning says so. An I/O error
    reading one raises CkptioError (nothing was removed; the new checkpoint
    is committed)."""
    dirpath = os.fspath(dirpath)
    out: Set[str] = set()
    for name in names:
        if not _METADATA_RE.match(name):
            continue
        path = os.path.join(dirpath, name)
        try:
            data = _read_metadata_file(path)  # an I/O error propagates
        except FileNotFoundError:
            continue
        except _NotRegular as e:
            return _unreadable(dirpath, name, e)
        if committed is not None and name == committed.name and data == committed.data:
            out |= committed.files
            continue
        from ._metadata import metadata_from_bytes  # torch's classes: loaded only when needed

        try:
            md = metadata_from_bytes(data, path)
            out |= {getattr(info, "relative_path", None) for info in (md.storage_data or {}).values()} - {None}
        except Exception as e:  # noqa: BLE001 - any failure means "cannot prove it unreferenced"
            return _unreadable(dirpath, name, e)
    return out


def _unreadable(dirpath: str, name: str, why: BaseException) -> None:
    logging.getLogger("ckptio.dcp").warning(
        "%s: keeping the files of older saves: %s cannot be read (%s); %s", dirpath, name, why, _COMMITTED)
    return None


def stale_files(dirpath, keep: Set[str], committed: Optional[Committed] = None) -> List[str]:
    """Names of data files, manifests and temporaries of older saves in
    dirpath (anything a DCP writer names that is not in `keep` and that no
    metadata file in the directory references now), listed now: files
    created later (by the next save) are never among them. Temporaries are
    listed whatever their state; remove_files() removes only those no live
    writer holds."""
    dirpath = os.fspath(dirpath)
    try:
        names = os.listdir(dirpath)
    except OSError as e:
        raise fail("listdir", dirpath, e, f"looking for files of older saves; {_COMMITTED}") from e
    candidates = [n for n in names if n not in keep and (_STALE_RE.match(n) or ".ckptio-tmp-" in n)]
    referenced = referenced_now(dirpath, names, committed) if candidates else set()
    if referenced is None:
        return sorted(n for n in candidates if ".ckptio-tmp-" in n)
    return sorted(n for n in candidates if n not in referenced)


def _remove_temporary(path: str) -> bool:
    """Unlinks a temporary no live writer holds, as libckptio's cleaner does
    (src/io/temporaries.c): it must be a regular file we can flock, still
    under its name; a writer holds its flock until it commits or closes, and
    the kernel drops it when the writer dies. Returns whether it was
    removed; raises the unlink's OSError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False  # gone, a symlink, or not ours to check: keep
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live writer holds it (or no flock here: cannot tell, keep)
        try:
            named = os.lstat(path)
        except OSError:
            return False
        if (named.st_dev, named.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)  # after the unlink: the lock covers it


def remove_files(dirpath, names: List[str], sync: bool, committed: Optional[Committed] = None,
                 recheck: bool = False) -> None:
    """Unlinks dirpath/name for each name, then (with sync, when something was
    removed) fsyncs the directory, so that a power loss cannot bring them
    back. A temporary is removed only when no live writer holds it. With
    `recheck` (a list taken earlier, by the background cleanup), the
    directory's metadata files are read again right before and whatever they
    reference now is kept (e.g. files of torch's own writer, which reuses
    names and takes no lock). An unlink failure does not stop the others;
    the first is raised after the directory fsync. Every error says the new
    checkpoint is committed (this runs after the new .metadata is in place)."""
    dirpath = os.fspath(dirpath)
    if recheck and any(".ckptio-tmp-" not in n for n in names):
        try:
            now = os.listdir(dirpath)
        except OSError as e:
            raise fail("listdir", dirpath, e, f"looking for files of older saves; {_COMMITTED}") from e
        referenced = referenced_now(dirpath, now, committed)
        names = [n for n in names if ".ckptio-tmp-" in n or (referenced is not None and n not in referenced)]
    removed, first = 0, None
    for name in names:
        path = os.path.join(dirpath, name)
        try:
            if ".ckptio-tmp-" in name:
                removed += _remove_temporary(path)
            else:
                os.unlink(path)
                removed += 1
        except FileNotFoundError:
            pass
        except OSError as e:
            if first is None:
                first = fail("unlink", path, e, f"removing a file of an older save; {_COMMITTED}")
                first.__cause__ = e
    if removed and sync:
        try:
            fsync_dir(dirpath)
        except OSError as e:
            raise fail("fsync", dirpath, e, f"flushing the directory after removing {removed} files of older "
                       f"saves (a power loss may bring them back); {_COMMITTED}") from e
    if first is not None:
        raise first


class BackgroundRemoval:
    """remove_files on a thread of its own: unlinking the previous checkpoint's
    data files (ext4 frees their extents on unlink, which takes a while for
    large files) leaves the save's critical path. The thread is not a
    daemon, so the interpreter finishes it before exiting; a failure is kept
    for join() and logged (the next save removes what is left). It runs
    without the directory's lock (a later save need not wait for it): its
    list was taken under the lock at commit, so it names only files older
    than that commit, which no later ckptio save reuses (new token, new
    temporary names); it reads the metadata again before deleting
    (remove_files' recheck) for writers that do reuse names."""

    def __init__(self, dirpath, names: List[str], sync: bool, committed: Optional[Committed] = None) -> None:
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(os.fspath(dirpath), names, sync, committed),
                                        name="ckptio-dcp-cleanup", daemon=False)
        self._thread.start()

    def _run(self, dirpath: str, names: List[str], sync: bool, committed: Optional[Committed]) -> None:
        try:
            remove_files(dirpath, names, sync, committed, recheck=True)
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
