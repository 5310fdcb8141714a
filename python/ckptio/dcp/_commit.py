"""The directory commit of a DCP save, as libckptio runs it
(include/ckptio/dcp.h "DCP directory commit", src/ckpt/dcp_*.c): the attributes
new files take, the data files' placeholders, then the commit in one call
(ckptio_dcp_commit: the manifest, .metadata atomically, the removal of what
older saves left behind: only what no metadata file references and no live
writer holds).

Every failure is a CkptioError naming the operation ("open", "write",
"fsync", "rename", "listdir", "unlink"), the file or directory, the errno,
and what it means for the checkpoint (unchanged, or new and in place).
What stays here is what only Python has: the background removal's thread
and the logging of what the C steps report."""

from __future__ import annotations

import logging
import os
import threading
from typing import Iterable, List, Optional, Set

from .. import _ckptio


def reference_stat(dirpath, name: str) -> Optional[str]:
    """The reference of a save into `dirpath`: `name` (the metadata file the
    save replaces) when it is a regular file whose attributes the save's
    new files take; None for a new checkpoint (then files are created as
    any new file, 0666 & ~umask)."""
    return name if _ckptio.dcp_reference(os.fspath(dirpath), name) is not None else None


def create_placeholder(dirpath, name: str, reference: Optional[str]) -> None:
    """Creates the empty file dirpath/name (a data file's final name, new
    to this save) with the reference's attributes, so that the atomic save
    of libckptio that replaces it gives its temporary the same ones. A crash
    leaves an empty unreferenced data file that the next save removes."""
    _ckptio.dcp_create_file(os.fspath(dirpath), name, reference)


def _create_temporary(dirpath: str, name: str, final: str, reference: Optional[str] = None):
    """Creates and locks dirpath/.NAME.ckptio-tmp-XXXXXX; returns (fd, path).
    Named and locked as libckptio's own temporaries, so cleaners recognise
    it and never remove it while fd is open. `final` is dirpath/name."""
    return _ckptio.dcp_temporary_create(os.fspath(dirpath), name, reference)


def commit(dirpath, metadata_name: str, metadata: bytes, files: Iterable[str], items, sync: bool,
           cleanup: Optional[str], on_step=None, data_files=None, engine=None) -> Optional[List[str]]:
    """Commits a save whose data files are committed, under the directory's
    lock, in one libckptio call: the checksum manifest of `items` (None:
    none), `metadata_name` replaced atomically by `metadata` (the new
    checkpoint is current from then on), and with `cleanup` "now" the files
    of older saves removed, with "later" only listed: the list is returned
    (None otherwise) for a BackgroundRemoval. `on_step(step, path, done)`
    runs around every step (_ckptio.DCP_STEP_*); raising in it stops the
    commit there and the exception propagates. `data_files`: this process's
    data Files, handed over by commit_unreferenced with sync_later: the
    commit fsyncs them with the manifest and the metadata, or completes
    their uploads beside the manifest's PUT (the caller closes them).
    `engine`: theirs, for objects: Ctrl-C stops the wait for their uploads."""
    mode = {None: 0, "now": 1, "later": 2}[cleanup]
    stale, _, note = _ckptio.dcp_commit(os.fspath(dirpath), metadata_name, bytes(metadata), sorted(files), items,
                                        bool(sync), mode, on_step, data_files, engine)
    _warn(note)
    return stale


class Committed:
    """What a save just committed: its metadata file's name and bytes and
    the data files they reference. Lets the cleanup read the directory's
    current metadata without unpickling it again when it is still this
    save's."""

    def __init__(self, name: str, data: bytes, files: Set[str]) -> None:
        self.name, self.data, self.files = name, data, set(files)

    def native(self):
        return (self.name, bytes(self.data), sorted(self.files))


def _native(committed: Optional[Committed]):
    return committed.native() if committed is not None else None


def _warn(note: Optional[str]) -> None:
    if note:
        logging.getLogger("ckptio.dcp").warning("%s", note)


def stale_files(dirpath, keep: Set[str], committed: Optional[Committed] = None) -> List[str]:
    """Names of data files, manifests and temporaries of older saves in
    dirpath (anything a DCP writer names that is not in `keep` and that no
    metadata file in the directory references now), listed now: files
    created later (by the next save) are never among them. A metadata file
    that cannot be read keeps everything it might reference (logged)."""
    names, note = _ckptio.dcp_stale_files(os.fspath(dirpath), sorted(keep), _native(committed))
    _warn(note)
    return names


def remove_files(dirpath, names: List[str], sync: bool, committed: Optional[Committed] = None,
                 recheck: bool = False) -> None:
    """Unlinks dirpath/name for each name (a temporary only when no live
    writer holds it), then (with sync, when something was removed) fsyncs
    the directory. With `recheck` (a list taken earlier, by the background
    cleanup) whatever the directory's metadata files reference now is kept.
    The first failure is raised; it says the new checkpoint is committed."""
    _, note = _ckptio.dcp_remove_files(os.fspath(dirpath), list(names), bool(sync), bool(recheck),
                                       _native(committed))
    _warn(note)


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
