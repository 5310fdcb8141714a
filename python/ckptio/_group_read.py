"""Read once, deliver over a process group: the batch engine shared by
ckptio.dcp's load-once broadcast (dcp/_broadcast.py) and the multi-rank
model load (_distributed.py).

A caller plans *segments*: byte ranges of stored data that one rank (the
owner) reads and that other ranks need. Every rank of the group gets the same
list of batches of segments and walks it in the same order. Per batch:

1. the owners read their segments through the engine into a reused buffer
   (CUDA when the group's backend is NCCL, host memory - pinned when CUDA
   exists - otherwise);
2. one ``all_reduce`` of a small int64 vector carries every rank's status and
   the exact length of every segment;
3. a *broadcast* segment goes to every rank (one ``broadcast`` per owner and
   batch, of all its broadcast segments); a *scatter* segment is cut by its
   owner into pieces, each rank receiving only its own (one
   ``all_to_all_single`` per batch with uneven splits), except in groups of
   up to 4 ranks, where it goes whole with the owner's broadcast and every
   other rank cuts its pieces out (:func:`scatter_whole` says why);
4. every rank hands what it got to ``source.deliver``.

With several batches the owner's reads of batch k+1 run on a helper thread
(the engine call releases the GIL) into a second buffer while batch k is
exchanged. A rank that failed - before the batches or during them - keeps
taking part and sets its status flag at the next exchange; a last exchange
after the final batch catches failures in it. Then every rank gathers the
failing ranks' errors (plain fields, ``all_gather_object``) and raises the
same :class:`CkptioError`, built from the lowest failing rank's error. No rank
waits for data that never comes.

The caller's ``source`` object says what the segments are (duck-typed):

* ``owner(seg) -> int``: the rank that reads it.
* ``pieces(seg) -> None | [(rank, nbytes), ...]``: None for a broadcast
  segment; else the pieces of a scatter segment, in a fixed order (the same
  on every rank).
* ``length(seg) -> int``: owner only: the bytes it reads.
* ``reads(segs, places, mem_kind) -> callable``: owner only: a job (run on
  the helper thread or inline) reading ``segs`` to ``places`` (address,
  length). Planning happens in ``reads`` itself, on the calling thread.
* ``pack(seg, data) -> [uint8 tensor, ...]``: a scatter segment's pieces
  cut out of its bytes, in ``pieces(seg)`` order (by its owner; by every
  rank when the segment travels whole, scatter_whole).
* ``deliver(seg, parts)``: every rank: ``[bytes]`` of a broadcast segment,
  or this rank's pieces of a scatter segment (maybe none).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

try:
    import torch
except ImportError:  # importable without torch; only DCP and group loads (which have torch) call it
    torch = None

from . import _adapt, _ckptio
from ._errors import CkptioError, make_error

ALIGN = 64  # segment starts inside a buffer: any dtype can be viewed there
STOPPED = "load-once broadcast stopped"


def dist_module():
    """torch.distributed when it is initialised, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def exchange_device(group, preferred: Optional[torch.device] = None) -> torch.device:
    """Where the collectives' buffers live: this rank's GPU when the group's
    backend includes NCCL (``preferred`` when it is a CUDA device, else the
    current device), host memory otherwise."""
    backend = str(dist_module().get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        if preferred is not None and preferred.type == "cuda":
            return preferred
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Arena:
    """One reusable byte buffer (grown when needed)."""

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


def _own_order(source, batch: Sequence, me: int) -> List[int]:
    """This rank's segments of a batch in buffer order: broadcast ones first
    (one contiguous buffer per owner), then scatter ones."""
    own = [i for i, seg in enumerate(batch) if source.owner(seg) == me]
    return sorted(own, key=lambda i: source.pieces(batch[i]) is not None)  # stable: batch order within each


class _OwnerReads:
    """The owner's reads of one batch, started ahead when a pool is given."""

    def __init__(self, source, batch: Sequence, me: int, arena: _Arena, pool):
        self.own = _own_order(source, batch, me)
        self.lengths = [0] * len(batch)
        self.pos: Dict[int, int] = {}
        self.future = None
        for i in self.own:
            self.lengths[i] = source.length(batch[i])
        self.size = sum(align(self.lengths[i]) for i in self.own)
        buf = arena.get(self.size)
        device = arena.device
        if device.type == "cuda":
            _adapt.sync_current_stream({device.index})  # earlier copies out of this arena are done
        kind = _adapt.MEM_CUDA if device.type == "cuda" else _adapt.host_kind(buf)
        places, segs, pos = [], [], 0
        for i in self.own:
            self.pos[i] = pos
            if self.lengths[i]:
                segs.append(batch[i])
                places.append((buf.data_ptr() + pos, self.lengths[i]))
            pos += align(self.lengths[i])
        self.nread = sum(n for _, n in places)
        if segs:
            job = source.reads(segs, places, kind)
            if pool is not None:
                self.future = pool.submit(job)
            else:
                job()

    def wait(self) -> None:
        if self.future is not None:
            fut, self.future = self.future, None
            fut.result()


# ---- agreeing on one error ---------------------------------------------------------------------


def describe_error(error: BaseException, what: str) -> Dict[str, Any]:
    """An error as plain fields (what all_gather_object sends: str, int, None)."""
    if isinstance(error, CkptioError):
        return {"what": what, "status": error.status, "errno": error.errno or 0,
                "cuda": error.cuda_result or 0, "operation": error.operation, "path": error.path,
                "offset": -1 if error.offset is None else error.offset, "subject": error.subject,
                "message": error.message, "source": error.source}
    if isinstance(error, KeyError) and error.args and isinstance(error.args[0], str):
        status, text = _ckptio.E_NOT_FOUND, error.args[0]
    else:
        text = str(error) or type(error).__name__
        if isinstance(error, IndexError):
            status = _ckptio.E_RANGE
        elif isinstance(error, torch.cuda.OutOfMemoryError):
            status = _ckptio.E_DEVICE_OOM
        elif isinstance(error, MemoryError):
            status = _ckptio.E_NOMEM
        elif isinstance(error, OSError):
            status = _ckptio.E_IO
        else:
            status = _ckptio.E_INVAL
    err = getattr(error, "errno", None) if isinstance(error, OSError) else None
    return {"what": what, "status": status, "errno": err if isinstance(err, int) else 0, "cuda": 0,
            "operation": None, "path": getattr(error, "filename", None) if isinstance(error, OSError) else None,
            "offset": -1, "subject": None, "message": f"{type(error).__name__}: {text}", "source": None}


def agreed_error(descs: List[Optional[Dict[str, Any]]]) -> CkptioError:
    """The error every rank raises: the lowest failing rank's, its message
    prefixed with the ranks that failed."""
    failed = [r for r, d in enumerate(descs) if d is not None]
    r0 = failed[0]
    d = descs[r0]
    path = d["path"] if isinstance(d["path"], str) else None
    message = f"{d['what']}: {STOPPED}: rank(s) {failed} of the process group failed; rank {r0}: {d['message']}"
    exc = make_error(d["status"], _ckptio.status_name(d["status"]), d["errno"] or 0, d["cuda"] or 0,
                     d["operation"], path, d["offset"], d["subject"], message, d["source"])
    exc.failed_ranks = failed
    return exc


def raise_agreed(group, device: torch.device, error: Optional[BaseException], what: str) -> None:
    """Collective: every rank calls it once it knows that some rank failed;
    every rank raises the same CkptioError (the failing ones chained to
    their own error; a KeyboardInterrupt or SystemExit is re-raised as is)."""
    dist = dist_module()
    desc = describe_error(error, what) if error is not None else None
    descs: List[Any] = [None] * dist.get_world_size(group)
    if device.type == "cuda":
        with torch.cuda.device(device):
            dist.all_gather_object(descs, desc, group=group)
    else:
        dist.all_gather_object(descs, desc, group=group)
    if error is not None and not isinstance(error, Exception):
        raise error
    exc = agreed_error(descs)
    if error is not None:
        raise exc from error
    raise exc


def _status_exchange(group, device, world: int, me: int, error, lengths: Sequence[int] = ()) -> List[int]:
    """all_reduce of [failed flag per rank] + lengths (each filled by its owner)."""
    dist = dist_module()
    ctrl = torch.zeros(world + len(lengths), dtype=torch.int64)
    ctrl[me] = 1 if error is not None else 0
    if error is None and lengths:
        ctrl[world:] = torch.tensor(list(lengths), dtype=torch.int64)
    ctrl = ctrl.to(device)
    dist.all_reduce(ctrl, group=group)
    return ctrl.cpu().tolist()


def check_status(group, device, error: Optional[BaseException], what: str) -> None:
    """One status exchange: raises the agreed error on every rank when any
    rank failed (a collective: every rank calls it at the same point)."""
    dist = dist_module()
    ctrl = _status_exchange(group, device, dist.get_world_size(group), dist.get_rank(group), error)
    if any(ctrl):  # this rank's own flag is among them when it failed
        raise_agreed(group, device, error, what)


# ---- the batches -------------------------------------------------------------------------------


# The largest group whose scatters travel whole (scatter_whole): the groups it was measured with
# (docs/MODELS.md#every-byte-read-once-several-ranks).
SCATTER_WHOLE_MAX_RANKS = 4


def scatter_whole(world: int) -> bool:
    """Whether scatter segments travel whole, by the owner's broadcast, each rank cutting its own pieces out,
    rather than cut by the owner and sent by one all_to_all_single. NCCL connects a process's point-to-point
    peers lazily, in its first all_to_all, while broadcasts use the ring the status exchanges have connected,
    so in small groups on one host the whole segments (world x the bytes a rank needs) cost less than that
    first set-up; larger groups, where those bytes may cross the network, keep all_to_all
    (docs/MODELS.md#every-byte-read-once-several-ranks has the measurements)."""
    return world <= SCATTER_WHOLE_MAX_RANKS


def run(source, batches: List[Sequence], group, device: torch.device, error: Optional[BaseException],
        stats: Dict[str, int], what: str) -> None:
    """Walks the batches with every other rank of ``group`` (see the module
    docstring); ``error`` is this rank's failure before the batches, if any.
    Adds to ``stats``: bytes_read (this rank's owner reads), bytes_sent,
    bytes_received (payload bytes over the group). Returns normally only when
    every rank succeeded; else raises the agreed CkptioError on every rank."""
    from concurrent.futures import ThreadPoolExecutor

    dist = dist_module()
    world, me = dist.get_world_size(group), dist.get_rank(group)
    arenas = [_Arena(device), _Arena(device)]
    whole_scatter = scatter_whole(world)  # the same on every rank
    pool = ThreadPoolExecutor(1, thread_name_prefix="ckptio-group-read") if len(batches) > 1 else None
    ahead: Optional[_OwnerReads] = None
    try:
        for k, batch in enumerate(batches):
            arena = arenas[k % 2]
            reads, ahead = ahead, None
            if error is None:
                try:
                    if reads is None:
                        reads = _OwnerReads(source, batch, me, arena, None)
                    reads.wait()
                    stats["bytes_read"] += reads.nread
                except BaseException as e:  # reported to every rank below
                    error = e
            ctrl = _status_exchange(group, device, world, me, error,
                                    reads.lengths if reads is not None else [0] * len(batch))
            if any(ctrl[:world]):
                raise_agreed(group, device, error, what)
            lengths = ctrl[world:]  # from here on, error is None and reads is set
            # The buffer: [own segments read][broadcasts received][scatter: send | receive]
            sent_whole = [source.pieces(s) is None or whole_scatter for s in batch]
            bcast_owners = sorted({source.owner(s) for s, w in zip(batch, sent_whole) if w})
            recv_b = sum(align(lengths[i]) for i, s in enumerate(batch) if sent_whole[i] and source.owner(s) != me)
            scatter = [i for i, s in enumerate(batch) if not sent_whole[i]]
            send_splits, recv_splits = [0] * world, [0] * world
            for i in scatter:
                owner = source.owner(batch[i])
                for r, n in source.pieces(batch[i]):
                    if owner == me and r != me:
                        send_splits[r] += n
                    elif r == me and owner != me:
                        recv_splits[owner] += n
            send_at = reads.size + recv_b
            recv_at = send_at + align(sum(send_splits))
            area = arena.get(recv_at + sum(recv_splits), keep=reads.size)
            if pool is not None and k + 1 < len(batches) and error is None:
                try:  # the next batch's reads overlap this batch's exchanges
                    ahead = _OwnerReads(source, batches[k + 1], me, arenas[(k + 1) % 2], pool)
                except BaseException as e:
                    error = e
            # Broadcasts, one per owner: its segments sent whole are adjacent at the start of its buffer
            # (_own_order: broadcast segments, then scatter ones).
            recv_pos = reads.size
            for owner in bcast_owners:
                idx = [i for i in _own_order(source, batch, owner) if sent_whole[i]]
                total = sum(align(lengths[i]) for i in idx)
                payload = sum(lengths[i] for i in idx)
                if owner == me:
                    base = 0
                    stats["bytes_sent"] += payload
                else:
                    base = recv_pos
                    recv_pos += total
                    stats["bytes_received"] += payload
                if total:
                    src = owner if group is None else dist.get_global_rank(group, owner)
                    dist.broadcast(area[base:base + total], src=src, group=group)
                if error is not None:
                    continue
                try:
                    pos = base
                    for i in idx:
                        data = area[pos:pos + lengths[i]]
                        pieces = source.pieces(batch[i])
                        if pieces is None:
                            source.deliver(batch[i], [data])
                        else:  # a scatter segment sent whole: this rank cuts its own pieces out
                            cut = source.pack(batch[i], data)
                            source.deliver(batch[i], [c for (r, _), c in zip(pieces, cut) if r == me])
                        pos += align(lengths[i])
                except BaseException as e:  # reported at the next status exchange
                    error = e
            if scatter:
                error = _scatter(source, batch, scatter, reads, area, send_at, recv_at, send_splits,
                                 recv_splits, me, world, group, error, stats)
        check_status(group, device, error, what)  # failures in the last batch, or with no batch at all
    finally:
        if ahead is not None:
            try:
                ahead.wait()  # never leave a read running into memory that is about to be freed
            except BaseException:  # noqa: BLE001 - the load fails anyway; its first error is raised
                pass
        if pool is not None:
            pool.shutdown(wait=True)


def _scatter(source, batch, scatter, reads, area, send_at, recv_at, send_splits, recv_splits, me, world,
             group, error, stats):
    """The scatter segments of one batch: one all_to_all_single with uneven
    splits; the owner keeps its own pieces. Returns this rank's error."""
    dist = dist_module()
    mine: Dict[int, List[Any]] = {}  # segment -> this rank's pieces, in order
    send = area[send_at:send_at + sum(send_splits)]
    if error is None:
        try:
            at = [sum(send_splits[:r]) for r in range(world)]  # pieces grouped by destination rank
            for i in scatter:
                if source.owner(batch[i]) != me:
                    continue
                cut = source.pack(batch[i], area[reads.pos[i]:reads.pos[i] + reads.lengths[i]])
                for (r, n), piece in zip(source.pieces(batch[i]), cut):
                    if r == me:
                        mine.setdefault(i, []).append(piece)
                    else:
                        send[at[r]:at[r] + n].view(piece.shape).copy_(piece)
                        at[r] += n
        except BaseException as e:  # the exchange still happens (garbage bytes), then everyone stops
            error = e
    recv = area[recv_at:recv_at + sum(recv_splits)]
    # Every rank takes part (its splits may all be 0): each knows from the plan that the batch scatters.
    dist.all_to_all_single(recv, send, recv_splits, send_splits, group=group)
    stats["bytes_sent"] += sum(send_splits)
    stats["bytes_received"] += sum(recv_splits)
    if error is not None:
        return error
    try:
        at = [sum(recv_splits[:r]) for r in range(world)]  # pieces grouped by source rank
        for i in scatter:
            owner = source.owner(batch[i])
            if owner == me:
                source.deliver(batch[i], mine.get(i, []))
                continue
            parts = []
            for r, n in source.pieces(batch[i]):
                if r == me:
                    parts.append(recv[at[owner]:at[owner] + n])
                    at[owner] += n
            source.deliver(batch[i], parts)
    except BaseException as e:
        return e
    return None


__all__ = ["run", "check_status", "raise_agreed", "exchange_device", "describe_error", "agreed_error", "align",
           "dist_module", "ALIGN", "STOPPED"]
