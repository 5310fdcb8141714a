"""Load once, broadcast: stored bytes that several ranks need are read by one
rank (the owner) and sent to the others over torch.distributed.

Planning (prepare_global_plan, on the coordinator, which sees every rank's
LoadPlan): a stored item is *shared* when two or more ranks need a common
byte of it (their requested slices of the chunk intersect; byte items and
zstd items, which are read whole, whenever two ranks read them). Each shared
item gets an owner among the ranks that need it (largest first, to the
least loaded of them) and a byte range: the elements from the first to the
last one any rank needs (C order of the chunk), or the whole item for
byte/zstd items. Every plan gets the same ordered list of segments, cut into
batches of at most ``budget`` bytes (one larger item makes a batch alone).

Reading (read_data, every rank walks the batches in the same order) is
ckptio._group_read's engine, shared with the multi-rank model load: the
owners read their segments of the batch through the engine straight into a
device buffer (CUDA for NCCL, host - pinned when CUDA exists - otherwise);
one all_reduce of a small int64 vector carries every rank's status and the
exact length of every segment; then each owner broadcasts its segments (one
contiguous buffer per owner and batch) and every rank that needs an item
cuts its slices out of the buffer (_Segments.deliver). A rank that failed
(before or during the batches) reports it in the status vector, so every
rank stops at the same batch and raises the same CkptioError (the lowest
failing rank's, "load-once broadcast stopped: rank(s) [...] ...") instead of
waiting for data that never comes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from .. import _batches, _ckptio, _group_read

STAMP = "ckptio.broadcast"
ALIGN = _group_read.ALIGN
KIND_TENSOR, KIND_WHOLE = 0, 1  # a range of a tensor chunk's elements / the whole stored item


_dist = _group_read.dist_module


def local_stamp(mode, group, use_collectives: bool) -> Optional[dict]:
    """What prepare_local_plan puts into storage_data: this rank's position in
    the reader's group, or None when this rank does not take part (then the
    coordinator plans no sharing for anyone)."""
    dist = _dist()
    if mode is False or not use_collectives or dist is None:
        return None
    world = dist.get_world_size(group)
    if world < 2:
        return None
    return {STAMP: 1, "rank": dist.get_rank(group), "world": world}


def _rects_intersect(a: Tuple, b: Tuple) -> bool:
    (ao, al), (bo, bl) = a, b
    return all(max(x, y) < min(x + n, y + m) for x, n, y, m in zip(ao, al, bo, bl))


def _chunk_shape(md_entry, index) -> Optional[Tuple[int, ...]]:
    if not isinstance(md_entry, TensorStorageMetadata):
        return None
    want = tuple(index.offset) if index.offset is not None else None
    for chunk in md_entry.chunks:
        if tuple(chunk.offsets) == want:
            return tuple(chunk.sizes)
    return None


def plan_global(plans: List[LoadPlan], storage_data: Dict, state_md: Dict, budget: int) -> List[LoadPlan]:
    """The coordinator's step: the shared segments, their owners and batches,
    put into every plan's storage_data (unchanged plans when not all ranks
    take part or nothing is shared)."""
    world = len(plans)
    stamps = [p.storage_data for p in plans]
    if world < 2 or not all(isinstance(s, dict) and s.get(STAMP) == 1 and s.get("world") == world
                            and s.get("rank") == i for i, s in enumerate(stamps)):
        return [dataclasses.replace(p, storage_data=None) if isinstance(p.storage_data, dict)
                and STAMP in p.storage_data else p for p in plans]
    uses: Dict[Any, List[Tuple[int, ReadItem]]] = {}
    for rank, plan in enumerate(plans):
        for req in plan.items:
            uses.setdefault(req.storage_index, []).append((rank, req))
    segments = []
    for key, reqs in uses.items():
        ranks = sorted({r for r, _ in reqs})
        if len(ranks) < 2:
            continue
        info = storage_data.get(key)
        if info is None:
            continue  # read_data reports the missing item on the direct path
        whole = reqs[0][1].type == LoadItemType.BYTE_IO or bool(info.transform_descriptors)
        if whole:
            segments.append([key, KIND_WHOLE, 0, 0, None, ranks, info.length, info])
            continue
        shape = _chunk_shape(state_md.get(key.fqn), key)
        if shape is None:
            continue
        rects = [(r, tuple(q.storage_offsets), tuple(q.lengths)) for r, q in reqs if all(q.lengths)]
        if not any(ra != rb and _rects_intersect((oa, la), (ob, lb))
                   for i, (ra, oa, la) in enumerate(rects) for rb, ob, lb in rects[i + 1:]):
            continue  # disjoint slices: each rank reads its own bytes directly
        stride, acc = [], 1
        for s in reversed(shape):
            stride.append(acc)
            acc *= s
        stride.reverse()
        lo = min(sum(o * st for o, st in zip(offs, stride)) for _, offs, _ in rects)
        hi = max(sum((o + n - 1) * st for o, n, st in zip(offs, lens, stride)) for _, offs, lens in rects) + 1
        esize = state_md[key.fqn].properties.dtype.itemsize
        segments.append([key, KIND_TENSOR, lo, hi, shape, ranks, (hi - lo) * esize, info])
    if not segments:
        return [dataclasses.replace(p, storage_data=None) for p in plans]
    # Owners: largest segments first, each to the least loaded rank that needs it.
    load = [0] * world
    for seg in sorted(segments, key=lambda s: -s[6]):
        owner = min(seg[5], key=lambda r: (load[r], r))
        load[owner] += seg[6]
        seg[5] = owner
    # Storage order (file, offset): owners' reads go forward through the files.
    segments.sort(key=lambda s: (s[7].relative_path, s[7].offset, s[2]))
    # Within a batch, each owner's segments are adjacent (one broadcast per owner).
    batches = [sorted((tuple(s[:7]) for s in b), key=lambda s: s[5])
               for b in _batches.by_budget(segments, lambda s: s[6], budget)]
    sched = {STAMP: 1, "world": world, "batches": batches}
    return [dataclasses.replace(p, storage_data=sched) for p in plans]


def schedule_of(plan: LoadPlan) -> Optional[dict]:
    sd = plan.storage_data
    return sd if isinstance(sd, dict) and sd.get(STAMP) == 1 and "batches" in sd else None


def shared_keys(sched: dict) -> set:
    return {seg[0] for batch in sched["batches"] for seg in batch}


def _device_of(group) -> torch.device:
    return _group_read.exchange_device(group)


def _source_range(reader, files, cache, seg) -> Tuple[Any, int, int, Any]:
    """(data file, file offset, byte length, element of the storage at the
    segment's first byte or None) of a segment, as owner and users agree."""
    key, kind, lo, hi, shape, _, _ = seg
    info = reader.storage_data[key]
    df = reader.data_file(files, info.relative_path)
    if kind == KIND_WHOLE:
        df.check(info.offset, info.length, f"item '{key.fqn}'")
        return df, info.offset, info.length, None
    stored = reader.stored_chunk(df, info, key, cache)
    esize = stored.dtype.itemsize
    if stored.contiguous() and tuple(stored.shape) == tuple(shape):
        first = stored.storage_offset + lo
        if (stored.storage_offset + hi) * esize > stored.storage_nbytes:
            raise reader.format_error(df.path, stored.base, f"tensor '{key.fqn}' needs elements up to "
                                f"{stored.storage_offset + hi} of a storage of {stored.storage_nbytes} bytes")
        return df, stored.base + first * esize, (hi - lo) * esize, first
    return df, stored.base, stored.storage_nbytes, 0  # strided chunk: its whole storage


def _cut(reader, files, cache, seg, buf: torch.Tensor, reqs: List[ReadItem], planner) -> None:
    """Copies the requested slices out of a received segment and commits them."""
    key, kind = seg[0], seg[1]
    info = reader.storage_data[key]
    if kind == KIND_WHOLE:
        host = buf.cpu() if buf.device.type != "cpu" else buf
        df = reader.data_file(files, info.relative_path)
        stored = None
        for req in reqs:
            if req.type == LoadItemType.BYTE_IO:
                # Checked by the restricted unpickler on every rank (as read directly).
                planner.load_bytes(req, reader.byte_item(host, info, key.fqn, df.path))
                continue
            if stored is None:  # a transformed tensor item: each rank decodes the shared bytes
                stored = reader.stored_from_bytes(host, info, key, df.path)
            target = reader.read_target(planner, req)
            src = reader.plan_slice(df, stored, req, target, [], [])  # decoded: a view of memory
            if src is not None:
                target.copy_(src)
            planner.commit_tensor(req, target)
        return
    df, off, n, first = _source_range(reader, files, cache, seg)
    if n != buf.numel():
        raise reader.format_error(df.path, off, f"shared bytes of tensor '{key.fqn}': the owner sent {buf.numel()} "
                            f"bytes where this rank expects {n}")
    stored = reader.stored_chunk(df, info, key, cache)
    for req in reqs:
        target = reader.read_target(planner, req)
        lens = tuple(req.lengths)
        if all(lens):
            typed = buf.view(stored.dtype)
            start = stored.storage_offset + sum(o * st for o, st in zip(req.storage_offsets, stored.stride)) - first
            target.copy_(typed.as_strided(lens, stored.stride, typed.storage_offset() + start))
        planner.commit_tensor(req, target)


class _Segments:
    """The shared segments of one read_data call, as ckptio._group_read's
    engine asks about them: every segment is broadcast by its owner."""

    def __init__(self, reader, files, cache, shared: Dict[Any, List[ReadItem]], planner):
        self.reader, self.files, self.cache, self.shared, self.planner = reader, files, cache, shared, planner

    @staticmethod
    def owner(seg) -> int:
        return seg[5]

    @staticmethod
    def pieces(seg) -> None:
        return None

    def length(self, seg) -> int:
        return _source_range(self.reader, self.files, self.cache, seg)[2]

    def reads(self, segs, places, kind):
        extents = []
        for seg, (addr, n) in zip(segs, places):
            df, off, _, _ = _source_range(self.reader, self.files, self.cache, seg)
            extents.append((df.file, addr, n, off, kind))
        engine = self.reader.engine
        return lambda: _ckptio.dcp_read(extents, engine)

    def deliver(self, seg, parts) -> None:
        reqs = self.shared.get(seg[0])
        if reqs:
            _cut(self.reader, self.files, self.cache, seg, parts[0], reqs, self.planner)


def run(reader, sched: dict, group, shared: Dict[Any, List[ReadItem]], planner, files, cache,
        error: Optional[BaseException], stats: Dict[str, int]) -> None:
    """Walks the batches with every other rank (ckptio._group_read.run);
    raises, on every rank, the same CkptioError when any rank failed."""
    dist = _dist()
    if dist is None or dist.get_world_size(group) != sched["world"]:
        raise RuntimeError(f"{reader.path}: the load plan shares items over {sched['world']} ranks but this "
                           "process group has another size (pass the group of dcp.load as process_group=)")
    batches = sched["batches"]
    stats["items_shared"] = sum(len(b) for b in batches)
    moved = {"bytes_read": 0, "bytes_sent": 0, "bytes_received": 0}
    try:
        _group_read.run(_Segments(reader, files, cache, shared, planner), batches, group, _device_of(group), error,
                        moved, str(reader.path))
    finally:
        stats["bytes_read"] += moved["bytes_read"]
        stats["bytes_broadcast_sent"] += moved["bytes_sent"]
        stats["bytes_received"] += moved["bytes_received"]


__all__ = ["local_stamp", "plan_global", "schedule_of", "shared_keys", "run"]
