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

Reading (read_data, every rank walks the batches in the same order): the
owners read their segments of the batch through the engine straight into a
device buffer (CUDA for NCCL, host - pinned when CUDA exists - otherwise);
then one all_reduce of a small int64 vector carries every rank's status and
the exact length of every segment; then each owner broadcasts its segments
(one contiguous buffer per owner and batch) and every rank that needs an
item cuts its slices out of the buffer. A rank that failed (before or
during the batches) reports it in the status vector, so every rank stops at
the same batch and raises instead of waiting for data that never comes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from .. import _adapt, _ckptio

STAMP = "ckptio.broadcast"
ALIGN = 64  # segment starts inside a buffer: any dtype can be viewed there
KIND_TENSOR, KIND_WHOLE = 0, 1  # a range of a tensor chunk's elements / the whole stored item


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


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
    batches, cur, size = [], [], 0
    for seg in segments:
        if cur and size + seg[6] > budget:
            batches.append(cur)
            cur, size = [], 0
        cur.append(tuple(seg[:7]))
        size += seg[6]
    batches.append(cur)
    # Within a batch, each owner's segments are adjacent (one broadcast per owner).
    batches = [sorted(b, key=lambda s: s[5]) for b in batches]
    sched = {STAMP: 1, "world": world, "batches": batches}
    return [dataclasses.replace(p, storage_data=sched) for p in plans]


def schedule_of(plan: LoadPlan) -> Optional[dict]:
    sd = plan.storage_data
    return sd if isinstance(sd, dict) and sd.get(STAMP) == 1 and "batches" in sd else None


def shared_keys(sched: dict) -> set:
    return {seg[0] for batch in sched["batches"] for seg in batch}


class PeerFailure(RuntimeError):
    """Another rank failed while reading shared items."""


class _Arena:
    """One reusable byte buffer per read_data call (grown when needed)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buf: Optional[torch.Tensor] = None

    def get(self, nbytes: int, keep: int = 0) -> torch.Tensor:
        """At least nbytes; the first ``keep`` bytes survive a reallocation."""
        if self.buf is None or self.buf.numel() < nbytes:
            cap = max(nbytes, 2 * self.buf.numel() if self.buf is not None else 0, ALIGN)
            pin = self.device.type == "cpu" and torch.cuda.is_available()
            new = torch.empty(cap, dtype=torch.uint8, device=self.device, pin_memory=pin)
            if keep:
                new[:keep].copy_(self.buf[:keep])
            self.buf = new
        return self.buf


def _device_of(group) -> torch.device:
    dist = _dist()
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
            src = reader.plan_slice(df, stored, req, target, [])
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


class _OwnerReads:
    """The owner's reads of one batch, started ahead: while batch k is
    broadcast, the reads of batch k+1 run on a helper thread (the engine call
    releases the GIL) into the other of two arenas."""

    def __init__(self, reader, files, cache, batch, me, arena: _Arena, pool):
        self.own = [i for i, seg in enumerate(batch) if seg[5] == me]
        self.lengths = [0] * len(batch)
        self.arena = arena
        self.future = None
        self.nread = 0
        ranges = {i: _source_range(reader, files, cache, batch[i]) for i in self.own}
        total = sum(_align(ranges[i][2]) for i in self.own)
        send = arena.get(total)
        device = arena.device
        if device.type == "cuda":
            _adapt.sync_current_stream({device.index})  # earlier copies out of this arena are done
        kind = _adapt.MEM_CUDA if device.type == "cuda" else (
            _adapt.MEM_PINNED if send.is_pinned() else _adapt.MEM_HOST)
        extents, pos = [], 0
        for i in self.own:
            df, off, n, _ = ranges[i]
            if n:
                extents.append((df.file, send.data_ptr() + pos, n, off, kind))
            self.lengths[i] = n
            pos += _align(n)
        self.nread = sum(e[2] for e in extents)
        if extents:
            if pool is not None:
                self.future = pool.submit(_ckptio.dcp_read, extents, reader.engine)
            else:
                _ckptio.dcp_read(extents, reader.engine)

    def wait(self) -> None:
        if self.future is not None:
            fut, self.future = self.future, None
            fut.result()


def run(reader, sched: dict, group, shared: Dict[Any, List[ReadItem]], planner, files, cache,
        error: Optional[BaseException], stats: Dict[str, int]) -> None:
    """Walks the batches with every other rank; raises this rank's error, or
    PeerFailure when another rank failed."""
    from concurrent.futures import ThreadPoolExecutor

    dist = _dist()
    if dist is None or dist.get_world_size(group) != sched["world"]:
        raise RuntimeError(f"{reader.path}: the load plan shares items over {sched['world']} ranks but this "
                           "process group has another size (pass the group of dcp.load as process_group=)")
    world, me = sched["world"], dist.get_rank(group)
    device = _device_of(group)
    arenas = [_Arena(device), _Arena(device)]
    batches = sched["batches"]
    stats["items_shared"] = sum(len(b) for b in batches)
    pool = ThreadPoolExecutor(1, thread_name_prefix="ckptio-dcp-bcast") if len(batches) > 1 else None
    ahead: Optional[_OwnerReads] = None
    try:
        for k, batch in enumerate(batches):
            arena = arenas[k % 2]
            reads = ahead
            ahead = None
            if error is None:
                try:
                    if reads is None:
                        reads = _OwnerReads(reader, files, cache, batch, me, arena, None)
                    reads.wait()
                    stats["bytes_read"] += reads.nread
                except BaseException as e:  # reported to every rank below
                    error = e
            own = reads.own if reads is not None else [i for i, seg in enumerate(batch) if seg[5] == me]
            ctrl = torch.zeros(world + len(batch), dtype=torch.int64)
            ctrl[me] = 1 if error is not None else 0
            for i in own:
                ctrl[world + i] = reads.lengths[i] if error is None else 0
            ctrl = ctrl.to(device)
            dist.all_reduce(ctrl, group=group)
            ctrl = ctrl.cpu().tolist()
            failed = [r for r in range(world) if ctrl[r]]
            if failed:
                if error is not None:
                    raise error
                raise PeerFailure(f"{reader.path}: load-once broadcast stopped: rank(s) {failed} of the process "
                                  "group failed to read or use shared items (their errors name the file and offset)")
            lengths = ctrl[world:]
            sent = sum(_align(lengths[i]) for i in own)
            need = sent + sum(_align(n) for i, n in enumerate(lengths) if batch[i][5] != me)
            area = arena.get(need, keep=sent)
            if pool is not None and k + 1 < len(batches):
                try:  # the next batch's reads overlap this batch's broadcasts
                    ahead = _OwnerReads(reader, files, cache, batches[k + 1], me, arenas[(k + 1) % 2], pool)
                except BaseException as e:
                    error = e
            recv_pos = sent
            for owner in sorted({seg[5] for seg in batch}):
                idx = [i for i, seg in enumerate(batch) if seg[5] == owner]
                total = sum(_align(lengths[i]) for i in idx)
                if owner == me:
                    base = 0
                    stats["bytes_broadcast_sent"] += total
                else:
                    base = recv_pos
                    recv_pos += total
                    stats["bytes_received"] += total
                if total:
                    src = owner if group is None else dist.get_global_rank(group, owner)
                    dist.broadcast(area[base:base + total], src=src, group=group)
                if error is not None:
                    continue
                try:
                    pos = base
                    for i in idx:
                        reqs = shared.get(batch[i][0])
                        if reqs:
                            _cut(reader, files, cache, batch[i], area[pos:pos + lengths[i]], reqs, planner)
                        pos += _align(lengths[i])
                except BaseException as e:  # reported at the next batch's status exchange
                    error = e
    finally:
        if ahead is not None:
            try:
                ahead.wait()  # never leave a read running into memory that is about to be freed
            except BaseException:  # noqa: BLE001 - the load fails anyway; its first error is raised
                pass
        if pool is not None:
            pool.shutdown(wait=True)
    if error is not None:
        raise error


__all__ = ["local_stamp", "plan_global", "schedule_of", "shared_keys", "run", "PeerFailure"]
