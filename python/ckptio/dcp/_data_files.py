"""The data files of a ckptio.dcp save: torch's plan of one rank written
through libckptio's engine (TORCH_SAVE items in one plan for every file,
or SAFETENSORS blobs), committed unreferenced, with the checksums of the
written bytes carried to finish() in _HashedStorageInfo."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Any, Dict, List, Optional

from torch.distributed.checkpoint.filesystem import (
    DEFAULT_SUFFIX,
    SerializationFormat,
    _split_by_size_and_type,
    _StorageInfo,
)
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from .. import _adapt, _ckptio, _files
from . import _byte_items, _commit, _objects

# torch's keys in the __metadata__ of a SAFETENSORS data file (_hf_utils).
_ST_SHARDING_KEY = "DCP_SHARDING_INFO"
_ST_VERSION_KEY = "DCP_VERSION"
_ST_FORMAT_KEY = "format"

@dataclasses.dataclass
class HashedStorageInfo(_StorageInfo):
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


class DataFiles:
    """The data-file half of FileSystemWriter (mixed into it): write_data's
    work. Uses the writer's options (engine, checksums, crc, alignment,
    single_file_per_rank, thread_count, serialization_format, allow_pickle)
    and its state (path, _object, _descriptors, _reference)."""

    # This process's data files of a save, renamed, left open for finish()
    # to fsync with .metadata (the coordinator's own; other ranks fsync theirs).
    _pending: Optional[List[Any]] = None

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
            # fsyncs fewer. Objects handed over go on uploading their last
            # parts through torch's planning of finish(), and the commit
            # completes them beside the manifest's PUT.
            defer = getattr(self, "_is_coordinator", True)
            _ckptio.commit_unreferenced(files, self.engine, defer)
            if defer:  # a failed save leaves no temporary, only files (or aborted uploads) the next save removes
                self._close_pending()
                self._pending = files
        finally:
            if self._pending is not files:
                for f in files:
                    f.close()  # an uncommitted file is discarded
        del keep
        results = []
        file_of = {id(f): name for f, name in zip(files, names)}
        descriptors = list(self._descriptors) or None
        for wi, (f, _, _), (offset, length, xxh3, parts) in zip(order, payloads, placed):
            info = HashedStorageInfo(file_of[id(f)], offset, length, transform_descriptors=descriptors,
                                      xxh3=xxh3, data_offset=offset, data_length=length, parts=parts)
            results.append(WriteResult(index=wi.index, size_in_bytes=length, storage_data=info))
        return results

    def _close_pending(self) -> None:
        """Closes the data files handed over for finish() to fsync or complete
        (a save that failed before leaves local files unreferenced, which the
        next save removes; an object not completed has its upload aborted)."""
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
                info = HashedStorageInfo(name, 0, nbytes, xxh3=xxh3, data_offset=data_offset, data_length=nbytes,
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
                info = HashedStorageInfo(name, offset, length, xxh3=xxh3, data_offset=offset, data_length=length)
                results.append(WriteResult(index=wi.index, size_in_bytes=length, storage_data=info))
        return results
