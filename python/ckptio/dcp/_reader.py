"""ckptio.dcp.FileSystemReader: torch.distributed.checkpoint's FileSystemReader
with ckptio's engine as the data path and resharding by byte ranges.

For every requested slice of a stored chunk only the bytes it needs are
read: the runs of the stored (C-contiguous) tensor that the slice covers go
straight into the destination tensor (host or GPU memory) when it is
contiguous, else into a temporary that is copied; a slice of many short runs
(or of a strided chunk) is read as the span that covers it, in bounded
batches, and cut on the target's device (ckptio.dcp._spans). All reads of one
read_data() call, over every file, form one engine plan. Items written by
torch (torch.save archives, SAFETENSORS blobs, zstd-compressed items) and by
ckptio are read alike. Bytes that several ranks need are read once and
broadcast (``broadcast=``, ckptio.dcp._broadcast).

A checkpoint is untrusted data. Data files are opened through libckptio
(ckptio_dcp_file_open: a relative_path must stay inside the directory),
zstd items are decompressed by libckptio through a fixed buffer (never into
memory sized by what the item or .metadata declares: a large archive is not
held, its slices decompress straight into their targets), and byte items
(torch.save of non-tensor values) pass libckptio's restricted unpickler
before torch's planner sees them: the planner gets a fresh torch.save of
the allowlisted objects they hold, never the stored pickle (``allow_pickle=True`` opts out for trusted checkpoints).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint import FileSystemReader as _TorchFileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from .. import _adapt, _ckptio, _files
from .._api import build_torch_object
from .._ckptio import Engine
from .._errors import CkptioError, make_error
from . import _broadcast, _objects, _spans
from ._metadata import metadata_from_bytes

# A step of a transform chain that libckptio applies itself (zstd).
ZSTD_STEP = "zstd"
# Longest transform chain an item may have (torch's writer records one
# descriptor per extension it was given).
MAX_TRANSFORMS = 16
# Bytes of each edge of a torch.save item read for its header (libckptio's read-ahead window
# in object storage, torch_file.c), and how many items' edges are held at once.
HEADER_WINDOW = 64 << 10
HEADER_BATCH = 256
# Windows of the items whose records the first windows missed (read in a second plan), and the first bytes
# of a zip archive (a torch.save item; anything else is left to libckptio's own header read).
HEADER_WINDOW_RETRY = 1 << 20
HEADER_RETRY_BATCH = 32
ZIP_MAGIC = b"PK\x03\x04"
# Windows of one file at most this far apart are read as one range (one GET), up to this many bytes.
HEADER_MERGE_GAP = 64 << 10
HEADER_RANGE_MAX = 4 << 20
# Data extents of at most this many bytes, this far apart in one object, are read as one range of at most
# COALESCE_RANGE_MAX bytes (_read_coalesced).
COALESCE_EXTENT_MAX = 256 << 10
COALESCE_GAP = 64 << 10
COALESCE_RANGE_MAX = 4 << 20


def _error(status: int, path: str, offset: int, message: str, subject: Optional[str] = None):
    name = _ckptio.status_name(status)
    return make_error(status, name, 0, 0, "read DCP item", path, offset, subject,
                      f"{path}: read DCP item at offset {offset}: {message}")


def _format_error(path: str, offset: int, message: str):
    return _error(_ckptio.E_FORMAT, path, offset, message)


def _item_error(e: CkptioError, path: str, offset: int, fqn: str, what: str, hint: str = ""):
    """A libckptio error about an item's bytes, with the item's file, offset
    and name in front (its status kept), worded as libckptio's own reader
    words it (dcp_assemble.c)."""
    inner = e.message[len("<memory>: "):] if e.message.startswith("<memory>: ") else e.message
    return _error(e.status, path, offset, f"{fqn}: {what}: {inner}{hint}", fqn)


def _read_limited(stream, limit: int, path: str, offset: int, fqn: str, step: str) -> bytes:
    """All of a transform's output, refused once it passes `limit` bytes."""
    parts, total = [], 0
    while True:
        part = stream.read(min(1 << 20, limit + 1 - total))
        if not part:  # b"" at the end (None from a non-blocking stream: nothing more either)
            break
        parts.append(bytes(part))
        total += len(part)
        if total > limit:
            raise _format_error(path, offset, f"item '{fqn}': transform '{step}' produces more than the {limit} "
                                "bytes this item may hold")
    return b"".join(parts)


def _close_ranges(ranges: List[tuple], gap: int, limit: int):
    """Groups `ranges` ((file, start, end, payload), sorted by file and start) into runs of one file whose
    neighbours lie at most `gap` bytes apart, each run spanning at most `limit` bytes (a range longer
    than that alone): yields (file, first byte, end, [payload, ...]), each run one read, one GET."""
    k = 0
    while k < len(ranges):
        f, lo, hi = ranges[k][0], ranges[k][1], ranges[k][2]
        j = k + 1
        while j < len(ranges) and ranges[j][0] is f and ranges[j][1] <= hi + gap and \
                max(hi, ranges[j][2]) - lo <= limit:
            hi = max(hi, ranges[j][2])
            j += 1
        yield f, lo, hi, [r[3] for r in ranges[k:j]]
        k = j


def _read_coalesced(extents: List[tuple], engine, remote: bool) -> None:
    """Reads `extents` in one engine plan. In object storage, where every ranged GET has a fixed cost
    (a round trip, the server's work per request), small extents in host memory that lie close together
    in one object (byte items, small tensors, packed back to back by the writers) are read as one range
    into a buffer and copied to their places: one GET instead of one each."""
    if not remote or len(extents) < 2:
        _ckptio.dcp_read(extents, engine)
        return
    small = sorted(((e[0], e[3], e[3] + e[2], e) for e in extents
                    if e[2] <= COALESCE_EXTENT_MAX and e[4] != _adapt.MEM_CUDA), key=lambda r: (id(r[0]), r[1]))
    plan = [e for e in extents if e[2] > COALESCE_EXTENT_MAX or e[4] == _adapt.MEM_CUDA]
    copies: List[tuple] = []  # (buffer, its first byte's offset, the extents it holds)
    for f, lo, hi, held in _close_ranges(small, COALESCE_GAP, COALESCE_RANGE_MAX):
        if len(held) == 1:
            plan.append(held[0])
            continue
        buf = torch.empty(hi - lo, dtype=torch.uint8)
        plan.append((f, buf.data_ptr(), hi - lo, lo, _adapt.MEM_HOST))
        copies.append((buf, lo, held))
    _ckptio.dcp_read(plan, engine)
    for buf, lo, held in copies:
        base = buf.data_ptr()
        for _, addr, length, offset, _ in held:
            _ckptio.copy(addr, base + offset - lo, length)  # guarded: a truncated mapped target raises


class _Stored:
    """A stored chunk as bytes: dtype, shape, strides (elements) and where its
    storage starts (absolute file offset, or inside a decoded item)."""

    __slots__ = ("code", "dtype", "shape", "stride", "storage_offset", "base", "storage_nbytes", "decoded", "keep")

    def __init__(self, code, shape, stride, storage_offset, base, storage_nbytes, decoded=None, keep=None):
        self.code = code
        self.dtype = _adapt.torch_dtype(code, "stored tensor")
        self.shape = tuple(shape)
        self.stride = tuple(stride)
        self.storage_offset = storage_offset
        self.base = base
        self.storage_nbytes = storage_nbytes
        # A transformed item: libckptio's header of the decoded archive (read with dcp_header_read_box),
        # and the bytes it reads from (the stored zstd frames, or the decoded archive), kept alive.
        self.decoded = decoded
        self.keep = keep

    def contiguous(self) -> bool:
        expect = 1
        for size, st in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and st != expect:
                return False
            expect *= size
        return True


class _DataFile:
    def __init__(self, directory: str, relative_path: str, engine: Engine, listed: Optional[tuple] = None):
        # libckptio refuses a relative_path that leaves the directory (an
        # absolute path, '/', '..') before anything is opened. `listed`: the
        # object's (size, etag) from the prefix's listing (no HEAD).
        self.file = _ckptio.dcp_file_open(directory, relative_path, engine, *(listed or ()))
        self.path = self.file.path
        self.size = self.file.size()

    def check(self, offset: int, length: int, what: str) -> None:
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0:
            raise _format_error(self.path, offset if isinstance(offset, int) else -1,
                                f"{what}: offset {offset!r} / length {length!r} are not byte counts")
        if offset + length > self.size:
            raise _error(_ckptio.E_TRUNCATED, self.path, offset, f"{what} of {length} bytes runs past the end of "
                         f"the file ({self.size} bytes)")


class FileSystemReader(_TorchFileSystemReader):
    """A drop-in for ``torch.distributed.checkpoint.FileSystemReader``.

    * ``engine``: a :class:`ckptio.Engine` (default: the shared default engine).
    * ``broadcast``: load once, broadcast (see ckptio.dcp._broadcast):
      ``True`` shares stored bytes that several ranks need when
      torch.distributed is initialised with more than one rank in
      ``process_group``; ``"auto"`` (default) does so only where it is the
      faster way: the checkpoint is in object storage (s3://), or the group's
      backend is NCCL; over gloo every rank reads its own bytes. ``False``
      makes every rank read its own bytes. The bytes are shared only when
      every rank of the load allows it.
    * ``process_group``: the group given to ``dcp.load`` (default: the
      default group).
    * ``broadcast_budget``: bytes moved per broadcast batch (default 1 GiB;
      a larger tensor item moves in pieces of whole rows, a larger row or
      byte item forms a batch alone).
    * ``allow_pickle``: byte items (``torch.save`` of the state dict's
      non-tensor values) are checked by libckptio's restricted unpickler
      (only state-dict types: containers, numbers, strings, tensors,
      torch.Size, dtypes, devices) and torch's planner gets a fresh
      ``torch.save`` of the objects they hold; any other global is
      ``CkptioError`` ``E_DISALLOWED`` naming it, and nothing runs. With
      ``allow_pickle=True`` the stored bytes go to the planner unchecked, as
      torch's own reader does: ``torch.load(weights_only=False)`` then runs
      whatever code they hold. Only for checkpoints you trust that store
      other objects (numpy arrays, custom classes).
    * ``_extension_registry``: as torch's; stream transforms other than
      ``stream.zstd/1`` (which libckptio applies) are looked up in it, and an
      item with a transform it lacks is refused when the load is planned
      (``E_UNSUPPORTED`` naming the transform and the item).

    After ``read_data``, ``last_read_stats`` holds this rank's
    ``bytes_read`` (item data read from storage, headers not counted),
    ``header_bytes``, ``bytes_broadcast_sent``, ``bytes_received``,
    ``items_shared`` (shared items of the load, all ranks take part in each).
    """

    def __init__(self, path, _extension_registry=None, *, engine: Optional[Engine] = None,
                 broadcast: Any = "auto", process_group: Any = None, broadcast_budget: int = 1 << 30,
                 allow_pickle: bool = False) -> None:
        super().__init__(path, _extension_registry)
        self.engine = engine
        self._use_store(path)
        if not isinstance(allow_pickle, bool):
            raise TypeError(f"allow_pickle must be True or False, not {allow_pickle!r}")
        self.allow_pickle = allow_pickle
        self._registry = _extension_registry
        self._chains: Dict[tuple, tuple] = {}
        self._chunk_sizes: Dict[str, Dict[tuple, tuple]] = {}
        if broadcast not in ("auto", True, False):
            raise ValueError(f"broadcast must be 'auto', True or False, not {broadcast!r}")
        if not isinstance(broadcast_budget, int) or broadcast_budget < 1:
            raise ValueError(f"broadcast_budget must be a positive number of bytes, not {broadcast_budget!r}")
        self.engine = engine
        self.broadcast = broadcast
        self.process_group = process_group
        self.broadcast_budget = broadcast_budget
        self.last_read_stats: Optional[Dict[str, int]] = None
        self._state_md: Dict = {}
        self._use_collectives = True
        self._header_bytes = 0
        self._data_bytes = 0
        self._listing: Optional[_objects.PrefixListing] = None

    def _use_store(self, path) -> None:
        """s3:// checkpoint ids go through an ObjectStore (torch's FileSystem
        makes a pathlib.Path of them); local ones through torch's FileSystem."""
        from torch.distributed.checkpoint.filesystem import FileSystem

        store = _objects.store_for(path, self.engine)
        self.fs = store if store is not None else FileSystem()
        self.path = self.fs.init_path(path)

    def reset(self, checkpoint_id=None) -> None:
        self._listing = None
        if checkpoint_id:
            self._use_store(checkpoint_id)
        super().reset(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return _objects.is_object(checkpoint_id) or super().validate_checkpoint_id(checkpoint_id)

    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._state_md = metadata.state_dict_metadata
        self._use_collectives = kwargs.get("use_collectives", True)
        self._chunk_sizes = {}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        plan = super().prepare_local_plan(plan)
        # Transforms this reader cannot undo fail now, on the rank that needs
        # the item, not in the middle of read_data.
        for req in plan.items:
            info = self.storage_data.get(req.storage_index)
            if info is not None:
                self._chain(info, req.storage_index.fqn)
        stamp = _broadcast.local_stamp(self.broadcast, self.process_group, self._use_collectives,
                                       remote=isinstance(self.fs, _objects.ObjectStore))
        if stamp is not None and plan.storage_data is None:
            plan = dataclasses.replace(plan, storage_data=stamp)
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        plans = super().prepare_global_plan(plans)
        return _broadcast.plan_global(plans, self.storage_data, self._state_md, self.broadcast_budget)

    def read_metadata(self, *args: Any, **kwargs: Any):
        """torch's read_metadata, but .metadata goes through ckptio's restricted
        unpickler (ckptio.dcp._metadata) instead of pickle.load: a hostile
        file raises CkptioError (E_DISALLOWED naming the global) and runs nothing."""
        rank = kwargs.get("rank")
        getter = getattr(self, "_get_metadata_path", None)  # not in every torch 2.x
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        path = getter(rank) if getter is not None else self.fs.concat_path(self.path, name)
        # In object storage the data objects' sizes and ETags come from a listing that runs meanwhile.
        directory = os.fspath(self.path)
        self._listing = _objects.PrefixListing(directory, self.engine) if _ckptio.path_is_object(directory) else None
        # Through libckptio: a FIFO or device under the name is refused at once, never waited on.
        data, version = _files.read_file_pinned(os.fspath(path), self.engine)
        if self._listing is not None:
            self._listing.witness(os.fspath(path).rpartition("/")[2], version)
        metadata = metadata_from_bytes(data, os.fspath(path), whole=rank is None)
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    # ---- transforms and byte items ----------------------------------------------------
    def _chain(self, info, fqn: str) -> tuple:
        """The decoding steps of an item, in the order they apply to the stored
        bytes: ZSTD_STEP (libckptio) or a StreamTransformExtension from the
        registry. () for a plain item."""
        raw = info.transform_descriptors or ()
        where = os.path.join(os.fspath(self.path), str(info.relative_path))
        if not isinstance(raw, (list, tuple)) or not all(isinstance(d, str) for d in raw):
            raise _format_error(where, info.offset, f"item '{fqn}': transform_descriptors {raw!r} is not a list "
                                "of strings")
        descriptors = tuple(raw)
        steps = self._chains.get(descriptors)
        if steps is not None:
            return steps
        from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension

        registry = self._registry if self._registry is not None else ExtensionRegistry()
        zstd = sum(1 for d in descriptors if d.partition("/")[0] == "stream.zstd")
        if len(descriptors) > MAX_TRANSFORMS or zstd > 1:
            # What is wrong, said in bounded time whatever the list's length.
            raise _error(_ckptio.E_UNSUPPORTED, where, info.offset,
                         f"item '{fqn}' has {len(descriptors)} transforms ({zstd} of them stream.zstd); ckptio reads "
                         f"at most one 'stream.zstd/1' and at most {MAX_TRANSFORMS} transforms per item", fqn)
        decoded = []
        # torch's writer records the extensions in the order they were applied
        # to the data (the last one is outermost in the file), so they are
        # undone from the last descriptor to the first.
        for d in reversed(descriptors):
            name, _, version = d.partition("/")
            if name == "stream.zstd":
                if version.partition(".")[0] != "1":
                    raise _error(_ckptio.E_UNSUPPORTED, where, info.offset,
                                 f"unsupported transform '{d}' of item '{fqn}' (ckptio reads stream.zstd/1)", fqn)
                decoded.append(ZSTD_STEP)
                continue
            try:
                (ext,) = registry.from_descriptor_list([d])
            except Exception as e:
                raise _error(_ckptio.E_UNSUPPORTED, where, info.offset,
                             f"unsupported transform '{d}' of item '{fqn}': ckptio implements stream.zstd/1 only "
                             f"and the reader's _extension_registry cannot provide it ({e}); pass "
                             f"FileSystemReader(path, _extension_registry=...) with it registered", fqn) from None
            if isinstance(ext, StreamTransformExtension):  # others do not touch the bytes (as in torch)
                decoded.append((d, ext))
        steps = self._chains[descriptors] = tuple(decoded)
        return steps

    def _decode(self, packed: torch.Tensor, info, fqn: str, path: str, limit: int, steps=None) -> Any:
        """The stored bytes of an item (a host uint8 tensor) with every transform
        undone (or those of `steps`); each step's output is bounded by `limit`
        before it is kept."""
        data: Any = packed
        for step in self._chain(info, fqn) if steps is None else steps:
            if step == ZSTD_STEP:
                if isinstance(data, torch.Tensor):
                    src = data
                elif data:  # the output of a registry transform
                    src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                else:
                    src = torch.empty(0, dtype=torch.uint8)
                try:
                    data = _ckptio.zstd_decompress(src.data_ptr(), src.numel(), limit)
                except CkptioError as e:
                    raise _item_error(e, path, info.offset, fqn, "zstd item") from None
            else:
                d, ext = step
                raw = data.numpy().tobytes() if isinstance(data, torch.Tensor) else data
                data = _read_limited(ext.transform_from(io.BytesIO(raw)), limit, path, info.offset, fqn, d)
        if steps is not None:
            return data
        return data.numpy().tobytes() if isinstance(data, torch.Tensor) else data

    def byte_item(self, packed: torch.Tensor, info, fqn: str, path: str) -> io.BytesIO:
        """What torch's planner gets for a byte item (``load_bytes``) whose
        stored bytes are `packed`."""
        data = self._decode(packed, info, fqn, path, _ckptio.DCP_BYTE_ITEM_MAX)
        if self.allow_pickle:
            return io.BytesIO(data)
        # Parsed by the restricted unpickler, built into objects from its
        # value tree, and saved again by torch: the planner unpickles only
        # what Python's pickler made of allowlisted objects.
        try:
            reader = _ckptio.torch_reader_from_bytes(data, f"{path}@{info.offset}")
        except CkptioError as e:
            hint = "" if e.status_name not in ("E_DISALLOWED", "E_UNSUPPORTED") else (
                "; FileSystemReader(..., allow_pickle=True) loads it unchecked, for a checkpoint you trust")
            raise _item_error(e, path, info.offset, fqn, "byte item (torch.save of a non-tensor value)",
                              hint) from None
        try:
            obj = build_torch_object(reader, _adapt.parse_device("cpu"))
        finally:
            reader.close()
        out = io.BytesIO()
        torch.save(obj, out)
        out.seek(0)
        return out

    def _chunk_bytes(self, key, path: str, offset: int) -> int:
        """Bytes of the stored chunk `key` (MetadataIndex) as .metadata gives them."""
        sizes = self._chunk_sizes.get(key.fqn)
        md = self._state_md.get(key.fqn)
        if sizes is None and md is not None and hasattr(md, "chunks"):
            sizes = self._chunk_sizes[key.fqn] = {tuple(c.offsets): tuple(c.sizes) for c in md.chunks}
        size = sizes.get(tuple(key.offset or ())) if sizes else None
        if size is None:
            raise _format_error(path, offset, f"tensor '{key.fqn}': no chunk at offsets {list(key.offset or ())} "
                                "in .metadata")
        return math.prod(size) * md.properties.dtype.itemsize

    # ---- describing stored items ------------------------------------------------------
    def _read_bytes(self, df: _DataFile, offset: int, length: int) -> torch.Tensor:
        df.check(offset, length, "item")
        buf = torch.empty(length, dtype=torch.uint8)
        if length:
            _ckptio.dcp_read([(df.file, buf.data_ptr(), length, offset, _adapt.MEM_HOST)], self.engine)
        self._header_bytes += length
        return buf

    # ---- the interface of the load-once broadcast -----------------------------------------
    # _broadcast.py reaches the reader only through these (and the public
    # attributes storage_data, engine, path); they are what read_data uses too.

    #: format_error(path, offset, message) -> CkptioError E_FORMAT of a DCP item.
    format_error = staticmethod(_format_error)

    def data_file(self, files: Dict[str, _DataFile], rel: str) -> _DataFile:
        """The open data file `rel` (kept in `files`, one read_data's)."""
        df = files.get(rel)
        if df is None:
            listed = self._listing.get(rel) if self._listing is not None else None
            df = files[rel] = _DataFile(os.fspath(self.path), rel, self.engine, listed)
        return df

    @staticmethod
    def read_target(planner: LoadPlanner, req: ReadItem) -> torch.Tensor:
        """The planner's destination for `req`, checked against its lengths."""
        target = planner.resolve_tensor(req).detach()
        if tuple(target.shape) != tuple(req.lengths):
            raise AssertionError(f"req {req.storage_index} mismatch sizes {tuple(target.shape)} vs "
                                 f"{tuple(req.lengths)}")
        return target

    def stored_from_bytes(self, packed: torch.Tensor, info, key, path: str) -> _Stored:
        """Undoes a transformed tensor item held in host memory and describes
        the archive it holds (at most its chunk's bytes plus the archive's
        bounded overhead). When zstd is the last step, libckptio decompresses
        the frames through a fixed buffer and keeps the archive only when it
        is small (ckptio_dcp_header_zstd): a large one is never held, its
        slices are decompressed again straight into their targets."""
        limit = self._chunk_bytes(key, path, info.offset) + _ckptio.DCP_ARCHIVE_OVERHEAD_MAX
        steps = self._chain(info, key.fqn)
        if steps and steps[-1] == ZSTD_STEP:
            frames = self._decode(packed, info, key.fqn, path, limit, steps[:-1]) if len(steps) > 1 else packed
            if not isinstance(frames, torch.Tensor):
                frames = torch.frombuffer(bytearray(frames), dtype=torch.uint8) if frames else \
                    torch.empty(0, dtype=torch.uint8)
            header = _ckptio.dcp_header_zstd(frames.data_ptr(), frames.numel(), limit, path, info.offset, key.fqn)
            return _Stored(*_ckptio.dcp_header_layout(header, key.fqn), decoded=header, keep=frames)
        raw = bytearray(self._decode(packed, info, key.fqn, path, limit))
        # A uint8 tensor over the bytes (it keeps them referenced; torch.frombuffer does not).
        mem = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        # libckptio says what the decoded bytes are (dcp_item.c), as its own reader does.
        header = _ckptio.dcp_header_parse(mem.data_ptr(), mem.numel(), path, info.offset)
        return _Stored(*_ckptio.dcp_header_layout(header, key.fqn), decoded=header, keep=(mem, raw))

    def stored_chunk(self, df: _DataFile, info, key, cache: Dict) -> _Stored:
        """Where the stored chunk `key` (its _StorageInfo `info`) lies in `df`
        or, for a transformed item, in memory (kept in `cache`)."""
        fqn = key.fqn
        ckey = (df.path, info.offset, info.length, fqn)
        hit = cache.get(ckey)
        if hit is not None:
            return hit
        if self._chain(info, fqn):
            packed = self._read_bytes(df, info.offset, info.length)
            self._header_bytes -= info.length  # item data, counted in bytes_read
            self._data_bytes += info.length
            stored = self.stored_from_bytes(packed, info, key, df.path)
        else:
            # A torch.save archive or a SAFETENSORS blob: libckptio tells which
            # and where the tensor's storage is (dcp_item.c), reading only
            # headers. A blob's header serves its file's other tensors.
            df.check(info.offset, 0, f"item '{fqn}'")
            hkey = ("header", df.path, info.offset)
            header = cache.get(hkey)
            if header is None:
                header = cache.pop(("edges",) + hkey, None)  # read with others' (read_headers_together)
            if header is None:
                header, nbytes, tensors = _ckptio.dcp_header_read(df.file, info.offset, info.length)
                self._header_bytes += nbytes
                if tensors > 1:
                    cache[hkey] = header
            stored = _Stored(*_ckptio.dcp_header_layout(header, fqn))
        cache[ckey] = stored
        return stored

    # ---- reading --------------------------------------------------------------------------
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        sched = _broadcast.schedule_of(plan)
        shared_keys = _broadcast.shared_keys(sched) if sched is not None else set()
        shared: Dict[Any, List[ReadItem]] = {}
        files: Dict[str, _DataFile] = {}
        cache: Dict = {}
        self._header_bytes = self._data_bytes = 0
        stats = {"bytes_read": 0, "header_bytes": 0, "bytes_broadcast_sent": 0, "bytes_received": 0,
                 "items_shared": 0}
        try:
            error: Optional[BaseException] = None
            try:
                for req in plan.items:
                    if req.storage_index in shared_keys:
                        shared.setdefault(req.storage_index, []).append(req)
                self._read_direct([r for r in plan.items if r.storage_index not in shared_keys], planner, files,
                                  cache)
            except BaseException as e:
                if sched is None:
                    raise
                error = e  # every other rank must learn of it before giving up (no hang)
            if sched is not None:
                _broadcast.run(self, sched, self.process_group, shared, planner, files, cache, error, stats)
        finally:
            for df in files.values():
                df.file.close()
            stats["bytes_read"] += self._data_bytes
            stats["header_bytes"] = self._header_bytes
            self.last_read_stats = stats
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_direct(self, items: List[ReadItem], planner: LoadPlanner, files: Dict[str, _DataFile],
                     cache: Dict) -> None:
        """Reads this rank's own items: one engine plan for all of them or, when they lie in more data
        files than a reader keeps open at once (_files.window), one plan per window of files, in file
        order, each window's files closed after it: descriptors stay bounded whatever the file count."""
        def rel(req: ReadItem):
            return self.storage_data[req.storage_index].relative_path

        window = _files.window(len({rel(r) for r in items}))
        if not window:
            self._read_window(items, planner, files, cache)
            return
        order = sorted(items, key=lambda r: str(rel(r)))
        start = 0
        while start < len(order):
            names: set = set()
            end = start
            while end < len(order) and (rel(order[end]) in names or len(names) < window):
                names.add(rel(order[end]))
                end += 1
            self._read_window(order[start:end], planner, files, cache)
            for name in names:
                files.pop(name).file.close()
            start = end

    def read_headers_together(self, items: List[ReadItem], files: Dict[str, _DataFile], cache: Dict) -> None:
        """In object storage, where each read is a round trip: reads the first and last
        HEADER_WINDOW bytes of the plain tensor items of `items` (as libckptio's own header read
        does, one item after another) in one engine plan, their ranged GETs in flight together
        (the windows of neighbouring items in one GET), and parses their headers from there
        (ckptio_dcp_header_windows, the same checks) into `cache` for stored_chunk. Archives with a
        record between the windows get larger windows in one more plan (HEADER_RETRY_BATCH at a
        time). An item still not described (a SAFETENSORS blob, bytes outside the file) is left to
        stored_chunk, which reads it as before. Local files are read where they are needed."""
        if not _ckptio.path_is_object(os.fspath(self.path)):
            return
        pending: Dict[tuple, tuple] = {}
        for req in items:
            info = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO or info.transform_descriptors:
                continue
            df = self.data_file(files, info.relative_path)
            hkey = ("header", df.path, info.offset)
            if hkey in cache or hkey in pending or not 0 < info.length <= df.size - min(info.offset, df.size):
                continue
            pending[hkey] = (df, info.offset, info.length)
        # Records that lie between the windows (a large pickle, a storage shared by several tensors with
        # records after it): those items' windows again, larger, all in one more plan.
        retry = list(self._headers_from_windows(pending, HEADER_WINDOW, cache).items())
        for i in range(0, len(retry), HEADER_RETRY_BATCH):
            self._headers_from_windows(dict(retry[i:i + HEADER_RETRY_BATCH]), HEADER_WINDOW_RETRY, cache)

    def _headers_from_windows(self, pending: Dict[tuple, tuple], window: int, cache: Dict) -> Dict[tuple, tuple]:
        """Reads the first and last `window` bytes of the items of `pending` ({hkey: (df, offset, length)}) in
        one engine plan and describes them from there into `cache`; returns the items these windows could
        not describe though they begin as a zip archive (a record between the windows) and are larger."""
        # Each item's two windows, then neighbouring windows of one file merged into one range: the tail of
        # an item and the head of the next (items lie back to back) come in one GET, whose fixed cost (a
        # round trip, the server's work per request) outweighs the padding between them.
        wins: List[tuple] = []  # (file, start, end, (item index, 0 head / 1 tail))
        items_list = list(pending.items())
        for i, (hkey, (df, offset, length)) in enumerate(items_list):
            n = min(length, window)
            if length <= 2 * n:
                wins.append((df.file, offset, offset + length, (i, 0)))
            else:
                wins.append((df.file, offset, offset + n, (i, 0)))
                wins.append((df.file, offset + length - n, offset + length, (i, 1)))
        if not wins:
            return {}
        wins.sort(key=lambda w: (id(w[0]), w[1]))
        views: Dict[Tuple[int, int], torch.Tensor] = {}
        extents: List[tuple] = []
        starts = {w[3]: w[1] for w in wins}
        ends = {w[3]: w[2] for w in wins}
        for f, lo, hi, held in _close_ranges(wins, HEADER_MERGE_GAP, max(HEADER_RANGE_MAX, 2 * window)):
            buf = torch.empty(hi - lo, dtype=torch.uint8)
            extents.append((f, buf.data_ptr(), hi - lo, lo, _adapt.MEM_HOST))
            for w in held:
                views[w] = buf[starts[w] - lo:ends[w] - lo]
        _ckptio.dcp_read(extents, self.engine)
        self._header_bytes += sum(e[2] for e in extents)
        retry: Dict[tuple, tuple] = {}
        for i, (hkey, (df, offset, length)) in enumerate(items_list):
            head = views[(i, 0)]
            tail = views.get((i, 1), head)
            header = _ckptio.dcp_header_windows(df.path, df.size, offset, length, head.data_ptr(), head.numel(),
                                                tail.data_ptr(), tail.numel())
            if header is not None:
                cache[("edges",) + hkey] = header
            elif tail is not head and bytes(head[:4].numpy()) == ZIP_MAGIC:
                retry[hkey] = (df, offset, length)
        return retry

    def _read_window(self, items: List[ReadItem], planner: LoadPlanner, files: Dict[str, _DataFile],
                     cache: Dict) -> None:
        """Reads `items`, one engine plan for all of them, their headers read HEADER_BATCH
        items at a time (read_headers_together) as their extents are planned."""
        extents: List[tuple] = []
        finish: List[Tuple[ReadItem, Any, Any]] = []  # (req, target, source to copy from or None)
        byte_reqs: List[Tuple[ReadItem, torch.Tensor, bool, str, int]] = []
        spans: List[_spans.Span] = []
        for i, req in enumerate(items):
            if i % HEADER_BATCH == 0:
                self.read_headers_together(items[i:i + HEADER_BATCH], files, cache)
            info = self.storage_data[req.storage_index]
            df = self.data_file(files, info.relative_path)
            if req.type == LoadItemType.BYTE_IO:
                self._chain(info, req.storage_index.fqn)
                df.check(info.offset, info.length, f"byte item '{req.storage_index.fqn}'")
                buf = torch.empty(info.length, dtype=torch.uint8)
                if info.length:
                    extents.append((df.file, buf.data_ptr(), info.length, info.offset, _adapt.MEM_HOST))
                byte_reqs.append((req, buf, info, df.path))
                continue
            stored = self.stored_chunk(df, info, req.storage_index, cache)
            target = self.read_target(planner, req)
            src = self.plan_slice(df, stored, req, target, extents, spans)
            finish.append((req, target, src))
        if extents:
            self._data_bytes += sum(e[2] for e in extents)
            _read_coalesced(extents, self.engine, _ckptio.path_is_object(os.fspath(self.path)))
        if spans:
            self._data_bytes += _spans.read(spans, self.engine, _spans.BUDGET)
        for req, buf, info, path in byte_reqs:
            planner.load_bytes(req, self.byte_item(buf, info, req.storage_index.fqn, path))
        for req, target, src in finish:
            if src is not None:
                target.copy_(src() if callable(src) else src)
            planner.commit_tensor(req, target)

    def plan_slice(self, df: _DataFile, stored: _Stored, req: ReadItem, target: torch.Tensor, extents: List,
                   spans: List):
        """Adds the extents that bring the requested slice in, or the spans
        (ckptio.dcp._spans) that cover it; returns what must then be copied
        into target (None when the bytes land there or the spans cut them)."""
        offs, lens = tuple(req.storage_offsets), tuple(req.lengths)
        ndim = len(stored.shape)
        if len(offs) != ndim or any(o + n > s for o, n, s in zip(offs, lens, stored.shape)):
            raise _format_error(df.path, stored.base, f"slice offsets {list(offs)} lengths {list(lens)} lie outside "
                                f"the stored chunk of shape {list(stored.shape)}")
        esize = torch.empty((), dtype=stored.dtype).element_size()
        if any(n == 0 for n in lens):
            return None
        if stored.decoded is not None:
            # A decoded (transformed) item: libckptio copies the slice out of it, from memory or from the
            # zstd frames as they decompress, into the target when it is in host memory with the stored dtype,
            # else into a temporary of the slice's size.
            direct = target.device.type == "cpu" and target.dtype == stored.dtype
            dest = target if direct else torch.empty(lens, dtype=stored.dtype)
            reach = sum((n - 1) * st for n, st in zip(dest.shape, dest.stride()))
            _ckptio.dcp_header_read_box(stored.decoded, req.storage_index.fqn, offs, lens, dest.data_ptr(),
                                        dest.stride(), (reach + 1) * esize)
            return None if direct else dest
        first = stored.storage_offset + sum(o * st for o, st in zip(offs, stored.stride))
        last = first + sum((n - 1) * st for n, st in zip(lens, stored.stride))
        if (last + 1) * esize > stored.storage_nbytes:
            raise _format_error(df.path, stored.base, f"slice offsets {list(offs)} lengths {list(lens)} reach "
                                f"element {last} of a storage of {stored.storage_nbytes} bytes")
        if not stored.contiguous():
            # A strided chunk (torch.save keeps strides): read the span, cut it on the target's device.
            _spans.plan(df, stored.base, first, lens, stored.stride, esize, stored.dtype, target, spans,
                        _spans.BUDGET)
            return None
        # C-contiguous chunk: one run of consecutive bytes per index over the outer dimensions.
        nruns, run_elems, outer_dims = _spans.runs(stored.shape, offs, lens)
        run_bytes = run_elems * esize
        if nruns > _spans.MAX_RUNS or _spans.short_runs_as_span(nruns, run_bytes, (last - first + 1) * esize):
            # the span that covers it, cut on the target's device
            _spans.plan(df, stored.base, first, lens, stored.stride, esize, stored.dtype, target, spans,
                        _spans.BUDGET)
            return None
        same_dtype = target.dtype == stored.dtype
        direct = same_dtype and target.is_contiguous() and target.device.type in ("cpu", "cuda")
        dest = target if direct else torch.empty(lens, dtype=stored.dtype, device=target.device
                                                 if target.device.type in ("cpu", "cuda") else "cpu")
        if dest.device.type == "cuda":
            kind = _adapt.MEM_CUDA
            _adapt.sync_current_stream({dest.device.index})
        else:
            kind = _adapt.host_kind(dest)
        addr = dest.data_ptr()
        idx = [0] * len(outer_dims)
        for r in range(nruns):
            elem = first + sum(i * stored.stride[d] for i, d in zip(idx, outer_dims))
            extents.append((df.file, addr + r * run_bytes, run_bytes, stored.base + elem * esize, kind))
            for k in range(len(idx) - 1, -1, -1):  # next index, last dim fastest
                idx[k] += 1
                if idx[k] < lens[outer_dims[k]]:
                    break
                idx[k] = 0
        return None if direct else dest


__all__ = ["FileSystemReader"]
