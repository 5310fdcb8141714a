"""CheckpointManager's async save in one process, from a snapshot (docs/MANAGER.md, docs/SNAPSHOTS.md).

The caller's thread takes the root's lock and begins the step as before (steps 1-2 of docs/MANAGER.md: a
step that exists is refused there), then only takes the snapshot (ckptio.Snapshots.take: the GPU copies
queued on ckptio's own stream, host values copied). The DCP save of the host copy, the commit marker and
retention (steps 3-6) run on the manager's save thread, one save after the other (dcp.async_save would start
a thread per save on the caller's). With several ranks the manager keeps
dcp.async_save, whose collectives every rank runs on the manager's save group.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Optional

from . import _ckptio
from ._snapshot import SnapshotUnsupported


def release_lock(lock) -> None:
    """Releases the root's lock a save holds (None: none is held). Here, below the manager, so that both
    the manager and the saves it starts here release it the same way."""
    if lock is not None:
        _ckptio.dcp_lock_release(lock)


class _SaveThread:
    """One daemon thread running the manager's saves in order (a thread per save cost its start on the
    caller's thread)."""

    def __init__(self, name: str) -> None:
        self._jobs: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def submit(self, job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        self._jobs.put(None)


def save(mgr, step: int, state_dict: Any, writer, lock) -> Optional[concurrent.futures.Future]:
    """Saves `step` of a one-process manager from a snapshot, the step begun and the root's `lock` held
    (released when the save ends, or here on a failure to start it); None when the state cannot be snapshot
    (the manager then stages it as torch does, the lock still its own)."""
    try:
        snap = mgr._snapshots.take(state_dict)
    except SnapshotUnsupported:
        return None
    except BaseException:
        release_lock(lock)
        raise
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        import torch.distributed.checkpoint as dcp

        held = lock
        try:
            snap.wait()
            dcp.save(snap.state_dict, storage_writer=writer, no_dist=True)
            snap.release()  # written: the next snapshot may take the pool while this step commits
            held = None
            mgr._finish(step, lock)  # releases the lock, whatever happens
            done.set_result(step)
        except BaseException as e:  # noqa: BLE001 - the future carries it
            release_lock(held)
            done.set_exception(e)
        finally:
            snap.release()

    worker = getattr(mgr, "_save_thread", None)
    if worker is None:
        worker = mgr._save_thread = _SaveThread(f"ckptio-manager-{mgr.root}")
    worker.submit(run)
    return done
