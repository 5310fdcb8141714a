"""The lease checks of a DCP commit into object storage (docs/OBJECT_STORAGE.md 4.2).

There the directory's lock is a lease another save can take over once it
lapses (or, read back late, that another save wrote over): it is checked
before .metadata and before the cleanup removes older saves' objects, and a
save that lost it commits nothing more (raising from the commit's step
callback stops the commit). Each check's GET runs beside a PUT and is waited
for where it gates: the first beside the manifest's, before .metadata; the
second beside .metadata's (and libckptio's listing of the directory), once
the listing is done, before anything is removed. A save that lost the lease
before its .metadata removes what it wrote. A save without collectives holds
a mark instead of the lease (a cleanup keeps its objects): its checks read
the mark, and one that lapsed stops it before its __{rank}.metadata.
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional

from .. import _ckptio
from . import _lock, _objects

_log = logging.getLogger("ckptio.dcp")


class LeaseSteps:
    """The checks of one commit under `lock` (None: nothing to check)."""

    def __init__(self, lock: Optional[_lock.DirectoryLock]) -> None:
        self.lock = lock
        self.committed = False  # the .metadata is in place
        self.manifest: Optional[str] = None  # the manifest the commit writes (libckptio names it), once begun
        self._pending: Optional[_lock.PendingCheck] = None

    def on_step(self, step: int, path: str, done: bool) -> None:
        """Called around every step of the commit (_ckptio.DCP_STEP_*) with
        the file the step writes."""
        if step == _ckptio.DCP_STEP_MANIFEST and not done:
            self.manifest = path
            self._start()
        elif step == _ckptio.DCP_STEP_METADATA and not done:
            self._wait()
            self._start()
        elif step == _ckptio.DCP_STEP_METADATA:
            self.committed = True
        elif step == _ckptio.DCP_STEP_LIST:
            self._start() if not done else self._wait()  # a check runs already: that one
        elif step == _ckptio.DCP_STEP_REMOVE and not done:
            self._release_started()

    def close(self) -> None:
        """Waits for a check still running (the commit failed before it was waited for)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - the commit failed first; its error is the one raised
                pass

    def _release_started(self) -> None:
        """The lease is released beside the removal of older saves' objects, not after it: .metadata is in place
        and both checks passed, and the removal needs no lease any more, since it takes only objects older than
        this lease that no metadata object names (a save that takes the lease next writes newer ones). Its GET and
        DELETE add no round trips to the save: they end in the background (_lock.release_in_background), and this
        process's next save of the directory waits for them before it takes the lease."""
        if self.lock is not None and self.lock.held:
            _lock.release_in_background(self.lock)

    def _start(self) -> None:
        if self.lock is not None and self.lock.held and self._pending is None:
            self._pending = self.lock.check_started()

    def _wait(self) -> None:
        """The check started beside the step before, else one now."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
        elif self.lock is not None:
            self.lock.check()


def remove_own_objects(dirpath: str, files: List[str], engine=None, manifest: Optional[str] = None) -> None:
    """A save that lost the lease before its .metadata: the objects it wrote
    (its token's data objects and `manifest`, the path the commit's step
    callback named; no other save writes those names) go, so they do not
    wait for a later save's cleanup. Best effort: what is left is
    unreferenced, and a later cleanup removes it."""
    paths = [_objects.join(dirpath, name) for name in files] + ([manifest] if manifest else [])
    for path in paths:
        try:
            _objects.remove(path, engine)
        except Exception as e:  # noqa: BLE001 - logged; the commit's own error is raised
            _log.warning("%s: could not remove %s of this save, which lost the lease: %s", os.fspath(dirpath), path, e)
