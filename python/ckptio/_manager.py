"""ckptio.CheckpointManager: the steps of a training run under one root,
resumed from the newest step that verifies (docs/MANAGER.md).

Thin over libckptio's steps (include/ckptio/steps.h): which
steps exist and in what state, the commit marker that makes a step
complete, retention and cleaning are C (src/ckpt/steps_*.c); each step's
data is one ckptio.dcp checkpoint directory. What stays here is the order of
the calls and, with torch.distributed, the agreement between ranks: rank 0
takes the root's lock (in turn, so two managers on one root alternate),
starts the step, commits its marker once every rank's data and .metadata are
committed (the DCP writer's coordinator commit ends before the save returns),
applies retention, picks the step to load and pins it while it is read;
every other rank follows its decision, and an error on any rank is raised on
all.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from typing import Any, List, Optional, Tuple

# torch is imported where it is used: `import ckptio` (and with it the `ckptio` command, whose console
# script imports the package) must not pay torch's import time.
from . import _ckptio
from ._ckptio import Engine
from . import _manager_async
from ._errors import CkptioError, make_error
from ._snapshot import Snapshots

_log = logging.getLogger("ckptio.manager")

_CHECKS = ("full", "fast", "marker")
_BUSY = ("wait", "skip", "error")
# How often load takes another step when the one it reads goes away.
_LOAD_ATTEMPTS = 5


class SkippedSave:
    """What the Future of a ``CheckpointManager.save`` resolves to when
    ``async_busy="skip"`` did not start it: step ``step`` was not saved
    because the save of step ``writing`` was still in flight. Nothing of
    ``step`` was written and retention did not run for it."""

    __slots__ = ("step", "writing")

    def __init__(self, step: int, writing: Optional[int]) -> None:
        self.step = step
        self.writing = writing

    def __repr__(self) -> str:
        return f"SkippedSave(step={self.step}, writing={self.writing})"

    def __str__(self) -> str:
        return f"skipped: step {self.writing}'s save was still writing; step {self.step} was not saved"


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


class CheckpointManager:
    """Saves one checkpoint per step under ``root`` and resumes from the
    newest one that verifies.

    * ``keep_last``: keep the newest K complete steps (None: all); older ones
      are removed after a newer step is committed, never the newest step that
      passes the fast check.
    * ``keep_every``: also keep every step that is a multiple of N.
    * ``async_save`` (default True): ``save`` snapshots the state into a
      pinned pool of the manager's (``ckptio.Snapshots``: copied on ckptio's
      own stream while training goes on; ``prepare``/``load`` pin it ahead)
      and returns; the data is written on a thread, the step committed after
      it. ``writer_options={"snapshots": False}`` stages as torch does.
    * ``async_busy``: what a ``save`` does while the previous save is still
      in flight (writing, committing, applying retention): ``"wait"``
      (default) waits for it, so every step asked for is saved;
      ``"skip"`` never waits: the step is not saved, its Future resolves at
      once to a :class:`ckptio.SkippedSave` and a WARNING line says so (the
      next ``save`` after the write completes proceeds); ``"error"`` raises
      RuntimeError. ``save(..., async_busy=...)`` overrides it for one call
      (e.g. ``"wait"`` for the last save of a run).
    * ``check``: how ``load(step=None)`` checks the steps it considers,
      newest first: ``"full"`` (every byte against its XXH3-64; default),
      ``"fast"`` (structure and sizes) or ``"marker"``.
    * ``process_group``: with torch.distributed, the group whose ranks save
      and load together (default: the default group). Async saves run their
      collectives on a gloo group of their own, created here (a collective:
      every rank constructs the manager).
    * ``engine``: a :class:`ckptio.Engine` for the writes, reads and checks
      (default: a private one with ``sync`` on).
    * ``writer_options``: more keyword arguments for
      :class:`ckptio.dcp.FileSystemWriter` (e.g. ``checksums``, ``_extensions``).

    Collective calls (every rank calls them at the same point): ``save``,
    ``wait``, ``load``, ``latest_step``, ``all_steps``, ``close``.
    """

    def __init__(self, root, keep_last: Optional[int] = None, keep_every: Optional[int] = None,
                 async_save: bool = True, *, async_busy: str = "wait", check: str = "full",
                 process_group=None, engine: Optional[Engine] = None, writer_options: Optional[dict] = None) -> None:
        for name, value in (("keep_last", keep_last), ("keep_every", keep_every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or an int >= 1, not {value!r}")
        _check_busy(async_busy)
        if check not in _CHECKS:
            raise ValueError(f"check must be one of {_CHECKS}, not {check!r}")
        self.root = os.fspath(root)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.async_save = async_save
        self.async_busy = async_busy
        self.check = check
        self.engine = engine if engine is not None else Engine(sync=1)
        self.writer_options = dict(writer_options or {})
        dist = _dist()
        self._dist = dist if dist is not None and dist.get_world_size(process_group) > 1 else None
        self._group = process_group
        self._rank = dist.get_rank(process_group) if self._dist else 0
        self._save_group = process_group
        if self._dist is not None and async_save:
            # The background save's collectives must not meet the caller's
            # on one group (torch's advice for dcp.async_save).
            self._save_group = self._dist.new_group(ranks=self._dist.get_process_group_ranks(process_group)
                                                    if process_group is not None else None, backend="gloo")
        self._pending: Optional[concurrent.futures.Future] = None  # the save in flight, retention included
        self._saving: Optional[concurrent.futures.Future] = None  # its Future: in flight until the commit
        self._pending_step: Optional[int] = None
        self._closed = False
        # Async saves snapshot the state into a pinned pool of the manager's (docs/SNAPSHOTS.md), freed by close().
        self._snapshots = Snapshots() if async_save and self.writer_options.get("snapshots", True) is True else None
        # A job killed between a step's commit and its retention left one
        # step too many: a restarted job starts from a root within bounds.
        self._decide(self._retain_existing, "CheckpointManager")

    def _retain_existing(self) -> None:
        if (self.keep_last is None and self.keep_every is None) or not _is_dir(self.root):
            return
        lock = _lock(self.root)
        try:
            _ckptio.steps_retain(self.root, self.keep_last or 0, self.keep_every or 0, engine=self.engine)
        finally:
            _release(lock)

    # ---- agreement between ranks -------------------------------------------------------------

    def _agree(self, error: Optional[BaseException], what: str) -> None:
        """Raises `error` here, and with several ranks the same error on
        every rank when any rank failed (a collective)."""
        if self._dist is None:
            if error is not None:
                raise error
            return
        import torch

        from ._group_read import check_status

        check_status(self._group, torch.device("cpu"), error, what)

    def _decide(self, fn, what: str) -> Any:
        """Runs fn() on rank 0 and gives its result to every rank (errors raised everywhere)."""
        result, error = None, None
        if self._rank == 0:
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001 - handed to every rank
                error = e
        self._agree(error, what)
        if self._dist is not None:
            box = [result]
            self._dist.broadcast_object_list(box, src=self._dist.get_global_rank(self._group, 0)
                                             if self._group is not None else 0, group=self._group)
            result = box[0]
        return result

    # ---- steps -------------------------------------------------------------------------------

    def step_dir(self, step: int) -> str:
        """The directory of `step` under the root."""
        return os.path.join(self.root, _ckptio.steps_dir_name(step))

    def all_steps(self) -> List[int]:
        """Sorted step numbers of the complete (committed) steps."""
        return self._decide(lambda: [s[0] for s in _ckptio.steps_scan(self.root) if s[1] == "complete"],
                            "CheckpointManager.all_steps")

    def latest_step(self) -> Optional[int]:
        """The newest committed step (its marker read, its data not checked;
        ``load(step=None)`` checks), or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    # ---- saving ------------------------------------------------------------------------------

    def save(self, step: int, state_dict, *, async_busy: Optional[str] = None) -> concurrent.futures.Future:
        """Saves `state_dict` as step `step` (a collective with several
        ranks). Returns a Future that resolves to `step` once the step is
        committed and retention applied (already done without async_save),
        or to a :class:`SkippedSave` when ``async_busy="skip"`` did not start
        it; its failure is also raised by the next ``save`` or ``wait``.
        ``async_busy`` overrides the manager's for this call."""
        if self._closed:
            raise RuntimeError("CheckpointManager is closed")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, not {step!r}")
        busy = self.async_busy if async_busy is None else _check_busy(async_busy)
        saving = self._saving
        running = saving is not None and not saving.done()
        if self._dist is not None and busy != "wait":
            running = self._any_rank(running)  # every rank skips (or raises) together
        if running and busy == "error":
            raise RuntimeError(f"{self.root}: the save of an earlier step is still in flight; call wait() or "
                               "create the manager with async_busy='wait'")
        if running and busy == "skip":
            skipped = SkippedSave(step, self._pending_step)
            _log.warning("%s: %s (async_busy='skip')", self.root, skipped)
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(skipped)
            return done
        if running and _log.isEnabledFor(logging.INFO):
            _log.info("%s: save(step %d) waits for step %s's save, still in flight (async_busy='wait'; "
                      "'skip' never waits)", self.root, step, self._pending_step)
        if self.async_save and self._snapshots is not None and self._dist is None:
            self._wait_committed()
        else:
            self.wait()
        self._pending_step = step
        lock = None
        error = None
        try:  # a value the reader would refuse fails the save here, before the root is touched
            from .dcp import _byte_items

            state_dict = _byte_items.plain_state_dict(state_dict)  # Stateful values: state_dict() once
            _byte_items.check_state_dict(state_dict, f"CheckpointManager({self.root!r}).save(step {step})")
        except Exception as e:  # noqa: BLE001 - handed to every rank
            error = e
        self._agree(error, f"CheckpointManager.save(step {step})")
        snapshot = self.async_save and self._snapshots is not None and self._dist is None
        if snapshot and not _is_dir(self.step_dir(step)):
            # One process, a new step: only the snapshot on this thread; the root's lock, the step's begin,
            # the write, the commit and retention on the manager's save thread. A step directory that exists
            # is begun here instead, so that a step saved before is refused by this call.
            started = _manager_async.save(self, step, state_dict)
            if started is not None:
                self._saving, self._pending = started
                return self._saving
            snapshot = False  # a state the snapshot cannot copy: staged as torch does
        if self._rank == 0:
            try:
                lock = self._begin(step)
            except Exception as e:  # noqa: BLE001 - handed to every rank
                error = e
        try:
            self._agree(error, f"CheckpointManager.save(step {step})")  # also: no rank writes before the mkdir
        except BaseException:
            _release(lock)
            raise
        import torch.distributed.checkpoint as dcp

        if snapshot:
            started = _manager_async.save(self, step, state_dict, begun=True, lock=lock)
            if started is not None:
                self._saving, self._pending = started
                return self._saving
        kwargs = {"storage_writer": self._writer(self.step_dir(step)),
                  "process_group": self._save_group if self._dist else None, "no_dist": self._dist is None}
        done: concurrent.futures.Future = concurrent.futures.Future()
        finished: concurrent.futures.Future = concurrent.futures.Future()  # retention included
        if not self.async_save:
            try:
                dcp.save(state_dict, **kwargs)
                self._finish(step, lock, lambda: done.set_result(step))
                finished.set_result(step)
            except BaseException as e:
                _release(lock)
                _manager_async.failed(done, finished, e)
            self._saving, self._pending = done, finished
            self.wait()
            return done
        try:
            saving = dcp.async_save(state_dict, **kwargs)
        except BaseException:
            _release(lock)
            raise
        if not isinstance(saving, concurrent.futures.Future):  # an AsyncSaveResponse
            saving = saving.upload_completion

        def complete(f: concurrent.futures.Future) -> None:
            try:
                f.result()
                self._finish(step, lock, lambda: done.set_result(step))
                finished.set_result(step)
            except BaseException as e:  # noqa: BLE001 - the futures carry it
                _release(lock)
                _manager_async.failed(done, finished, e)

        threading.Thread(target=lambda: complete(saving), name=f"ckptio-manager-step-{step}", daemon=True).start()
        _manager_async.track(self)
        self._saving, self._pending = done, finished
        return done

    def _any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank of the group (a collective)."""
        import torch

        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self._group)
        return bool(t.item())

    def _begin(self, step: int):
        """Rank 0, steps 1-2 of a save: the root's lock taken, a damaged step of this number removed, the
        step begun. Returns the lock (released here on a failure)."""
        lock = _lock(_ensure_root(self.root))
        try:
            self._replace_if_damaged(step)
            _ckptio.steps_begin(self.root, step)
        except BaseException:
            _release(lock)
            raise
        return lock

    def _replace_if_damaged(self, step: int) -> None:
        """A job that resumed from an older step past a damaged one saves
        that step number again: the damaged step goes (a complete one is
        never replaced: steps_begin refuses it)."""
        if not _is_dir(self.step_dir(step)):
            return
        info = _ckptio.steps_check(self.root, step, self.check, engine=self.engine)
        if info[1] == "damaged":
            _log.warning("%s: replacing damaged step %d: %s", self.root, step, info[4])
            _ckptio.steps_remove(self.root, step)

    def _writer(self, step_dir: str):
        from .dcp import FileSystemWriter

        # Files written side by side: the kernel lets one writer into a tmpfs file at a time (docs/ENGINE.md).
        options = {"sync_files": True, "engine": self.engine, "thread_count": min(8, os.cpu_count() or 1)}
        if self._snapshots is not None:
            options["snapshots"] = self._snapshots
        options.update(self.writer_options)
        return FileSystemWriter(step_dir, **options)

    def _finish(self, step: int, lock, committed) -> None:
        """Rank 0, once the step's DCP save returned (every rank's files
        and .metadata committed): the marker, then committed() (the save's
        Future resolves), then retention; then the root's lock goes. Other
        ranks: committed()."""
        if self._rank != 0:
            committed()
            return
        try:
            _ckptio.steps_commit(self.root, step)
            committed()
            if self.keep_last is not None or self.keep_every is not None:
                removed = _ckptio.steps_retain(self.root, self.keep_last or 0, self.keep_every or 0,
                                               engine=self.engine)
                if removed:
                    _log.info("%s: retention removed step(s) %s", self.root, removed)
        finally:
            _release(lock)

    def prepare(self, state_dict) -> None:
        """Sizes the async saves' snapshot pool for state_dict and pins it in
        the background, so that the first save does not wait for it (``load``
        does this with the state it loads into)."""
        from .dcp import _byte_items  # noqa: F401 - torch's DCP imported now, not in the first save's call

        if self._snapshots is not None:
            self._snapshots.prepare(state_dict)

    def _wait_committed(self) -> None:
        """One process: waits for the save in flight until its commit and raises its failure. Its retention,
        if still running, is left to finish on the save thread, before the next save there (a failure of it
        is logged there, and raised by wait() if it gets to it first)."""
        saving, pending = self._saving, self._pending
        if saving is not None:
            concurrent.futures.wait([saving])
        if pending is not None and pending.done():
            self.wait()

    def wait(self) -> None:
        """Waits until the save in flight (if any) is committed and its
        retention applied; raises its error (with several ranks: a
        collective, the error raised on all)."""
        pending, error = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except BaseException as e:  # noqa: BLE001
                error = e
            self._pending = None
        if self._dist is not None and pending is not None:
            self._agree(error, "CheckpointManager.wait")
        elif error is not None:
            raise error

    # ---- loading -----------------------------------------------------------------------------

    def load(self, state_dict, step: Optional[int] = None, *, check: Optional[str] = None) -> Optional[int]:
        """Loads step `step` into `state_dict` in place (torch DCP's load);
        None: the newest step that passes `check` (default: the manager's),
        logging one line for each newer step skipped and why. Returns the
        step loaded, or None when there is none to load.

        The step is pinned while it is read (retention elsewhere leaves it
        for later). A step that goes away all the same (removed by something
        that ignores pins) is replaced by the newest step left, up to five
        times; a `step` asked for raises CkptioError naming it. A step the
        manager did not write (foreign) is loaded only when asked for."""
        check = self.check if check is None else check
        if check not in _CHECKS:
            raise ValueError(f"check must be one of {_CHECKS}, not {check!r}")
        self.wait()
        pin: List[Any] = [None]  # rank 0's pin on the step being read
        logged: set = set()

        def pick() -> Optional[Tuple[int, bool]]:
            """(step, marked): the step to read, pinned; marked: it holds the manager's marker."""
            if step is not None:
                return self._pick_named(step, check, pin)
            for _ in range(_LOAD_ATTEMPTS):
                chosen, skipped = _ckptio.steps_latest(self.root, check, engine=self.engine)
                for s, state, _, _, reason, _ in skipped:
                    if (s, state) not in logged:
                        logged.add((s, state))
                        _log.warning("%s: skipping step %d (%s): %s", self.root, s, state, reason)
                if chosen is None:
                    return None
                pin[0] = _ckptio.steps_pin(self.root, chosen)
                if pin[0] is not None:
                    return chosen, True
                _log.warning("%s: step %d was removed before it could be read; taking the newest step left",
                             self.root, chosen)
            raise make_error(_ckptio.E_BUSY, "E_BUSY", 0, 0, "load", self.root, -1, None,
                             f"{self.root}: the chosen step was removed before it could be read, "
                             f"{_LOAD_ATTEMPTS} times", None)

        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        from .dcp import FileSystemReader

        failures = (Exception, CheckpointException)  # torch's is a BaseException
        for _ in range(_LOAD_ATTEMPTS):
            picked = self._decide(pick, "CheckpointManager.load")
            if picked is None:
                self.prepare(state_dict)  # the async saves' pool, pinned in the background for this state
                return None
            chosen, marked = picked
            error = None
            try:
                dcp.load(state_dict, storage_reader=FileSystemReader(self.step_dir(chosen), engine=self.engine),
                         process_group=self._group, no_dist=self._dist is None)
            except failures as e:  # noqa: BLE001 - agreed below
                error = e
            try:
                self._agree(error, f"CheckpointManager.load(step {chosen})")
                self.prepare(state_dict)
                return chosen
            except failures as failed:  # noqa: BLE001 - raised below unless the step went away
                if self._rank == 0 and pin[0] is not None:
                    _ckptio.steps_unpin(pin[0])
                    pin[0] = None
                if not self._decide(lambda: self._went_away(chosen, marked), "CheckpointManager.load"):
                    raise
                if step is not None:
                    raise make_error(_ckptio.E_NOT_FOUND, "E_NOT_FOUND", 0, 0, "load", self.step_dir(step), -1,
                                     None, f"step {step} ({self.step_dir(step)}) was removed while it was being "
                                     f"loaded ({failed}); the state may be partly loaded", None) from failed
                _log.warning("%s: step %d was removed while it was being loaded (%s); loading the newest step left",
                             self.root, chosen, failed)
            finally:
                if self._rank == 0 and pin[0] is not None:
                    _ckptio.steps_unpin(pin[0])
                    pin[0] = None
        raise make_error(_ckptio.E_BUSY, "E_BUSY", 0, 0, "load", self.root, -1, None,
                         f"{self.root}: the step being loaded was removed, {_LOAD_ATTEMPTS} times; the state may be "
                         "partly loaded", None)

    def _pick_named(self, step: int, check: str, pin: List[Any]) -> Tuple[int, bool]:
        """Rank 0: step `step` checked and pinned, or the reason it cannot be loaded."""
        info = _ckptio.steps_check(self.root, step, check, engine=self.engine)
        if info[1] == "foreign":
            # Asked for by number: loaded through the reader, which checks what it reads. Never picked by
            # load(step=None): without the manager's marker nothing says its save finished.
            _log.warning("%s: loading step %d, which this manager did not write: %s", self.root, step, info[4])
            return step, False
        if info[1] != "complete":  # the failed check's own status (a refusal's E_DISALLOWED, damage's E_CHECKSUM)
            status = info[5] or _ckptio.E_FORMAT
            raise make_error(status, _ckptio.status_name(status), 0, 0, "load", self.step_dir(step), -1, None,
                             f"step {step} ({self.step_dir(step)}) is {info[1]}: {info[4]}", None)
        pin[0] = _ckptio.steps_pin(self.root, step)
        if pin[0] is None:
            raise make_error(_ckptio.E_NOT_FOUND, "E_NOT_FOUND", 0, 0, "load", self.step_dir(step), -1, None,
                             f"step {step} ({self.step_dir(step)}) was removed before it could be read", None)
        return step, True

    def _went_away(self, step: int, marked: bool) -> bool:
        """Rank 0, after a failed load: whether the step is gone (or no longer complete) rather than unreadable."""
        try:
            info = _ckptio.steps_check(self.root, step, "marker")
        except CkptioError as e:
            if e.status == _ckptio.E_NOT_FOUND:
                return True
            raise
        return marked and info[1] != "complete"

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Waits for the save in flight; the manager takes no more saves."""
        if not self._closed:
            self._closed = True
            try:
                self.wait()
            finally:
                self._stop_save_thread()
                if self._snapshots is not None:
                    self._snapshots.close()

    def _stop_save_thread(self) -> None:
        """Ends the save thread and waits for it: no thread of the manager's outlives close()."""
        worker = getattr(self, "_save_thread", None)
        if worker is not None:
            self._save_thread = None
            worker.stop()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # do not hide the exception; still do not leave a save behind
            self._closed = True
            pending = self._pending
            if pending is not None:
                concurrent.futures.wait([pending])
            self._stop_save_thread()
            if self._snapshots is not None:
                self._snapshots.close()


def _check_busy(value: str) -> str:
    if value not in _BUSY:
        raise ValueError(f"async_busy must be one of {_BUSY}, not {value!r}")
    return value


def _lock(root: str):
    """The root's lock, waiting in turn: a manager that saves in a loop
    never keeps a second one (or `ckptio clean`) out."""
    return _ckptio.dcp_lock_acquire(root, None, False, -1.0, None, True)


def _is_dir(path: str) -> bool:
    """A local directory, or a prefix in object storage with objects under it."""
    if _ckptio.path_is_object(path):
        return _ckptio.object_stat(path + "/")[0] == "directory"
    return os.path.isdir(path)


def _ensure_root(root: str) -> str:
    if not _ckptio.path_is_object(root):  # a prefix in object storage needs no creating
        os.makedirs(root, exist_ok=True)
    return root


_release = _manager_async.release_lock
