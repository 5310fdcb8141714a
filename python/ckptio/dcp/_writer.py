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
coordinator renames a manifest and then replaces ``.metadata`` atomically; only after that are files of older saves deleted. A crash at any
point leaves either the old checkpoint loadable or the new one complete.
Saves of one directory are serialized by a lock that the coordinator takes
before any rank writes data and keeps until the cleanup; new files take the
mode and owner of the ``.metadata`` they replace. The commit is libckptio's
(include/ckptio/dcp.h "DCP directory commit"): the lock, taken in
prepare_global_plan and released after finish, and the commit itself in one
call (ckptio_dcp_commit: the manifest, the atomic .metadata, the cleanup);
this class marshals torch's plans and results for it (_commit.py, _lock.py).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import threading
import uuid
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch.distributed.checkpoint import FileSystemWriter as _TorchFileSystemWriter
from torch.distributed.checkpoint.filesystem import (
    DEFAULT_SUFFIX,
    SerializationFormat,
    _split_by_size_and_type,
    _StorageInfo,
    _StoragePrefix,
)
from torch.distributed.checkpoint.metadata import Metadata, STATE_DICT_TYPE
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .. import _adapt, _ckptio, _files, _snapshot
from .._ckptio import Engine
from .._errors import CkptioError
from . import _byte_items, _commit, _lease_steps, _lock, _objects

_log = logging.getLogger("ckptio.dcp")

ZSTD_DESCRIPTOR = "stream.zstd/1"
MANIFEST_PREFIX = ".ckptio-manifest-"
# torch's keys in the __metadata__ of a SAFETENSORS data file (_hf_utils).
_ST_SHARDING_KEY = "DCP_SHARDING_INFO"
_ST_VERSION_KEY = "DCP_VERSION"
_ST_FORMAT_KEY = "format"

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


@dataclasses.dataclass
class _HashedStorageInfo(_StorageInfo):
    """A _StorageInfo carrying the checksum of the bytes it points at, from
    write_data to finish (stripped before .metadata is pickled, so stock
    torch never sees this class). The hash covers [data_offset, +data_length)."""

    xxh3: Optional[int] = None
    data_offset: int = 0
    data_length: int = 0
    # Items written from GPU memory: [(offset in the item, length, XXH3-64)]
    # tiling the item (hashed on the staging copies, see ckptio_dcp_part).
    parts: Optional[List[tuple]] = None

    def plain(self) -> _StorageInfo:
        return _StorageInfo(self.relative_path, self.offset, self.length,
                            transform_descriptors=self.transform_descriptors)


def _descriptor_of(ext: Any) -> str:
    name = getattr(ext, "registry_name", None)
    desc = ext.get_descriptor() if hasattr(ext, "get_descriptor") else None
    if name is None or name() != "stream.zstd" or desc is None or desc.partition("/")[2].partition(".")[0] != "1":
        raise ValueError(f"ckptio.dcp supports only the zstd stream transform (stream.zstd/1), not {ext!r}")
    return ZSTD_DESCRIPTOR


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


def _take_block_hashes(path: str, engine=None) -> Dict[str, List[tuple]]:
    """Reads and deletes the manifest ckptio.save(checksums=True) left beside
    a safetensors blob: {tensor: [(offset in the tensor, length, XXH3-64)]}."""
    manifest = path + ".ckptio-manifest.json"
    if _objects.is_object(manifest):
        doc = json.loads(_objects.read(manifest, engine))
        _objects.remove(manifest, engine)  # a crash before this leaves an object remove_stale() recognises
    else:
        doc = json.loads(_files.read_file(manifest))
        os.unlink(manifest)  # a crash before this leaves a file remove_stale() recognises
    block = int(doc["block_bytes"])
    out: Dict[str, List[tuple]] = {}
    for t in doc["tensors"]:
        n = int(t["nbytes"])
        out[t["name"]] = [(k * block, min(block, n - k * block), int(h, 16)) for k, h in enumerate(t["blocks"])]
    return out


class FileSystemWriter(_TorchFileSystemWriter):
    """A drop-in for ``torch.distributed.checkpoint.FileSystemWriter``.

    The constructor takes torch's options with torch's meaning, plus:

    * ``engine``: a :class:`ckptio.Engine` (default: a private one; its
      ``sync`` setting follows ``sync_files``).
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

    # This process's data files of a save, renamed, left open for finish()
    # to fsync with .metadata (the coordinator's own; other ranks fsync theirs).
    _pending: Optional[List[Any]] = None

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
        self._descriptors = [_descriptor_of(ext) for ext in (_extensions or ())]
        if self._descriptors and serialization_format == SerializationFormat.SAFETENSORS:
            raise ValueError("stream transforms (zstd) apply to TORCH_SAVE items only; torch's SAFETENSORS "
                             "writer does not compress tensors either")
        if len(self._descriptors) > 1:
            raise ValueError("at most one zstd transform can be applied")
        if engine is None:
            engine = Engine(sync=1 if sync_files else 0)
            if per_thread_copy_ahead != 10_000_000:
                # torch: bytes copied ahead from the GPU per writer thread. Here
                # GPU bytes move through the engine's pinned staging buffers, one
                # per worker: per_thread_copy_ahead becomes the staging per worker.
                workers = max(int(engine.get("threads")), 1)
                lo, hi = Engine.bounds("staging_bytes")
                engine.set("staging_bytes", min(max(int(per_thread_copy_ahead) * workers, lo), hi))
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
        self._staged_events: List[Any] = []
        if not (isinstance(snapshots, (bool, _snapshot.Snapshots)) or snapshots is None):
            raise ValueError(f"snapshots must be True, False or a ckptio.Snapshots, not {snapshots!r}")
        self._snapshots_option = snapshots
        self._snapshot: Optional[_snapshot.Snapshot] = None  # the staged state of the save in flight
        self._token: Optional[str] = None
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

    def _bins(self, items: List[WriteItem]) -> List[List[WriteItem]]:
        if self.single_file_per_rank:
            return [b for b in _split_by_size_and_type(self.thread_count, list(items)) if b]
        return [[item] for item in items]

    def _resolve_tensor(self, planner: SavePlanner, wi: WriteItem):
        t = planner.resolve_data(wi).detach()
        _adapt.check_savable(t, f"tensor '{wi.index.fqn}'", any_device=True)
        if t.device.type not in ("cpu", "cuda"):
            t = t.cpu()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        if self._descriptors and t.device.type != "cpu":
            t = t.cpu()  # compression runs on host memory
        if not t.is_contiguous():
            t = t.contiguous()
        return t

    def _byte_items(self, items: List[WriteItem], planner: SavePlanner) -> Dict[int, bytes]:
        """The pickled bytes of every byte item of the plan (id(WriteItem) -> bytes), each checked
        as the reader will check it (unless allow_pickle), before any file is written."""
        out: Dict[int, bytes] = {}
        for wi in items:
            if wi.type != WriteItemType.BYTE_IO:
                continue
            data = planner.resolve_data(wi)
            out[id(wi)] = raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
            if not self.allow_pickle:
                _byte_items.check(raw, wi.index.fqn, _byte_items.lookup(planner, wi),
                                  f"ckptio.dcp.FileSystemWriter({os.fspath(self.path)!r})", writer=True)
        return out

    def _write(self, plan: SavePlan, planner: SavePlanner) -> List[WriteResult]:
        self._wait_staged()  # async save: the staging copies must be complete
        prefix = plan.storage_data.prefix
        raws = self._byte_items(plan.items, planner)
        if not self._object:
            os.makedirs(self.path, exist_ok=True)
        # New data files take the attributes of the .metadata they will
        # replace (a checkpoint saved 0600 stays 0600). The coordinator holds
        # the directory's lock, so that file is stable until finish().
        self._reference = _commit.reference_stat(self.path, self._metadata_name())
        if self.serialization_format == SerializationFormat.SAFETENSORS:
            return self._write_safetensors(plan, planner, prefix, raws)
        flags = (_ckptio.DCP_ITEM_HASH if self.checksums else 0) | (_ckptio.DCP_ITEM_CRC32 if self.crc else 0)
        if self._descriptors:
            flags |= _ckptio.DCP_ITEM_ZSTD
        files: List[Any] = []
        names: List[str] = []
        order: List[WriteItem] = []
        payloads: List[tuple] = []
        keep: List[Any] = []
        cuda = set()
        try:
            for n, bucket in enumerate(self._bins(plan.items)):
                name = f"{prefix}{n}{DEFAULT_SUFFIX}"
                self._new_data_file(name)
                f = _ckptio.File(os.path.join(self.path, name), _ckptio.OPEN_WRITE, self.engine)
                files.append(f)
                names.append(name)
                # As torch: the byte items of a file first, then its tensors.
                for wi in [w for w in bucket if w.type == WriteItemType.BYTE_IO]:
                    order.append(wi)
                    payloads.append((f, flags & ~_ckptio.DCP_ITEM_CRC32, raws[id(wi)]))
                    keep.append(name)
                for wi in [w for w in bucket if w.type != WriteItemType.BYTE_IO]:
                    t = self._resolve_tensor(planner, wi)
                    src = _adapt.tensor_source(wi.index.fqn, t, safetensors=False)
                    if src.mem_kind == _adapt.MEM_CUDA:
                        cuda.add(src.cuda_index)
                    order.append(wi)
                    payloads.append((f, flags, (src.code, src.shape, src.address, src.nbytes, src.mem_kind)))
                    keep.append(src)
            _adapt.sync_current_stream(cuda)
            placed = _ckptio.dcp_write(payloads, self.alignment, self.engine)
            # No metadata names these files before finish(): each is renamed,
            # then all are fsynced with the directory at once. The process
            # that runs finish() hands its own files to the commit instead,
            # which fsyncs them with the manifest and .metadata: one round of
            # fsyncs fewer.
            defer = not self._object and getattr(self, "_is_coordinator", True)
            _ckptio.commit_unreferenced(files, self.engine, defer)
            if defer:  # renamed: a failed save leaves no temporary, only files the next save removes
                self._close_pending()
                self._pending = files
        finally:
            if self._pending is not files:
                for f in files:
                    f.close()  # an uncommitted file is discarded
        del keep
        _crash("data_committed")
        results = []
        file_of = {id(f): name for f, name in zip(files, names)}
        descriptors = list(self._descriptors) or None
        for wi, (f, _, _), (offset, length, xxh3, parts) in zip(order, payloads, placed):
            info = _HashedStorageInfo(file_of[id(f)], offset, length, transform_descriptors=descriptors,
                                      xxh3=xxh3, data_offset=offset, data_length=length, parts=parts)
            results.append(WriteResult(index=wi.index, size_in_bytes=length, storage_data=info))
        return results

    def _close_pending(self) -> None:
        """Closes the data files renamed for finish() to fsync (a save that
        failed before leaves them unreferenced: the next save removes them)."""
        pending, self._pending = self._pending, None
        for f in pending or ():
            f.close()

    def _new_data_file(self, name: str) -> None:
        """Over an existing checkpoint: the data file's final name is created
        empty with the checkpoint's attributes first; libckptio's atomic
        save gives the temporary that replaces it the same mode and owner,
        so the data is never readable with wider permissions."""
        if self._reference is not None:
            _commit.create_placeholder(self.path, name, self._reference)

    def _write_safetensors(self, plan: SavePlan, planner: SavePlanner, prefix: str,
                           raws: Dict[int, bytes]) -> List[WriteResult]:
        """torch's SAFETENSORS layout: every tensor of a file in one safetensors
        blob whose __metadata__ holds DCP_SHARDING_INFO; the tensors'
        _StorageInfo point at the blob (offset of its first byte, length =
        tensor bytes). Byte items go to a file of their own, so every tensor
        file is a valid standalone safetensors file."""
        results: List[WriteResult] = []
        bins = self._bins(plan.items)
        byte_items = [w for b in bins for w in b if w.type == WriteItemType.BYTE_IO]
        n = 0
        for bucket in bins:
            tensors = [w for w in bucket if w.type != WriteItemType.BYTE_IO]
            if not tensors:
                continue
            name = f"{prefix}{n}{DEFAULT_SUFFIX}"
            n += 1
            path = os.path.join(self.path, name)
            self._new_data_file(name)
            sources, sharding, cuda = [], {}, set()
            for wi in tensors:
                fqn = wi.index.fqn
                if fqn in sharding:
                    raise ValueError(f"{path}: two chunks of '{fqn}' in one safetensors data file")
                t = self._resolve_tensor(planner, wi)
                src = _adapt.tensor_source(fqn, t, safetensors=True)
                if src.mem_kind == _adapt.MEM_CUDA:
                    cuda.add(src.cuda_index)
                sources.append((wi, src))
                sharding[fqn] = {"saved_offsets": list(wi.tensor_data.chunk.offsets)}
            _adapt.sync_current_stream(cuda)
            metadata = {_ST_SHARDING_KEY: json.dumps(sharding), _ST_VERSION_KEY: "1.0", _ST_FORMAT_KEY: "pt"}
            # With checksums the blob gets a ckptio manifest: XXH3 per 4 MiB
            # block of every tensor, hashed while the data is written (GPU
            # tensors on the staging copies). Its blocks become the items'
            # parts; the per-file manifest itself is then removed.
            _ckptio.safetensors_save(path, [(s.name, s.code, s.shape, s.address, s.nbytes, s.mem_kind)
                                            for _, s in sources], metadata, self.alignment if self.alignment >= 8
                                     else 8, self.engine, bool(self.checksums))
            reader = _ckptio.SafetensorsReader(path, self.engine)
            try:
                where = {row[0]: (row[3], row[4]) for row in reader.tensors}
            finally:
                reader.close()
            blocks = _take_block_hashes(path, self.engine) if self.checksums else {}
            for wi, src in sources:
                data_offset, nbytes = where[src.name]
                xxh3, parts = None, blocks.get(src.name)
                if parts is not None and len(parts) <= 1:
                    xxh3 = parts[0][2] if parts else _ckptio.hash_xxh3(0, 0)  # one block: the item's own hash
                    parts = None
                info = _HashedStorageInfo(name, 0, nbytes, xxh3=xxh3, data_offset=data_offset, data_length=nbytes,
                                          parts=parts)
                results.append(WriteResult(index=wi.index, size_in_bytes=nbytes, storage_data=info))
        if byte_items:
            name = f"{prefix}{n}{DEFAULT_SUFFIX}"
            self._new_data_file(name)
            f = _ckptio.File(os.path.join(self.path, name), _ckptio.OPEN_WRITE, self.engine)
            try:
                payloads = []
                for wi in byte_items:
                    payloads.append((f, _ckptio.DCP_ITEM_HASH if self.checksums else 0, raws[id(wi)]))
                placed = _ckptio.dcp_write(payloads, self.alignment, self.engine)
                f.commit()
            finally:
                f.close()
            for wi, (offset, length, xxh3, _) in zip(byte_items, placed):
                info = _HashedStorageInfo(name, offset, length, xxh3=xxh3, data_offset=offset, data_length=length)
                results.append(WriteResult(index=wi.index, size_in_bytes=length, storage_data=info))
        _crash("data_committed")
        return results

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
                if isinstance(info, _HashedStorageInfo):
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
            steps.on_step(step, done)
            if _crash_point is not None:
                _commit_stage(step, path, done)

        try:
            victims = _commit.commit(self.path, md_name, md_bytes, files, manifest if self.checksums else None, sync,
                                     cleanup, on_step if self._object or _crash_point is not None else None,
                                     self._pending)
        except CkptioError as e:
            if self._object and e.status_name == "E_BUSY" and md_name == ".metadata" and not steps.committed:
                _lease_steps.remove_own_objects(self.path, files, self.engine)
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
        (the checkpoint itself was committed). Returns True at once otherwise."""
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

    # ---- async staging ------------------------------------------------------------------
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


__all__ = ["FileSystemWriter", "ZSTD_DESCRIPTOR"]
