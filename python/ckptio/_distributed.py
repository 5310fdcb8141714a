"""Multi-rank model loads: every needed byte read from storage once across a
torch.distributed process group.

Each rank states what it needs (whole tensors, or boxes of them: the
:class:`SliceRequest` of _model.py); the requests - plain names and ints,
never anything from the checkpoint's bytes - are exchanged with
``all_gather_object``, and every rank computes the same plan from them:

* a tensor needed by one rank, or by several whose boxes are disjoint and
  cheap to read separately (one run of bytes each, or runs of at least
  ``DIRECT_RUN_MIN``: tensor-parallel rows), is read *directly* by each rank
  that needs it, straight into its destination;
* any other tensor is *shared*: one owner (among the ranks that need it, the
  least loaded so far, largest tensors first, direct reads counted) reads the
  box covering every rank's box once, and ckptio._group_read's engine - the
  one ckptio.dcp's load-once broadcast uses - delivers it: *broadcast* when
  the boxes overlap and every rank needs the tensor (replicas), else
  *scattered*, each rank receiving only its boxes (tensor-parallel columns).

Shared tensors are cut into batches of ``batch_bytes``; the owners' reads of
the next batch overlap the exchange of the current one. A failure on any rank
(opening the model, a bad request, a read, a copy) ends every rank with the
same CkptioError. Ranks must have opened the same model (names, dtypes and
shapes in the same order are compared through a hash), not necessarily at the
same path.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import threading
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _adapt, _batches, _ckptio, _model
from ._errors import make_error

# A box whose runs of consecutive bytes are at least this long is read
# directly by its rank even when other ranks need other boxes of the tensor:
# such runs read at the storage's sequential speed, and nothing has to move
# between ranks. Shorter runs (tensor-parallel columns) are read once, whole,
# by an owner and scattered.
DIRECT_RUN_MIN = 1 << 20
# Bytes of shared tensors per batch (a larger tensor is a batch alone, a
# larger replicated one is cut into row parts of batch/world). A rank's
# exchange buffers hold about two batches, plus the pieces a scatter sends and
# receives (on the load's GPU with NCCL). Each batch costs an exchange that
# the reads do not hide, so batches are large
# (docs/MODELS.md#every-byte-read-once-several-ranks has the measurements).
BATCH_BYTES = 1 << 30

TpRule = Union[int, Mapping[str, Optional[int]], Callable[[str, Tuple[int, ...]], Optional[int]]]


class LoadStats(NamedTuple):
    """What one rank moved in a load with a process group (``ckptio.last_load_stats()``).

    ``bytes_read``: tensor bytes this rank read from storage (the boxes it
    read; headers not counted). ``bytes_received`` / ``bytes_sent``: payload
    bytes it received from / sent to other ranks. ``bytes_loaded``: the bytes
    of the tensors it returned. ``ok``: False when the load raised.
    """

    rank: int
    world: int
    bytes_read: int
    bytes_received: int
    bytes_sent: int
    bytes_loaded: int
    ok: bool


_last = threading.local()


def last_load_stats() -> Optional[LoadStats]:
    """The :class:`LoadStats` of this thread's last load with a
    ``process_group`` (``ckptio.load``, ``get_slices``, ``read_slices``), or
    None before the first."""
    return getattr(_last, "stats", None)


def _read_boxes(reader, targets: List[tuple]) -> None:
    """Every read of this module goes through here (one ckptio_model_read;
    tests replace it to inject a failure on one rank)."""
    reader.read_slices(targets)


# ---- what a rank asks for -------------------------------------------------------------------


def _tp_dim(rule: TpRule, name: str, shape: Tuple[int, ...]) -> Optional[int]:
    if callable(rule) and not isinstance(rule, Mapping):
        dim = rule(name, shape)
    elif isinstance(rule, Mapping):
        dim = next((d for pattern, d in rule.items() if fnmatch.fnmatchcase(name, pattern)), None)
    elif isinstance(rule, int) and not isinstance(rule, bool):
        dim = rule if len(shape) >= 2 else None  # 0-D and 1-D tensors (norms, biases): whole
    else:
        raise TypeError(f"tp_dim must be an int, a mapping of name patterns to dims or a callable, not {rule!r}")
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        raise ValueError(f"tp_dim gives dim {dim!r} for tensor '{name}' of shape {list(shape)}")
    return dim % len(shape)


def tp_requests(f, names: Sequence[str], rule: TpRule, rank: int, world: int) -> List[Tuple[str, Any]]:
    """(name, index) pairs: for each tensor, ``torch.tensor_split(t, world,
    dim)[rank]`` along the dim the rule gives (torch's shape), else ``...``."""
    out: List[Tuple[str, Any]] = []
    for name in names:
        e = f._entry(name)
        shape = _adapt.torch_shape(e.code, tuple(e.shape), f"tensor '{name}'")
        dim = _tp_dim(rule, name, shape)
        if dim is None:
            out.append((name, ...))
            continue
        q, extra = divmod(shape[dim], world)
        start = rank * q + min(rank, extra)
        out.append((name, (slice(None),) * dim + (slice(start, start + q + (rank < extra)),)))
    return out


def _box_bytes(bits: int, start: Sequence[int], stop: Sequence[int]) -> int:
    return math.prod(b - a for a, b in zip(start, stop)) * bits // 8


def _checked(f, r: _model.SliceRequest) -> Tuple[str, Tuple[int, ...], Tuple[int, ...], int]:
    """(name, start, stop, bytes) of one of this rank's requests, its box
    checked against the tensor (so no other rank plans with a bad one)."""
    if not isinstance(r, _model.SliceRequest):
        raise TypeError(f"a request must be a ckptio.SliceRequest, not {type(r).__name__}")
    e = f._entry(r.name)
    start, stop = tuple(int(x) for x in r.start), tuple(int(x) for x in r.stop)
    if len(start) != len(e.shape) or len(stop) != len(e.shape) or not all(
            0 <= a <= b <= n for a, b, n in zip(start, stop, e.shape)):
        raise IndexError(f"{f.path}: tensor '{r.name}' of shape {list(e.shape)}: box {list(start)}..{list(stop)} "
                         "is not inside it")
    return r.name, start, stop, _box_bytes(_model._BITS[e.code], start, stop)


def fingerprint(f) -> str:
    """A hash of the model's tensor table (names, dtypes, shapes in model
    order): ranks plan with their own handles, which must agree."""
    h = hashlib.sha256()
    for name in f.offset_keys():
        e = f._entry(name)
        h.update(repr((name, e.code, tuple(e.shape), e.nbytes)).encode())
    return h.hexdigest()


# ---- the plan (the same on every rank) --------------------------------------------------------


class _Need(NamedTuple):
    rank: int
    slot: int  # position in that rank's request list
    start: Tuple[int, ...]
    stop: Tuple[int, ...]
    nbytes: int


class _Share:
    """A tensor read once by its owner: the box covering every need."""

    __slots__ = ("index", "name", "shape", "bits", "start", "stop", "nbytes", "owner", "needs", "pieces", "part")

    def __init__(self, index, name, shape, bits, needs: List[_Need], broadcast: bool, rows=None):
        self.index, self.name, self.shape, self.bits = index, name, shape, bits
        self.needs = tuple(needs)
        self.start = tuple(min(n.start[d] for n in needs) for d in range(len(shape)))
        self.stop = tuple(max(n.stop[d] for n in needs) for d in range(len(shape)))
        self.part = rows is not None
        if self.part:  # a part of a broadcast box: rows [a, b) of it (_split_rows)
            self.start = (rows[0],) + self.start[1:]
            self.stop = (rows[1],) + self.stop[1:]
        self.nbytes = _box_bytes(bits, self.start, self.stop)
        self.owner = -1
        self.pieces = None if broadcast else tuple((n.rank, n.nbytes) for n in needs)


def _split_rows(share: _Share, chunk: int) -> List[_Share]:
    """A broadcast share of more than `chunk` bytes whose box every rank needs
    whole and which is one run of bytes (replicas of a large tensor), cut into
    parts of whole rows of about `chunk` bytes: the parts get different owners,
    so the ranks read one tensor side by side instead of one rank reading it
    while the others wait for its broadcast."""
    one_box = all((n.start, n.stop) == (share.start, share.stop) for n in share.needs)
    if (share.pieces is not None or not one_box or share.nbytes <= chunk or share.bits % 8
            or not share.shape or _runs(share.shape, share.start, share.stop, share.bits)[0] != 1):
        return [share]
    lo, hi = share.start[0], share.stop[0]
    row = share.nbytes // (hi - lo)
    step = max(1, chunk // row)
    return [_Share(share.index, share.name, share.shape, share.bits, list(share.needs), True, (a, min(a + step, hi)))
            for a in range(lo, hi, step)]


def _runs(shape, start, stop, bits) -> Tuple[int, int]:
    """(number of runs, bytes per run) of a non-empty box in C order."""
    j = len(shape)
    while j > 0 and start[j - 1] == 0 and stop[j - 1] == shape[j - 1]:
        j -= 1
    if j == 0:
        return 1, math.prod(shape) * bits // 8
    run = (stop[j - 1] - start[j - 1]) * math.prod(shape[j:]) * bits // 8
    return math.prod(b - a for a, b in zip(start[:j - 1], stop[:j - 1])), run


def _overlap(a: _Need, b: _Need) -> bool:
    return all(max(x0, y0) < min(x1, y1) for x0, x1, y0, y1 in zip(a.start, a.stop, b.start, b.stop))


class Plan(NamedTuple):
    direct: Dict[int, List[int]]  # rank -> its slots read directly
    batches: List[List[_Share]]
    read_bytes: List[int]  # per rank: bytes it reads from storage


def make_plan(f, requests: List[List[Tuple[str, Tuple[int, ...], Tuple[int, ...], int]]], budget: int) -> Plan:
    """Who reads what, from every rank's (name, start, stop, bytes) requests."""
    world = len(requests)
    by_name: Dict[str, List[_Need]] = {}
    direct: Dict[int, List[int]] = {r: [] for r in range(world)}
    load = [0] * world
    for rank, reqs in enumerate(requests):
        for slot, (name, start, stop, nbytes) in enumerate(reqs):
            if nbytes == 0:
                direct[rank].append(slot)  # nothing to read
            else:
                by_name.setdefault(name, []).append(_Need(rank, slot, start, stop, nbytes))
    shares: List[_Share] = []
    for name in f.offset_keys():  # model order: shards in order, data offsets within
        needs = by_name.get(name)
        if not needs:
            continue
        e = f._entry(name)
        shape, bits = tuple(e.shape), _model._BITS[e.code]
        ranks = {n.rank for n in needs}
        overlap = any(a.rank != b.rank and _overlap(a, b) for i, a in enumerate(needs) for b in needs[i + 1:])
        alone = len(ranks) == 1 or (not overlap and all(
            runs == 1 or run >= DIRECT_RUN_MIN for runs, run in (_runs(shape, n.start, n.stop, bits) for n in needs)))
        share = None if alone else _Share(e.index, name, shape, bits, needs, overlap and len(ranks) == world)
        if share is not None and bits % 8 and any((n.start, n.stop) != (share.start, share.stop) for n in needs):
            share = None  # sub-byte values cannot be cut out of a box in memory: each rank reads its own
        if share is None:
            for n in needs:
                direct[n.rank].append(n.slot)
                load[n.rank] += n.nbytes
        else:
            shares.append(share)
    shares = [part for s in shares for part in _split_rows(s, max(1, budget // world))]
    # Owners: largest first, each to the least loaded rank that needs it.
    for s in sorted(shares, key=lambda s: (-s.nbytes, s.index)):
        s.owner = min({n.rank for n in s.needs}, key=lambda r: (load[r], r))
        load[s.owner] += s.nbytes
    # Model order: the owners' reads go forward through the files.
    return Plan(direct, _batches.by_budget(shares, lambda s: s.nbytes, budget), load)


# ---- the engine's view of the shared tensors ---------------------------------------------------


def _cut(share: _Share, data, need: _Need):
    """The bytes of `need`'s box inside the bytes of the share's box (C order)."""
    if (need.start, need.stop) == (share.start, share.stop):
        return data
    esize = share.bits // 8
    box = data.view(tuple(b - a for a, b in zip(share.start, share.stop)) + (esize,))
    return box[tuple(slice(a - s, b - s) for a, b, s in zip(need.start, need.stop, share.start))]


class _Shares:
    """ckptio._group_read's source for a model's shared tensors."""

    def __init__(self, f, me: int, dests: Dict[int, Any]):
        self.f, self.me, self.dests = f, me, dests

    @staticmethod
    def owner(share: _Share) -> int:
        return share.owner

    @staticmethod
    def pieces(share: _Share):
        return share.pieces

    @staticmethod
    def length(share: _Share) -> int:
        return share.nbytes

    def reads(self, shares, places, kind):
        targets = [(s.index, s.start, s.stop, addr, n, kind) for s, (addr, n) in zip(shares, places)]
        reader = self.f._reader
        return lambda: _read_boxes(reader, targets)

    @staticmethod
    def pack(share: _Share, data) -> list:
        return [_cut(share, data, n) for n in share.needs]

    def deliver(self, share: _Share, parts) -> None:
        mine = [n for n in share.needs if n.rank == self.me]
        if share.part:  # rows [a, b) of a box this rank needs whole (_split_rows): one run of bytes inside it
            for need in mine:
                at = _box_bytes(share.bits, need.start, (share.start[0],) + need.stop[1:])
                self.dests[need.slot][at:at + share.nbytes].copy_(parts[0].reshape(-1)[:share.nbytes])
            return
        if share.pieces is None:
            parts = [_cut(share, parts[0], n) for n in mine]
        for need, part in zip(mine, parts):
            dest = self.dests[need.slot]
            dest.view(part.shape).copy_(part)


# ---- the load ----------------------------------------------------------------------------------


def _engine():
    """ckptio._group_read (imported on first use: it imports torch)."""
    from . import _group_read

    return _group_read


def _group(process_group):
    dist = _engine().dist_module()
    if dist is None:
        raise RuntimeError("process_group= needs torch.distributed initialised (init_process_group)")
    return dist, dist.get_world_size(process_group), dist.get_rank(process_group)


def _prepare(f, requests, device, budget):
    """This rank's part before the exchange: (device, checked requests, fingerprint)."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"batch_bytes must be a positive number of bytes, not {budget!r}")
    if f.format != "safetensors":
        raise ValueError(f"{f.path}: process_group= loads safetensors files and directories; this is a "
                         f"{f.format} file")
    if f._framework != "pt":
        raise ValueError("process_group= loads torch tensors (framework='pt')")
    dev = f._device if device is None else _adapt.parse_device(device)
    if dev.kind == "cuda":
        dev = _adapt.resolve_cuda(dev)
    return dev, [_checked(f, r) for r in requests], fingerprint(f)


def _exchange(dist, process_group, xdev, payload, world: int) -> List[dict]:
    """all_gather_object of every rank's payload (plain data: names, ints, error fields)."""
    gathered: List[Any] = [None] * world
    if xdev.type == "cuda":  # NCCL sends the pickled bytes from this rank's GPU
        with _adapt.torch_module().cuda.device(xdev):
            dist.all_gather_object(gathered, payload, group=process_group)
    else:
        dist.all_gather_object(gathered, payload, group=process_group)
    return gathered


def _agree(gathered: List[dict], error: Optional[BaseException]) -> None:
    """Raises on every rank alike when a rank failed before the exchange or
    opened another model than rank 0."""
    group_read = _engine()
    descs = [g["error"] for g in gathered]
    if any(d is not None for d in descs):
        if error is not None and not isinstance(error, Exception):
            raise error  # KeyboardInterrupt, SystemExit: this rank's own
        raise group_read.agreed_error(descs) from error
    odd = [r for r, g in enumerate(gathered) if g["fingerprint"] != gathered[0]["fingerprint"]]
    if odd:
        raise make_error(_ckptio.E_INVAL, "E_INVAL", 0, 0, None, None, -1, None,
                         f"{gathered[0]['what']}: {group_read.STOPPED}: rank(s) {odd} opened a model that differs "
                         f"from rank 0's ({gathered[odd[0]]['what']}: tensor names, dtypes or shapes); every rank "
                         "of the process group must load the same model")


def _read_direct(f, mine, slots: List[int], dev, results: List[Any], dests: Dict[int, Any]) -> int:
    """Allocates this rank's destinations and reads its direct boxes into
    them (one plan); returns the bytes read."""
    torch = _adapt.torch_module()
    for slot, (name, start, stop, nbytes) in enumerate(mine):
        box = tuple(b - a for a, b in zip(start, stop))
        t = _adapt.new_target(f._entry(name).code, box, dev, "pt", f"tensor '{name}'", safetensors=True)
        results[slot] = t
        if nbytes:
            dests[slot] = t.value.reshape(-1).view(torch.uint8)  # where shared bytes are copied to
    direct = [(f._entry(mine[s][0]).index, mine[s][1], mine[s][2], results[s].address, results[s].capacity,
               results[s].mem_kind) for s in slots if mine[s][3]]
    if direct:
        _adapt.sync_current_stream({dev.index} if dev.kind == "cuda" else set())
        _read_boxes(f._reader, direct)
    return sum(mine[s][3] for s in slots)


def read(f, requests: Optional[List[_model.SliceRequest]], device: Any, process_group,
         error: Optional[BaseException] = None, what: Optional[str] = None,
         batch_bytes: Optional[int] = None) -> List[Any]:
    """The group's read: every rank calls it with its own requests (or with
    ``error`` when it could not make them: it still takes part, and every
    rank raises). Returns this rank's results, in request order."""
    dist, world, me = _group(process_group)
    group_read = _engine()
    what = what if what is not None else (f.path if f is not None else "ckptio.load")
    stats = {"bytes_read": 0, "bytes_sent": 0, "bytes_received": 0}
    loaded = -1
    try:
        dev, mine, fp = None, [], None
        if error is None:
            try:
                dev, mine, fp = _prepare(f, requests, device, BATCH_BYTES if batch_bytes is None else batch_bytes)
            except BaseException as e:  # every rank learns of it in the exchange below
                error = e
        torch = _adapt.torch_module()
        xdev = group_read.exchange_device(
            process_group, torch.device("cuda", dev.index) if dev is not None and dev.kind == "cuda" else None)
        payload = {"error": None if error is None else group_read.describe_error(error, what), "what": what,
                   "fingerprint": fp, "requests": mine}
        gathered = _exchange(dist, process_group, xdev, payload, world)
        _agree(gathered, error)
        plan = make_plan(f, [g["requests"] for g in gathered], BATCH_BYTES if batch_bytes is None else batch_bytes)
        results: List[Any] = [None] * len(mine)
        dests: Dict[int, Any] = {}
        try:
            stats["bytes_read"] += _read_direct(f, mine, plan.direct[me], dev, results, dests)
        except BaseException as e:  # reported at the engine's first status exchange
            error = e
        group_read.run(_Shares(f, me, dests), plan.batches, process_group, xdev, error, stats, what)
        out = [t.value[r.post] if r.post is not None else t.value.reshape(r.shape) for r, t in zip(requests, results)]
        loaded = sum(m[3] for m in mine)
        return out
    finally:
        _last.stats = LoadStats(me, world, stats["bytes_read"], stats["bytes_received"], stats["bytes_sent"],
                                max(loaded, 0), loaded >= 0)


def get_slices(f, requests, device: Any, process_group, batch_bytes: Optional[int] = None,
               planned: bool = False) -> List[Any]:
    """``f.get_slices(requests, process_group=pg)`` (``planned``: ``f.read_slices``):
    a bad request is exchanged like any other failure."""
    error: Optional[BaseException] = None
    reqs = None
    try:
        reqs = list(requests) if planned else _model.plan_requests(f, requests)
    except BaseException as e:
        error = e
    return read(f, reqs, device, process_group, error, f.path, batch_bytes)


def load(path, open_file: Callable[[], Any], device: Any, keys, *, slices, tp_dim: Optional[TpRule],
         process_group, batch_bytes: Optional[int] = None):
    """``ckptio.load(path, ..., process_group=pg)``: opens the model on every
    rank with `open_file()` (a CheckpointFile of `path`: the caller's, this
    module sits below the API; a failure to open is exchanged like any other)
    and reads what this rank asks for: every tensor (or `keys`) whole, this
    rank's tensor-parallel part of each (`tp_dim`), or `slices` ({name:
    index} or [(name, index)])."""
    f = None
    error: Optional[BaseException] = None
    requests = None
    try:
        if slices is not None and (keys is not None or tp_dim is not None):
            raise ValueError("slices= names its own tensors: pass keys= and tp_dim= without it")
        f = open_file()
        if slices is not None:
            requests = _model.plan_requests(f, slices)
        else:
            names = f.offset_keys() if keys is None else list(keys)
            for name in names:
                f._entry(name)  # a missing name is an error of this rank
            if tp_dim is not None:
                _, world, rank = _group(process_group)
                pairs = tp_requests(f, names, tp_dim, rank, world)
            else:
                pairs = [(name, ...) for name in names]
            requests = _model.plan_requests(f, pairs)
    except BaseException as e:
        error = e
    try:
        what = f.path if f is not None else str(path)
        out = read(f, requests, device, process_group, error, what, batch_bytes)
    finally:
        if f is not None:
            f.close()
    if slices is not None and not isinstance(slices, Mapping):
        return out
    names = list(slices.keys()) if slices is not None else [r.name for r in requests]
    return dict(zip(names, out))


__all__ = ["LoadStats", "last_load_stats", "load", "get_slices", "read", "make_plan", "tp_requests", "DIRECT_RUN_MIN",
           "BATCH_BYTES"]
