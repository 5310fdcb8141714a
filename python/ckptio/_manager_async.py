"""CheckpointManager's async save in one process, from a snapshot (docs/MANAGER.md, docs/SNAPSHOTS.md), and
what happens to a manager's save in flight when the process exits.

The caller's thread only takes the snapshot (ckptio.Snapshots.take: the GPU copies queued on ckptio's own
stream, host values copied): what must happen before the training step may go on. The root's lock, the
step's begin (its directory, begun mark and fsyncs), the DCP save of the host copy, the commit marker and
retention (steps 1-6 of docs/MANAGER.md) run on the manager's save thread, one save after the other
(dcp.async_save would start a thread per save on the caller's). The save's Future resolves at the commit;
retention follows on the thread. With several ranks the manager keeps dcp.async_save, whose collectives
every rank runs on the manager's save group.

At exit a save in flight is finished, not abandoned (_finish_at_exit): the checkpoint asked for lands.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import queue
import threading
import weakref
from typing import Any, Optional, Tuple

from . import _ckptio
from ._snapshot import SnapshotUnsupported

_log = logging.getLogger("ckptio.manager")


def release_lock(lock) -> None:
    """Releases the root's lock a save holds (None: none is held). Here, below the manager, so that both
    the manager and the saves it starts here release it the same way."""
    if lock is not None:
        _ckptio.dcp_lock_release(lock)


def failed(done: concurrent.futures.Future, finished: concurrent.futures.Future, error: BaseException) -> None:
    """A save failed: its Future (unless already resolved at the commit: retention failed) and the manager's
    record of the save in flight carry the error. A failed retention is logged too: the next save may have
    started without waiting for it."""
    if done.done():
        _log.error("step %s is committed, but applying retention after it failed: %s", done.result(), error)
        finished.set_exception(error)
    else:  # finished first: whoever sees the Future failed finds the save in flight ended
        finished.set_exception(error)
        done.set_exception(error)


class _SaveThread:
    """One daemon thread running the manager's saves in order (a thread per save cost its start on the
    caller's thread). A job drops every tensor it holds before it resolves its futures, and stop() joins the
    thread: once a manager is closed no thread of its runs Python or holds a torch object, which a thread
    must not do while the interpreter finalizes (it is stopped where it stands: inside torch's C++
    destructors that is std::terminate)."""

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
            job = None

    def submit(self, job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """Ends the thread after the jobs queued before, and waits for it (unless called from it: a callback
        of a save's Future)."""
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()


def save(mgr, step: int, state_dict: Any, begun: bool = False,
         lock=None) -> Optional[Tuple[concurrent.futures.Future, concurrent.futures.Future]]:
    """Saves step `step` of a one-process manager from a snapshot: (done, finished), done resolving to
    `step` at the commit and finished once retention ran too (the manager's save in flight). The step is
    begun on the save thread, unless `begun` (on the caller's, holding the root's `lock`, released when the
    save ends or here on a failure to start it). None when the state cannot be snapshot (the manager then
    saves it as torch stages it, the lock still its own)."""
    try:
        snap = mgr._snapshots.take(state_dict)
    except SnapshotUnsupported:
        return None
    except BaseException:
        release_lock(lock)
        raise
    done: concurrent.futures.Future = concurrent.futures.Future()
    finished: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        import torch.distributed.checkpoint as dcp

        nonlocal snap, lock
        try:
            if not begun:
                lock = mgr._begin(step)
            writer = mgr._writer(mgr.step_dir(step))
            snap.wait()
            dcp.save(snap.state_dict, storage_writer=writer, no_dist=True)
            del writer
            snap.release()  # written: the next snapshot may take the pool while this step commits
            snap = None  # its tensors dropped here, before anything waiting for this save wakes up
            held, lock = lock, None
            mgr._finish(step, held, lambda: done.set_result(step))  # releases the lock, whatever happens
            finished.set_result(step)
        except BaseException as e:  # noqa: BLE001 - the futures carry it
            release_lock(lock)
            if snap is not None:
                snap.release()
                snap = None
            failed(done, finished, e)

    worker = getattr(mgr, "_save_thread", None)
    if worker is None:
        worker = mgr._save_thread = _SaveThread(f"ckptio-manager-{mgr.root}")
    track(mgr)
    worker.submit(run)
    return done, finished


# ---- exit ------------------------------------------------------------------------------------------------

_tracked: "weakref.WeakSet[Any]" = weakref.WeakSet()
_tracked_lock = threading.Lock()
_registered = False


def track(mgr) -> None:
    """Has the process finish `mgr`'s save in flight when it exits. Registered at the first async save, after
    torch's own exit handlers (atexit runs the last registered first), so the save runs with torch intact."""
    global _registered
    with _tracked_lock:
        _tracked.add(mgr)
        if not _registered:
            atexit.register(_finish_at_exit)
            _registered = True


def _finish_at_exit() -> None:
    """At interpreter exit, before Python stops its daemon threads (atexit runs while the interpreter is whole):
    every manager's save in flight is written, committed and its retention applied, and the manager's save
    thread ends. A job that exits right after save() gets the step it asked for, complete, and no thread of
    ckptio's touches torch while the interpreter finalizes. Local only: no collective (other ranks may be
    gone)."""
    for mgr in list(_tracked):
        pending = mgr._pending
        if pending is not None:
            if not pending.done():
                _log.info("%s: finishing step %s's save before the process exits", mgr.root, mgr._pending_step)
            concurrent.futures.wait([pending])
            error = pending.exception()
            if error is not None:
                _log.error("%s: step %s's save failed: %s", mgr.root, mgr._pending_step, error)
        worker = getattr(mgr, "_save_thread", None)
        if worker is not None:
            worker.stop()
