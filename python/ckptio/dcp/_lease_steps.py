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
import re
from typing import List, Optional

from .. import _ckptio
from . import _lock, _objects

# A data file of one ckptio save: __{rank}_{token}_{n}.distcp
_DATA_NAME = re.compile(r"__\d+_([0-9a-f]{12})_\d+\.distcp\Z")
_log = logging.getLogger("ckptio.dcp")


class LeaseSteps:
    """The checks of one commit under `lock` (None: nothing to check)."""

    def __init__(self, lock: Optional[_lock.DirectoryLock]) -> None:
        self.lock = lock
        self.committed = False  # the .metadata is in place
        self._pending: Optional[_lock.PendingCheck] = None

    def on_step(self, step: int, done: bool) -> None:
        """Called around every step of the commit (_ckptio.DCP_STEP_*)."""
        if step == _ckptio.DCP_STEP_MANIFEST and not done:
            self._start()
        elif step == _ckptio.DCP_STEP_METADATA and not done:
            self._wait()
            self._start()
        elif step == _ckptio.DCP_STEP_METADATA:
            self.committed = True
        elif step == _ckptio.DCP_STEP_LIST:
            self._start() if not done else self._wait()  # a check runs already: that one

    def close(self) -> None:
        """Waits for a check still running (the commit failed before it was waited for)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - the commit failed first; its error is the one raised
                pass

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


def remove_own_objects(dirpath: str, files: List[str], engine=None) -> None:
    """A save that lost the lease before its .metadata: the objects it wrote
    (its token's data objects and manifest; no other save writes those names)
    go, so they do not wait for a later save's cleanup. Best effort: what is
    left is unreferenced, and a later cleanup removes it."""
    names = list(files)
    tokens = {m.group(1) for m in map(_DATA_NAME.match, files) if m}
    if len(tokens) == 1:
        names.append(f".ckptio-manifest-{tokens.pop()}.json")
    for name in names:
        try:
            _objects.remove(_objects.join(dirpath, name), engine)
        except Exception as e:  # noqa: BLE001 - logged; the commit's own error is raised
            _log.warning("%s: could not remove %s of this save, which lost the lease: %s", os.fspath(dirpath), name, e)
