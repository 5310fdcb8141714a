"""ckptio.dcp.FileSystemWriter: torch.distributed.checkpoint's FileSystemWriter
with ckptio's engine as the data path and an atomic commit.

Planning (the planner, the split of items into files, .metadata's object
graph) is torch's own: the class derives from torch's FileSystemWriter and
replaces what touches bytes. Data files get names unique to the save
(``__{rank}_{token}_{n}.distcp``), are written through the engine (one plan
for every item of every file of the rank; tensors straight from host or GPU
memory, O_DIRECT where possible), committed (renamed, then fsynced with the
directory at once: no metadata names them yet; the coordinator's own with
the manifest and ``.metadata``'s temporary) and durable before the
coordinator renames a manifest and then replaces ``.metadata`` atomically;
only after that are files of older saves deleted. A crash at any point
leaves either the old checkpoint loadable or the new one complete.
Saves of one directory are serialized by a lock that the coordinator takes
before any rank writes data and keeps until the cleanup; new files take the
mode and owner of the ``.metadata`` they replace. The commit is libckptio's
(include/ckptio/dcp.h "DCP directory commit"): the lock, taken in
prepare_global_plan and released after finish, and the commit itself in one
call (ckptio_dcp_commit: the manifest, the atomic .metadata, the cleanup);
this class marshals torch's plans and results for it (_commit.py, _lock.py).
The data files are written by _data_files.py, async staging is _staging.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import uuid
from typing import Any, Dict, List, Optional, Sequence

from torch.distributed.checkpoint import FileSystemWriter as _TorchFileSystemWriter
from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .. import _ckptio, _snapshot
from .._ckptio import Engine
from .._errors import CkptioError
from . import _commit, _engines, _lease_steps, _lock, _objects
from ._data_files import DataFiles, HashedStorageInfo
from ._staging import AsyncStaging
from ._zstd import ZSTD_DESCRIPTOR, descriptor_of

_log = logging.getLogger("ckptio.dcp")

# Test hook: called with a stage name ("data_committed", "manifest_written",
# "metadata_committed") so that tests can inject a crash between steps. The
# last two are the points between libckptio's commit steps (its step callback).
_crash_point = None


def _crash(stage: str) -> None:
    if _crash_point is not None:
        _crash_point(stage)


def _commit_stage(step: int, path: str, done: bool) -> None:
    """The step callback of the commit: the stages around .metadata."""
    if step == _ckptio.DCP_STEP_METADATA:
        _crash("metadata_committed" if done else "manifest_written")


class FileSystemWriter(DataFiles, AsyncStaging, _TorchFileSystemWriter):
    """A drop-in for ``torch.distributed.checkpoint.FileSystemWriter``.

    The constructor takes torch's options with torch's meaning, plus:

    * ``engine``: a :class:`ckptio.Engine` (default: the process's writer
      engine for this ``sync_files`` and ``per_thread_copy_ahead``, shared by
      every writer made without ``engine=`` and kept for the process's
      life; its ``sync`` setting follows ``sync_files``. Pass
      ``engine=ckptio.Engine()`` for a private one).
    * ``checksums`` (default True): record the XXH3-64 of every item in a
      manifest beside ``.metadata`` (see :func:`ckptio.dcp.verify`).
    * ``crc`` (default False): real CRC-32s inside torch.save items (CRC 0,
      which torch.load accepts, saves CPU time; the manifest checks integrity).
    * ``async_busy``: what ``stage()`` (``dcp.async_save``) does while an
      earlier save of this writer is still writing its staged data:
      ``"wait"`` (default) blocks until it is done, ``"error"`` raises
      RuntimeError.
    * ``alignment`` (default 4096): start of every item and storage alignment
      inside torch.save items, so tensor bytes move with O_DIRECT. Items in
      host memory below 64 KiB are packed at 64 bytes instead (torch's own
      alignment; they go through the page cache anyway).
    * ``cleanup`` (default ``"foreground"``): when an overwrite has committed,
      the files of older saves in the directory are deleted before ``finish``
      returns; ``"background"`` deletes them on a thread of its own instead
      (the list is taken at commit, so files of a later save are never
      touched), taking the unlink of the old checkpoint's data off the save's
      critical path. ``wait_cleanup()`` waits for it and raises its error; the
      next save of the writer waits for it too, and the interpreter before
      exiting.
    * ``dir_busy``: what a save does while another save (of any writer, in
      any process) holds the directory: ``"wait"`` (default) waits until it
      is done, ``"error"`` fails at once with CkptioError ``E_BUSY`` (in
      torch's CheckpointException) having written nothing, a number waits
      at most that many seconds, then fails the same way. Saves with a
      ``.metadata`` hold the directory from before the first data file is
      written until the files of older saves are removed (the background
      cleanup excepted); saves without collectives (per-rank metadata) only
      exclude those.
    * ``non_blocking_stage`` (default True): ``stage()`` (``dcp.async_save``)
      only enqueues the device-to-host copies of GPU tensors on each device's
      current stream and returns; work the caller launches next on that
      stream is ordered after them, and the background write waits for them.
      A tensor changed from another stream without synchronising with the
      current one could be staged with its new values: pass False to block
      until the copies are done. Applies with ``snapshots=False`` only.
    * ``snapshots`` (default True): ``stage()`` takes a snapshot
      (:class:`ckptio.Snapshots`, docs/SNAPSHOTS.md): GPU tensors are copied
      into one pinned pool, sized once and reused by every writer of the
      process, on ckptio's own copy stream while training goes on; the next
      optimizer step waits for the copy on the GPU. A
      :class:`ckptio.Snapshots` uses that one instead; False stages as
      torch does (``cache_staged_state_dict``, ``non_blocking_stage``).
      :meth:`prepare` pins the pool ahead of the first save.

    * ``allow_pickle`` (default False): a non-tensor value that
      ``FileSystemReader`` would refuse (an ``argparse.Namespace``, an
      instance of a user class) fails the save with TypeError naming its
      key, before any data file is written. True saves it as torch does;
      then only ``FileSystemReader(..., allow_pickle=True)`` or torch's own
      reader loads the checkpoint.

    ``_extensions`` may hold ``ckptio.dcp.ZStandard()`` or torch's
    ``ZStandard()`` (compression runs in libckptio; neither the zstandard nor
    the pyzstd module is needed to write or read).
    """

    def __init__(
        self,
        path,
        single_file_per_rank: bool = True,
        sync_files: bool = True,
        thread_count: int = 1,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        overwrite: bool = True,
        _extensions: Optional[Sequence[Any]] = None,
        serialization_format: SerializationFormat = SerializationFormat.TORCH_SAVE,
        *,
        engine: Optional[Engine] = None,
        checksums: bool = True,
        crc: bool = False,
        async_busy: str = "wait",
        alignment: int = 4096,
        non_blocking_stage: bool = True,
        cleanup: str = "foreground",
        dir_busy="wait",
        snapshots: Any = True,
        allow_pickle: bool = False,
    ) -> None:
        # torch's transforms object is built from _extensions; ours are
        # applied natively, so it gets none.
        super().__init__(path, single_file_per_rank, sync_files, thread_count, per_thread_copy_ahead,
                         cache_staged_state_dict, overwrite, None, serialization_format)
        if thread_count < 1:
            raise ValueError(f"thread_count must be >= 1, not {thread_count}")
        if async_busy not in ("wait", "error"):
            raise ValueError(f"async_busy must be 'wait' or 'error', not {async_busy!r}")
        if not 1 <= alignment <= 65536:
            raise ValueError(f"alignment must be 1..65536, not {alignment}")
        self._descriptors = [descriptor_of(ext) for ext in (_extensions or ())]
        if self._descriptors and serialization_format == SerializationFormat.SAFETENSORS:
            raise ValueError("stream transforms (zstd) apply to TORCH_SAVE items only; torch's SAFETENSORS "
                             "writer does not compress tensors either")
        if len(self._descriptors) > 1:
            raise ValueError("at most one zstd transform can be applied")
        if engine is None:
            # One engine per configuration for the whole process (_engines.py):
            # a new writer per save reuses its threads and memory.
            engine = _engines.writer_engine(sync_files, None if per_thread_copy_ahead == 10_000_000
                                            else per_thread_copy_ahead)
        self.engine = engine
        self._use_store(path)
        self.checksums = checksums
        self.crc = crc
        self.async_busy = async_busy
        self.alignment = alignment
        if cleanup not in ("foreground", "background"):
            raise ValueError(f"cleanup must be 'foreground' or 'background', not {cleanup!r}")
        self.cleanup = cleanup
        self._cleanup = None
        self.dir_busy = _lock.check_busy_option(dir_busy)
        self._dir_lock: Optional[_lock.DirectoryLock] = None
        self._reference: Optional[str] = None  # the .metadata a save replaces, when it gives attributes
        self.non_blocking_stage = non_blocking_stage
        if not isinstance(allow_pickle, bool):
            raise TypeError(f"allow_pickle must be a bool, not {allow_pickle!r}")
        self.allow_pickle = allow_pickle
        if not (isinstance(snapshots, (bool, _snapshot.Snapshots)) or snapshots is None):
            raise ValueError(f"snapshots must be True, False or a ckptio.Snapshots, not {snapshots!r}")
        self._snapshots_option = snapshots
        self._token: Optional[str] = None
        self._init_staging()

    # ---- planning ------------------------------------------------------------------
    def _use_store(self, path) -> None:
        """s3:// paths go through an ObjectStore (torch's FileSystem makes a
        pathlib.Path of them); local ones through torch's FileSystem."""
        from torch.distributed.checkpoint.filesystem import FileSystem

        store = _objects.store_for(path, self.engine)
        self._object = store is not None
        self.fs = store if store is not None else FileSystem()
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return _objects.is_object(checkpoint_id) or super().validate_checkpoint_id(checkpoint_id)

    def reset(self, checkpoint_id=None) -> None:
        self._close_pending()  # a save that failed between write_data and finish
        lock = self._dir_lock
        if lock is not None and lock.stale():  # an earlier save of this writer that died between hooks
            self._unlock_directory()
        if checkpoint_id:
            self._use_store(checkpoint_id)
        super().reset(checkpoint_id)
        self._token = None
        with self._inflight_cv:  # torch's save() starts here: it is the save stage() marked
            claimed = self._inflight and self._inflight != self._save_gen
            self._save_gen = self._inflight if claimed else 0
            if claimed:
                self._save_thread = threading.current_thread()

    def _new_token(self) -> str:
        return uuid.uuid4().hex[:12]

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        try:
            plan = super().prepare_local_plan(plan)
            if isinstance(plan.storage_data, _StoragePrefix):
                # No collectives: each rank names its own files (torch: "__{rank}_").
                plan = dataclasses.replace(plan, storage_data=_StoragePrefix(
                    f"{plan.storage_data.prefix}{self._new_token()}_"))
            return plan
        except BaseException:
            self._release_staging()  # the save ends here
            raise

    def _metadata_exists(self) -> bool:
        """torch asks this to warn about an overwrite (overwrite=True) or refuse
        one: in object storage only the refusal is worth a round trip."""
        if self._object and self.overwrite:
            return False
        return super()._metadata_exists()

    def _per_rank(self) -> bool:
        """A save without collectives: every rank commits its own __{rank}.metadata."""
        return not getattr(self, "use_collectives", True) and getattr(self, "rank", None) is not None

    def _metadata_name(self) -> str:
        return f"__{self.rank}.metadata" if self._per_rank() else ".metadata"

    def _lock_directory(self) -> None:
        """Takes the directory's lock for this save (see _lock.py). Runs in
        prepare_global_plan: on the coordinator of a collective save before
        the plans that let the other ranks write are scattered; without
        collectives on every rank, shared (such saves delete nothing)."""
        if self._dir_lock is not None:
            if not self._dir_lock.stale():
                raise RuntimeError(f"ckptio.dcp.FileSystemWriter({os.fspath(self.path)!r}) is already saving on "
                                   "another thread; a writer runs one save at a time")
            self._unlock_directory()
        md_name = self._metadata_name()
        if not self._object:
            os.makedirs(self.path, exist_ok=True)
        # In object storage the lease's read-back is left to the check before
        # .metadata (the data upload meanwhile; _lease_steps).
        lock = _lock.acquire(self.path, exclusive=not self._per_rank(), busy=self.dir_busy,
                             reference=_commit.reference_stat(self.path, md_name),
                             confirm_later=self._object and not self._per_rank())
        if not self.overwrite and (self.fs.exists(self.fs.concat_path(self.path, md_name)) if self._object
                                   else os.path.lexists(os.path.join(self.path, md_name))):
            # torch checked this in prepare_local_plan, before the lock: a
            # save that committed meanwhile must not be overwritten either.
            lock.release()
            raise RuntimeError(f"Checkpoint already exists and self.overwrite={self.overwrite}.")
        self._dir_lock = lock

    def _unlock_directory(self) -> None:
        lock, self._dir_lock = self._dir_lock, None
        if lock is not None:
            lock.release()

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        try:
            self._lock_directory()
        except BaseException:
            self._release_staging()
            raise
        try:
            token = self._new_token()
            return [dataclasses.replace(p, storage_data=_StoragePrefix(f"__{i}_{token}_"))
                    if p.storage_data is None else p for i, p in enumerate(plans)]
        except BaseException:
            self._unlock_directory()
            self._release_staging()
            raise

    # ---- writing ------------------------------------------------------------------
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        try:
            super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        except BaseException:
            self._release_staging()
            raise
        self._is_coordinator = is_coordinator

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        # The staged data is free again once written; the coordinator holds
        # the writer until finish() (its path and state belong to this save).
        done = False
        try:
            results = self._write(plan, planner)
            _crash("data_committed")
            done = True
        finally:
            # A failure keeps the directory's lock: torch gathers every rank's
            # write_data before it raises, so other ranks may still write; the
            # lock goes when this save's thread has left torch's code (_lock's
            # watcher, or the next save of this process or writer).
            if not done or not getattr(self, "_is_coordinator", True):
                self._release_staging()
        fut: Future = Future()
        fut.set_result(results)
        return fut


    # ---- commit ---------------------------------------------------------------------
    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        try:
            self._finish(metadata, results)
        finally:
            self._close_pending()  # committed, or left for the next save to remove
            self._unlock_directory()
            self._release_staging()

    def _finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

        metadata.version = CURRENT_DCP_VERSION
        storage_md: Dict[Any, _StorageInfo] = {}
        manifest: List[tuple] = []  # ckptio_dcp_manifest_item rows (see _ckptio.dcp_commit)
        for wr_list in results:
            for wr in wr_list:
                info = wr.storage_data
                if isinstance(info, HashedStorageInfo):
                    zstd = ZSTD_DESCRIPTOR in (info.transform_descriptors or ())
                    manifest.append((wr.index.fqn, None if wr.index.offset is None else list(wr.index.offset),
                                     info.relative_path, info.data_offset, info.data_length, info.xxh3,
                                     info.parts or None, _ckptio.DCP_TRANSFORM_ZSTD if zstd else 0))
                    info = info.plain()
                storage_md[wr.index] = info
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        files = sorted({info.relative_path for info in storage_md.values()})
        md_name = self._metadata_name()
        sync = bool(self.sync_files)
        import pickle

        md_bytes = pickle.dumps(metadata)
        cleanup = None
        if not self._per_rank():
            # Only the coordinator of a collective save knows every file of
            # the new checkpoint; then older saves' files can go (those no
            # metadata file references, under the directory's lock).
            self._join_previous_cleanup()  # one removal at a time; the commit lists its files again
            cleanup = "later" if self.cleanup == "background" else "now"
        # The manifest, .metadata (the new checkpoint is current from then
        # on) and the cleanup: one libckptio call, in that order.
        steps = _lease_steps.LeaseSteps(self._dir_lock if self._object else None)

        def on_step(step: int, path: str, done: bool) -> None:
            steps.on_step(step, path, done)
            if _crash_point is not None:
                _commit_stage(step, path, done)

        try:
            victims = _commit.commit(self.path, md_name, md_bytes, files, manifest if self.checksums else None, sync,
                                     cleanup, on_step if self._object or _crash_point is not None else None,
                                     self._pending, self.engine if self._object and self._pending else None)
        except CkptioError as e:
            if self._object and e.status_name == "E_BUSY" and md_name == ".metadata" and not steps.committed:
                _lease_steps.remove_own_objects(self.path, files, self.engine, steps.manifest)
            raise
        finally:
            steps.close()
        self._close_pending()
        if victims:
            self._cleanup = _commit.BackgroundRemoval(self.path, victims, sync,
                                                      _commit.Committed(md_name, md_bytes, set(files)))

    def _join_previous_cleanup(self) -> None:
        try:
            self.wait_cleanup()
        except Exception:  # noqa: BLE001 - logged by the removal; this save removes what is left
            pass

    def wait_cleanup(self, timeout: Optional[float] = None) -> bool:
        """With ``cleanup="background"``: waits until the files of older saves
        are removed (False on timeout) and raises the removal's error, if any
        (the checkpoint itself was committed). In object storage also waits
        for the release of the directory's lease, which a committed save
        leaves to a thread of its own (the next save of this process waits
        for it too). Returns True at once when nothing is left."""
        if self._object and not _lock.wait_released(self.path, timeout):
            return False
        job = getattr(self, "_cleanup", None)
        if job is None:
            return True
        try:
            done = job.join(timeout)
        except BaseException:
            self._cleanup = None
            raise
        if done:
            self._cleanup = None
        return done


__all__ = ["FileSystemWriter", "ZSTD_DESCRIPTOR"]
