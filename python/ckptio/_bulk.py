"""Many CPU tensors from few buffers: what a load of a safetensors file or
directory builds, copied (``ckptio.load(path)``) or mapped
(``ckptio.load(path, mmap=True)``).

A tensor of its own costs an allocation, a read request and a few torch calls,
microseconds each, which a checkpoint of 100,000 small tensors (the experts of
a mixture-of-experts model) pays 100,000 times. So tensors smaller than
PACK_TENSOR_MAX that lie back to back in a file share one buffer of at most
PACK_BYTES: it is read with one request and cut into views, and a run of
tensors of one dtype and shape is cut by one ``unbind`` call. Larger tensors
get storages of their own, as ``torch.empty`` gives them.

A mapped load makes the same tensors over the file's mapping
(``_ckptio.Mapping``, private and copy-on-write; docs/PYTHON.md, "Mapped
loads"): a larger tensor's storage is its own byte range of the mapping, a
pack's is the pack's range, so ``torch.save`` of one tensor writes its bytes
(or its pack's), not the whole file. A tensor whose offset is not a multiple
of its element size cannot be a view: it is read into memory of its own.
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _adapt, _ckptio

PACK_TENSOR_MAX = 1 << 16
PACK_BYTES = 16 << 20
GC_PAUSE_MIN = 1000  # no_gc: objects made below this are not worth the switch
COPY_ONE_BY_ONE_MAX = 16  # copy_from: packs of up to this many tensors are not packed


class Item(NamedTuple):
    """A tensor to load (plain tuples of this layout are accepted too: a
    namedtuple per tensor costs what this module saves)."""

    index: int                # in the reader (a model: shard order, then offset order)
    name: str
    code: int
    shape: Tuple[int, ...]    # the file's
    offset: int               # absolute file offset
    nbytes: int
    shard: int


INDEX, NAME, CODE, SHAPE, OFFSET, NBYTES, SHARD = range(7)

_BITS = {row[0]: row[3] for row in _adapt.DTYPES}


def _itemsize(code: int) -> int:
    """Bytes of one torch element (float4_e2m1fn_x2 packs two 4-bit values in one)."""
    return max(1, _BITS[code] // 8)


class no_gc:
    """Python's cyclic collector off while a block makes many objects: each
    collection walks every object alive, the ones made so far included,
    which made building 100,000 tensors take twice as long (and a large
    checkpoint's .metadata, millions of containers, several times). The one
    rule of the package for pausing it: `count`, the objects the block
    makes, when known before it runs (fewer than GC_PAUSE_MIN are not worth
    the switch); None when only the block finds out (a reader's rows, a
    pickle's objects): then it is paused."""

    __slots__ = ("_off",)

    def __init__(self, count: Optional[int] = None) -> None:
        self._off = (count is None or count >= GC_PAUSE_MIN) and gc.isenabled()

    def __enter__(self) -> None:
        if self._off:
            gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self._off:
            gc.enable()


def _groups(items: Sequence[Item]) -> List[list]:
    """Items in reader order as packs [start, end, items]: consecutive small
    tensors back to back in one shard share one; every other tensor is a
    pack of one."""
    out: List[list] = []
    cur: Optional[list] = None
    for it in items:
        small = it[NBYTES] < PACK_TENSOR_MAX
        if small and cur is not None:
            last = cur[2][-1]
            if (last[INDEX] + 1 == it[INDEX] and last[SHARD] == it[SHARD] and cur[1] == it[OFFSET]
                    and it[OFFSET] + it[NBYTES] - cur[0] <= PACK_BYTES):
                cur[2].append(it)
                cur[1] = it[OFFSET] + it[NBYTES]
                continue
        cur = [it[OFFSET], it[OFFSET] + it[NBYTES], [it]]
        out.append(cur)
        if not small:
            cur = None
    return out


def _strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    strides = []
    step = 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _kind(cache: Dict[Any, Any], code: int, shape: Tuple[int, ...], name: str):
    """(torch dtype, torch shape, contiguous strides, element size) of a file
    dtype and shape, worked out once per distinct pair."""
    key = (code, shape)
    k = cache.get(key)
    if k is None:
        what = f"tensor '{name}'"
        tshape = _adapt.torch_shape(code, shape, what)
        k = cache[key] = (_adapt.torch_dtype(code, what), tshape, _strides(tshape), _itemsize(code))
    return k


def _views(buf, start: int, items: List[Item], out: List[Any], kinds: Dict[Any, Any]) -> List[Item]:
    """Tensors over `buf` (a uint8 tensor whose element 0 is file byte
    `start`) into out[index]; returns the items that cannot be views (an
    offset that is not a multiple of their element size). `kinds` caches
    _kind()."""
    typed: Dict[int, Any] = {}
    left: List[Item] = []
    i, n = 0, len(items)
    while i < n:
        it = items[i]
        code, shape, nbytes = it[CODE], it[SHAPE], it[NBYTES]
        dt, tshape, strides, size = _kind(kinds, code, shape, it[NAME])
        rel = it[OFFSET] - start
        if rel % size:
            left.append(it)
            i += 1
            continue
        j = i + 1
        while j < n and items[j][CODE] == code and items[j][SHAPE] == shape:
            j += 1
        if j - i > 1 and nbytes:
            # A run of one dtype and shape, back to back: one unbind.
            run = buf[rel:rel + (j - i) * nbytes].view(dt).view((j - i,) + tshape).unbind(0)
            # A pack's indices are consecutive (_groups): one slice assignment.
            out[it[INDEX]:it[INDEX] + j - i] = run
            i = j
            continue
        t = typed.get(code)
        if t is None:
            t = typed[code] = buf[:buf.numel() - buf.numel() % size].view(dt)
        out[it[INDEX]] = t.as_strided(tshape, strides, rel // size)
        i += 1
    return left


def _u8(storage):
    torch = _adapt.torch_module()
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))


def mapped_storage(mapping):
    """The whole of a _ckptio.Mapping as a torch UntypedStorage; the mapping
    lives as long as any storage or tensor over it (unmapped with the last)."""
    torch = _adapt.torch_module()
    if not mapping.length:
        return torch.UntypedStorage(0)
    buf = (ctypes.c_ubyte * mapping.length).from_address(mapping.address)
    buf.owner = mapping  # torch.frombuffer keeps `buf` alive, `buf` the mapping
    return torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()


def mapped_numpy(mapping):
    """The whole of a mapping as a numpy uint8 array that keeps it alive."""
    import numpy as np

    if not mapping.length:
        return np.empty(0, dtype=np.uint8)
    buf = (ctypes.c_ubyte * mapping.length).from_address(mapping.address)
    buf.owner = mapping
    return np.frombuffer(buf, dtype=np.uint8)


def _slots(items: Sequence[Item], out: Optional[List[Any]]) -> List[Any]:
    """`out`, or a new list with a slot for every index of `items` (in
    reader order: the last index is the largest)."""
    if out is not None:
        return out
    return [None] * (items[-1][INDEX] + 1 if items else 0)


def load_copied(reader, items: Sequence[Item], out: Optional[List[Any]] = None) -> List[Any]:
    """Reads `items` (in reader order) into new CPU tensors, small ones
    packed; one plan. Returns a list whose slot `index` holds the tensor of
    that index (`out` when given, filled in; other slots untouched)."""
    torch = _adapt.torch_module()
    kind = _adapt.MEM_HOST
    runs = []
    packs = []
    out = _slots(items, out)
    for start, end, members in _groups(items):
        if len(members) == 1:
            it = members[0]
            t = _adapt.new_target(it[CODE], it[SHAPE], _adapt.Device("cpu", None), "pt", f"tensor '{it[NAME]}'")
            out[it[INDEX]] = t.value
            if it[NBYTES]:
                runs.append((it[INDEX], 1, t.address, t.capacity, kind))
            continue
        buf = torch.empty(end - start, dtype=torch.uint8)
        packs.append((buf, start, members))
        runs.append((members[0][INDEX], len(members), buf.data_ptr(), end - start, kind))
    if runs:
        reader.read_runs(runs)
    kinds: Dict[Any, Any] = {}
    for buf, start, members in packs:
        for it in _views(buf, start, members, out, kinds):
            # Not a multiple of its element size from the pack's start: a copy of its own.
            what = f"tensor '{it[NAME]}'"
            rel = it[OFFSET] - start
            out[it[INDEX]] = (buf[rel:rel + it[NBYTES]].clone().view(_adapt.torch_dtype(it[CODE], what))
                              .view(_adapt.torch_shape(it[CODE], it[SHAPE], what)))
    return out


def load_mapped(reader, items: Sequence[Item], mapping_of) -> Tuple[List[Any], List[Item]]:
    """Tensors over the mapped files (`mapping_of(shard)` -> Mapping).
    Returns a list of them by index (as load_copied) and the items that
    must be read instead."""
    torch = _adapt.torch_module()
    storages: Dict[int, Any] = {}
    out = _slots(items, None)
    left: List[Item] = []
    kinds: Dict[Any, Any] = {}
    for start, end, members in _groups(items):
        shard = members[0][SHARD]
        st = storages.get(shard)
        if st is None:
            st = storages[shard] = mapped_storage(mapping_of(shard))
        if len(members) == 1:
            it = members[0]
            if it[OFFSET] % _itemsize(it[CODE]):
                left.append(it)
                continue
            what = f"tensor '{it[NAME]}'"
            shape = _adapt.torch_shape(it[CODE], it[SHAPE], what)
            own = st[start:end] if end > start else torch.UntypedStorage(0)
            out[it[INDEX]] = torch.empty(0, dtype=_adapt.torch_dtype(it[CODE], what)).set_(own, 0, shape,
                                                                                             _strides(shape))
            continue
        left += _views(_u8(st[start:end]), start, members, out, kinds)
    return out, left


def numpy_mapped(items: Sequence[Item], mapping_of) -> Dict[int, Any]:
    """numpy arrays over the mapped files (mmap=True, framework='numpy');
    numpy takes any offset."""
    arrays: Dict[int, Any] = {}
    out: Dict[int, Any] = {}
    for it in items:
        whole = arrays.get(it[SHARD])
        if whole is None:
            whole = arrays[it[SHARD]] = mapped_numpy(mapping_of(it[SHARD]))
        dt = _adapt.numpy_dtype(it[CODE], f"tensor '{it[NAME]}'")
        out[it[INDEX]] = whole[it[OFFSET]:it[OFFSET] + it[NBYTES]].view(dt).reshape(it[SHAPE])
    return out


def copy_from(base: int, items: Sequence[Item]) -> List[Any]:
    """Tensors copied out of memory at `base` (file byte k at base + k: a
    checkpoint held in memory), small ones packed; one copy each. A List by
    index, as load_copied. The copies run in C (_ckptio.host_copy): from
    8 MiB in all, half of them on one more thread (one thread copies at about
    half the memory bandwidth, and torch's clone() would start its whole
    thread pool, which on a busy machine costs more than the copy)."""
    torch = _adapt.torch_module()
    out = _slots(items, None)
    kinds: Dict[Any, Any] = {}
    copies: List[Tuple[int, int, int]] = []  # (destination, source, bytes)
    for start, end, members in _groups(items):
        # A pack of a few tensors costs more than the tensors alone (its buffer, a view and an unbind per
        # tensor): those are made one by one, each with its own storage.
        if len(members) <= COPY_ONE_BY_ONE_MAX:
            for it in members:
                dt, tshape, _, _ = _kind(kinds, it[CODE], it[SHAPE], it[NAME])
                t = out[it[INDEX]] = torch.empty(tshape, dtype=dt)
                if it[NBYTES]:
                    copies.append((t.data_ptr(), base + it[OFFSET], it[NBYTES]))
            continue
        buf = torch.empty(end - start, dtype=torch.uint8)
        copies.append((buf.data_ptr(), base + start, end - start))
        left = _views(buf, start, members, out, kinds)
        assert not left  # a new buffer starting at the tensor is aligned for every dtype
    _ckptio.host_copy(copies)
    return out


# dtype code -> torch dtype, for codes whose file shape is torch's shape (copy_each); filled as met.
_PLAIN_DTYPES: Dict[int, Any] = {}


def copy_each(base: int, rows: Sequence[tuple]) -> Dict[str, Any]:
    """copy_from for a few tensors (at most COPY_ONE_BY_ONE_MAX, where
    copy_from packs nothing), with what a load of a few small tensors spends
    on bookkeeping cut away: `rows` are safetensors_describe's (name, code,
    shape, offset, nbytes, ...); returns {name: tensor} in name order."""
    torch = _adapt.torch_module()
    empty = torch.empty
    out: Dict[str, Any] = {}
    copies: List[Tuple[int, int, int]] = []
    names = []
    for row in rows:
        name, code, shape, offset, nbytes = row[0], row[1], row[2], row[3], row[4]
        dt = _PLAIN_DTYPES.get(code)
        if dt is None:
            what = f"tensor '{name}'"
            dt = _adapt.torch_dtype(code, what)
            tshape = _adapt.torch_shape(code, shape, what)
            if tshape == shape:
                _PLAIN_DTYPES[code] = dt
            shape = tshape
        t = out[name] = empty(shape, dtype=dt)
        names.append(name)
        if nbytes:
            copies.append((t.data_ptr(), base + offset, nbytes))
    _ckptio.host_copy(copies)
    ordered = sorted(names)
    return out if ordered == names else {name: out[name] for name in ordered}

