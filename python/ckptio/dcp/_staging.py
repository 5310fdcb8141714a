"""Staging of ckptio.dcp saves (torch's AsyncStager hooks): stage() copies
the state dict into host memory (a ckptio snapshot, or as torch does), and
an in-flight mark keeps a later stage() from reusing staged memory that a
save is still writing."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, List, Optional

import torch
from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE

from .. import _snapshot
from . import _lock

_log = logging.getLogger("ckptio.dcp")


def _record_copy_events(state_dict: Any) -> List[Any]:
    """One CUDA event on the current stream of every device holding a tensor of state_dict."""
    devices = set()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            if v.device.type == "cuda":
                devices.add(v.device.index if v.device.index is not None else torch.cuda.current_device())
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(state_dict)
    events = []
    for d in sorted(devices):
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(d))
        events.append(ev)
    return events


class AsyncStaging:
    """The staging half of FileSystemWriter (mixed into it). Uses the
    writer's options (async_busy, non_blocking_stage, cache_staged_state_dict,
    the snapshots option) and path."""

    def _init_staging(self) -> None:
        self._staged_events: List[Any] = []
        self._snapshot: Optional[_snapshot.Snapshot] = None  # the staged state of the save in flight
        # In-flight tracking of async saves (see stage()): the generation
        # stage() marked (0: none), the one the running save claimed in reset(),
        # and the thread running the marked save.
        self._inflight = 0
        self._inflight_cv = threading.Condition()
        self._generation = 0
        self._save_gen = 0
        self._save_thread: Optional[threading.Thread] = None
        self._handed_off = False

    # dcp.async_save calls synchronize_staging() right after it handed the
    # staged data to its executor: from then on the save runs elsewhere.
    _synchronize_after_execute = True

    def synchronize_staging(self) -> None:
        with self._inflight_cv:
            self._handed_off = True

    def stage(self, state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
        """Copies the state dict into host staging memory: by default a
        snapshot (``snapshots``: GPU tensors copied on ckptio's own stream
        into the reused pinned pool while training goes on, host tensors and
        other values during the call); with ``snapshots=False`` as torch does
        (pinned when CUDA is available, reused with cache_staged_state_dict,
        the copies queued on each device's current stream with
        non_blocking_stage). While the staged data of an earlier save is still
        being written, this waits or raises (``async_busy``)."""
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        with self._inflight_cv:
            if self._busy_locked():
                if self.async_busy == "error":
                    raise RuntimeError(
                        f"ckptio.dcp.FileSystemWriter({os.fspath(self.path)!r}): an earlier save of this writer is "
                        "still writing its staged data; wait for its future first, or create the writer with "
                        "async_busy='wait'")
                while self._busy_locked():
                    self._inflight_cv.wait(0.05)  # also polls for a save that died in torch's code
            self._generation += 1
            self._inflight = self._generation
            self._save_thread = threading.current_thread()  # until reset() of the save claims it
            self._handed_off = False
        try:
            self.per_thread_copy_ahead = 0  # as torch: staged data is already on the host
            snapshots = self._resolve_snapshots()
            if snapshots is not None:
                try:
                    self._snapshot = snapshots.take(state_dict)
                    return self._snapshot.state_dict
                except _snapshot.SnapshotUnsupported as e:
                    _log.info("%s: staged as torch does: %s", os.fspath(self.path), e)
            pin = torch.cuda.is_available()
            if not self.cache_staged_state_dict:
                target = _create_cpu_state_dict(state_dict, pin_memory=pin)
            else:
                if self.state_dict_cache is None:
                    self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=pin)
                target = self.state_dict_cache
            # Device-to-host copies into pinned memory are only enqueued on each
            # device's current stream: the caller returns to training at once,
            # and the kernels it launches next on that stream run after the
            # copies (values at save time). The background write waits for the
            # copies' events (_wait_staged) before touching the bytes.
            # Non-tensor values (numpy arrays, scalars, ...) are deep-copied, as
            # torch's own stager does: not every value DCP saves is a tensor.
            staged = _copy_state_dict(state_dict, target, non_blocking=self.non_blocking_stage and pin,
                                      type_check=False)
            self._staged_events = _record_copy_events(state_dict) if self.non_blocking_stage and pin else []
            return staged
        except BaseException:
            self._release_staging()
            raise

    def _resolve_snapshots(self) -> Optional["_snapshot.Snapshots"]:
        option = self._snapshots_option
        if option is True:
            return _snapshot.shared()
        return option if isinstance(option, _snapshot.Snapshots) else None

    def prepare(self, state_dict: STATE_DICT_TYPE) -> None:
        """Sizes the snapshot pool for state_dict and starts pinning it in the
        background, so that the first ``dcp.async_save`` does not wait for it
        (with ``snapshots=False``: nothing)."""
        snapshots = self._resolve_snapshots()
        if snapshots is not None:
            snapshots.prepare(state_dict)

    def _wait_staged(self) -> None:
        events, self._staged_events = self._staged_events, []
        for ev in events:
            ev.synchronize()
        snap = self._snapshot
        if snap is not None:
            snap.wait()

    def _drop_snapshot(self) -> None:
        """The save in flight is over: its snapshot's pool takes the next one."""
        snap, self._snapshot = self._snapshot, None
        if snap is not None:
            snap.release()

    def _release_staging(self) -> None:
        """Ends the in-flight mark of the running save (a save that stage() did
        not mark, e.g. a plain dcp.save, leaves another save's mark alone)."""
        with self._inflight_cv:
            if self._inflight and self._save_gen in (self._inflight, 0):
                self._inflight = 0
                self._save_gen = 0
                self._drop_snapshot()
                self._inflight_cv.notify_all()

    def _busy_locked(self) -> bool:
        """True while the marked save may still use its staged data. A save
        that failed in torch's own code between this writer's hooks (a peer's
        failure in a collective, the planner raising) never calls them again:
        it is over once the thread running it has left torch.distributed.checkpoint
        (or is the caller's own thread, or is gone), and its mark is dropped."""
        if not self._inflight:
            return False
        if self._save_gen != self._inflight and self._handed_off:
            return True  # queued in dcp.async_save's executor, reset() not reached yet
        t = self._save_thread
        ended = t is None or t is threading.current_thread() or not _lock.in_dcp_code(t)
        if ended:
            self._inflight = 0
            self._save_gen = 0
            self._drop_snapshot()
            self._inflight_cv.notify_all()
        return not ended

    def wait_staging(self, timeout: Optional[float] = None) -> bool:
        """Blocks until no save of this writer is writing staged data; False on timeout."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        with self._inflight_cv:
            while self._busy_locked():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._inflight_cv.wait(0.05 if left is None else min(0.05, left))
            return True
