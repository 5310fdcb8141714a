"""Load once, broadcast: stored bytes that several ranks need are read by one
rank (the owner) and sent to the others over torch.distributed.

Planning (prepare_global_plan, on the coordinator, which sees every rank's
LoadPlan): a stored item is *shared* when two or more ranks would read a
common byte of it (their requested slices of the chunk intersect, or one is
read as its span - ckptio.dcp._spans: columns of a row-sharded matrix - and
reaches into the other's range; byte items and zstd items, which are read
whole, whenever two ranks read them). Each shared
item gets an owner among the ranks that need it (largest first, to the
least loaded of them) and a byte range: the elements from the first to the
last one any rank needs (C order of the chunk), cut into pieces of whole
rows of the chunk's first dimension when larger than ``budget``, or the
whole item for byte/zstd items. Every plan gets the same ordered list of
segments, cut into batches of at most ``budget`` bytes (one larger row or
byte/zstd item makes a batch alone).

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
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from .. import _batches, _ckptio, _group_read
from . import _spans

STAMP = "ckptio.broadcast"
ALIGN = _group_read.ALIGN
KIND_TENSOR, KIND_WHOLE = 0, 1  # a range of a tensor chunk's elements / the whole stored item


_dist = _group_read.dist_module


def auto_shares(backend: str, cuda: bool, remote: bool) -> bool:
    """The rule of ``broadcast="auto"``: share where reading once is cheaper than
    every rank reading. In object storage (s3://) every read is a request over
    the network, billed and rate-limited, so it is read once whatever the
    collective. Over NCCL (the backend includes it and CUDA is there) the bytes
    move between GPUs faster than storage gives them. Over any other backend
    (gloo: host memory through TCP, one thread per collective) a broadcast is
    slower than each rank reading a local or page-cached file (BENCHMARKS.md,
    "Small checkpoints (DCP)"), so every rank reads its own bytes. The same on
    every rank (one backend, one path)."""
    return remote or ("nccl" in backend.lower() and cuda)


def local_stamp(mode, group, use_collectives: bool, remote: bool = False) -> Optional[dict]:
    """What prepare_local_plan puts into storage_data: this rank's position in
    the reader's group, or None when this rank does not take part (then the
    coordinator plans no sharing for anyone). ``remote``: the checkpoint is in
    object storage (see auto_shares)."""
    dist = _dist()
    if mode is False or not use_collectives or dist is None:
        return None
    world = dist.get_world_size(group)
    if world < 2:
        return None
    if mode == "auto" and not auto_shares(str(dist.get_backend(group)), torch.cuda.is_available(), remote):
        return None
    return {STAMP: 1, "rank": dist.get_rank(group), "world": world}


def _rects_intersect(a: Tuple, b: Tuple) -> bool:
    (ao, al), (bo, bl) = a, b
    return all(max(x, y) < min(x + n, y + m) for x, n, y, m in zip(ao, al, bo, bl))


def _read_twice(shape, a: Tuple, a_ends: Tuple[int, int], b: Tuple, b_ends: Tuple[int, int]) -> bool:
    """Whether two ranks reading slices a and b ((offsets, lengths)) of a
    C-contiguous chunk each on its own would read some stored byte twice: the
    slices intersect, or one of them is read as its span (more than MAX_RUNS
    runs: half the columns of a row-sharded matrix, say) and the two reach
    into each other's range of the chunk. Columns of such a chunk split over
    2 ranks would otherwise be read whole by both."""
    if _rects_intersect(a, b):
        return True
    spans = _spans.read_as_span(shape, *a) or _spans.read_as_span(shape, *b)
    return spans and max(a_ends[0], b_ends[0]) <= min(a_ends[1], b_ends[1])


def _row_pieces(lo: int, hi: int, row: int, esize: int, budget: int) -> List[Tuple[int, int]]:
    """Elements [lo, hi) of a chunk (C order, `row` elements per index of its
    first dimension) cut at row boundaries into pieces of at most `budget`
    bytes (at least one row each), so that a shared chunk larger than a batch
    is not held whole on every rank."""
    if (hi - lo) * esize <= budget:
        return [(lo, hi)]
    per = max(1, budget // (row * esize))
    out, start = [], lo
    while start < hi:
        end = min(hi, (start // row + per) * row)
        out.append((start, end))
        start = end
    return out


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
        stride, acc = [], 1
        for s in reversed(shape):
            stride.append(acc)
            acc *= s
        stride.reverse()
        # Each slice's first and last element in the chunk's C order.
        ends = [(sum(o * st for o, st in zip(offs, stride)),
                 sum((o + n - 1) * st for o, n, st in zip(offs, lens, stride))) for _, offs, lens in rects]
        if not any(ra != rb and _read_twice(shape, (oa, la), ea, (ob, lb), eb)
                   for i, ((ra, oa, la), ea) in enumerate(zip(rects, ends))
                   for (rb, ob, lb), eb in zip(rects[i + 1:], ends[i + 1:])):
            continue  # disjoint bytes: each rank reads its own directly
        lo = min(first for first, _ in ends)
        hi = max(last for _, last in ends) + 1
        esize = state_md[key.fqn].properties.dtype.itemsize
        for a, b in _row_pieces(lo, hi, max(1, stride[0]) if shape else 1, esize, budget):
            segments.append([key, KIND_TENSOR, a, b, shape, ranks, (b - a) * esize, info])
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


def _rows_are_ranges(stored, shape) -> bool:
    """Whether the stored chunk is C-contiguous in the planned shape, so that a
    range of its elements (a row piece) is a range of its storage."""
    return stored.contiguous() and tuple(stored.shape) == tuple(shape)


def _source_range(reader, files, cache, seg, first_piece: bool) -> Tuple[Any, int, int, Any]:
    """(data file, file offset, byte length, element of the storage at the
    segment's first byte or None) of a segment, as owner and users agree.
    A strided chunk (torch's writer keeps a transposed tensor's strides) goes
    whole with its first row piece and its other pieces carry nothing: rows
    of it are not ranges of its storage."""
    key, kind, lo, hi, shape, _, _ = seg
    info = reader.storage_data[key]
    df = reader.data_file(files, info.relative_path)
    if kind == KIND_WHOLE:
        df.check(info.offset, info.length, f"item '{key.fqn}'")
        return df, info.offset, info.length, None
    stored = reader.stored_chunk(df, info, key, cache)
    esize = stored.dtype.itemsize
    if _rows_are_ranges(stored, shape):
        first = stored.storage_offset + lo
        if (stored.storage_offset + hi) * esize > stored.storage_nbytes:
            raise reader.format_error(df.path, stored.base, f"tensor '{key.fqn}' needs elements up to "
                                f"{stored.storage_offset + hi} of a storage of {stored.storage_nbytes} bytes")
        return df, stored.base + first * esize, (hi - lo) * esize, first
    return df, stored.base, stored.storage_nbytes if first_piece else 0, 0  # strided chunk: its whole storage


def _cut(reader, files, cache, seg, buf: torch.Tensor, reqs: List[ReadItem], planner,
         pending: Dict[int, Tuple[torch.Tensor, int]], first_piece: bool) -> None:
    """Copies the requested slices out of a received segment, and commits each
    once all its rows have come (a chunk larger than a batch comes in row
    pieces: `pending` holds the requests' targets and rows still to come
    between the pieces, by id of the request)."""
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
    df, off, n, first = _source_range(reader, files, cache, seg, first_piece)
    if n != buf.numel():
        raise reader.format_error(df.path, off, f"shared bytes of tensor '{key.fqn}': the owner sent {buf.numel()} "
                            f"bytes where this rank expects {n}")
    stored = reader.stored_chunk(df, info, key, cache)
    lo, hi, shape = seg[2], seg[3], seg[4]
    # The segment is rows [r_lo, r_hi) of the chunk's first dimension (_row_pieces), or part of one row at its
    # ends: every element a request has in those rows lies inside it.
    row = max(1, math.prod(shape[1:])) if shape else 1
    r_lo, r_hi = lo // row, -(-hi // row)
    if n == 0:
        return  # a strided chunk's later piece: its first brought every row
    if not _rows_are_ranges(stored, shape):
        r_lo, r_hi = 0, shape[0] if shape else 1  # a strided chunk's whole storage
    typed = buf.view(stored.dtype)
    for req in reqs:
        offs, lens = tuple(req.storage_offsets), tuple(req.lengths)
        target, left = pending.pop(id(req), (None, 0))
        if target is None:
            target = reader.read_target(planner, req)
            left = lens[0] if shape and all(lens) else 0  # rows still to come
        part = None
        if all(lens) and not shape:  # a 0-d chunk
            part, at = target, offs
        elif all(lens):
            a, b = max(offs[0], r_lo), min(offs[0] + lens[0], r_hi)
            if a < b:
                part, at = target.narrow(0, a - offs[0], b - a), (a,) + offs[1:]
                left -= b - a
        if part is not None:
            start = stored.storage_offset + sum(o * st for o, st in zip(at, stored.stride)) - first
            part.copy_(typed.as_strided(tuple(part.shape), stored.stride, typed.storage_offset() + start))
        if left > 0:
            pending[id(req)] = (target, left)
            continue
        planner.commit_tensor(req, target)


class _Segments:
    """The shared segments of one read_data call, as ckptio._group_read's
    engine asks about them: every segment is broadcast by its owner."""

    def __init__(self, reader, files, cache, shared: Dict[Any, List[ReadItem]], planner, batches):
        self.reader, self.files, self.cache, self.shared, self.planner = reader, files, cache, shared, planner
        self.pending: Dict[int, Tuple[torch.Tensor, int]] = {}  # requests with row pieces still to come
        self.first_lo: Dict[Any, int] = {}  # each tensor item's first row piece starts here
        for seg in (s for b in batches for s in b if s[1] == KIND_TENSOR):
            self.first_lo[seg[0]] = min(seg[2], self.first_lo.get(seg[0], seg[2]))

    def first_piece(self, seg) -> bool:
        return seg[1] != KIND_TENSOR or seg[2] == self.first_lo[seg[0]]

    @staticmethod
    def owner(seg) -> int:
        return seg[5]

    @staticmethod
    def pieces(seg) -> None:
        return None

    def length(self, seg) -> int:
        return _source_range(self.reader, self.files, self.cache, seg, self.first_piece(seg))[2]

    def reads(self, segs, places, kind):
        extents = []
        for seg, (addr, n) in zip(segs, places):
            df, off, _, _ = _source_range(self.reader, self.files, self.cache, seg, self.first_piece(seg))
            extents.append((df.file, addr, n, off, kind))  # _group_read leaves out segments of no bytes
        engine = self.reader.engine
        return lambda: _ckptio.dcp_read(extents, engine)

    def deliver(self, seg, parts) -> None:
        reqs = self.shared.get(seg[0])
        if reqs:
            _cut(self.reader, self.files, self.cache, seg, parts[0], reqs, self.planner, self.pending,
                 self.first_piece(seg))


def run(reader, sched: dict, group, shared: Dict[Any, List[ReadItem]], planner, files, cache,
        error: Optional[BaseException], stats: Dict[str, int]) -> None:
    """Walks the batches with every other rank (ckptio._group_read.run);
    raises, on every rank, the same CkptioError when any rank failed."""
    dist = _dist()
    if dist is None or dist.get_world_size(group) != sched["world"]:
        raise RuntimeError(f"{reader.path}: the load plan shares items over {sched['world']} ranks but this "
                           "process group has another size (pass the group of dcp.load as process_group=)")
    batches = sched["batches"]
    stats["items_shared"] = len(shared_keys(sched))  # items, not their row pieces
    moved = {"bytes_read": 0, "bytes_sent": 0, "bytes_received": 0}
    try:
        _group_read.run(_Segments(reader, files, cache, shared, planner, batches), batches, group, _device_of(group),
                        error, moved, str(reader.path))
    finally:
        stats["bytes_read"] += moved["bytes_read"]
        stats["bytes_broadcast_sent"] += moved["bytes_sent"]
        stats["bytes_received"] += moved["bytes_received"]


__all__ = ["local_stamp", "plan_global", "schedule_of", "shared_keys", "run"]
