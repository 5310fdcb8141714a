"""Model directories and slices: the Python face of libckptio's ckptio_model.

A Hugging Face directory (or its index, or one safetensors file) is opened
as one ``ckptio._ckptio.ModelReader``; finding the index, validating it
against the shards and computing which bytes a slice covers all happen in
C. This module only turns Python indexing (``f.get_slice(name)[a:b]``) into
boxes ``[start, stop)`` per dimension, allocates the destinations and
applies what a box cannot express (steps, dropped or added dimensions) as a
view afterwards.

A request is plain, picklable data (:class:`SliceRequest`): a rank can state
everything it needs in one call, and the same list can be split between
ranks and read piece by piece.
"""

from __future__ import annotations

import operator
import os
import sys
from typing import Any, Iterable, List, Mapping, NamedTuple, Optional, Tuple, Union

from . import _adapt, _ckptio

INDEX_SUFFIX = ".index.json"
_BITS = {row[0]: row[3] for row in _adapt.DTYPES}


def is_model_path(path: str, kind: Optional[str] = None) -> bool:
    """True for what only a model handle opens: a Hugging Face index, or a
    directory that is not a DCP checkpoint (libckptio's detector decides,
    the same rule as the CLI; single files go through format detection)."""
    if kind is None:
        kind = _ckptio.format_detect(path)
    # An s3:// prefix is "directory" only when objects are under it.
    return kind == "hf_index" or (kind == "directory" and (_ckptio.path_is_object(path) or os.path.isdir(path)))


class SliceRequest(NamedTuple):
    """One tensor, or one slice of it, as the bytes to read and what to do with them.

    ``start``/``stop`` are the box read from the file, per dimension, in the
    file's terms (a safetensors F4 dimension counts 4-bit values); ``nbytes``
    is what the box costs to read. ``post`` is None when the result is the
    box reshaped to ``shape``; otherwise the index applied to the box after
    reading (steps > 1, or an advanced index applied to the whole tensor, in
    which case ``shape`` is None).
    """

    name: str
    start: Tuple[int, ...]
    stop: Tuple[int, ...]
    nbytes: int
    shape: Optional[Tuple[int, ...]]
    post: Any = None


def _is_int(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return False  # a tensor index is advanced indexing, even 0-d
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _basic_items(index: Any) -> Optional[tuple]:
    """The index as a tuple of ints, slices (int or None fields), None and
    Ellipsis; None when it holds anything else (lists, tensors, bools)."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for it in items:
        if it is None or it is Ellipsis:
            out.append(it)
        elif isinstance(it, slice):
            if any(v is not None and not _is_int(v) for v in (it.start, it.stop, it.step)):
                return None
            out.append(slice(*(None if v is None else operator.index(v) for v in (it.start, it.stop, it.step))))
        elif _is_int(it):
            out.append(operator.index(it))
        else:
            return None
    return tuple(out)


def _result_shape(framework: str, tshape: Tuple[int, ...], items: tuple) -> Tuple[int, ...]:
    """The shape indexing gives, and its errors: torch's own (on a meta
    tensor) for framework "pt", numpy's (on a zero-stride view) otherwise."""
    if framework == "numpy":
        import numpy as np

        return tuple(np.broadcast_to(np.zeros((), np.uint8), tshape)[items].shape)
    torch = _adapt.torch_module()
    return tuple(torch.empty(tshape, dtype=torch.uint8, device="meta")[items].shape)


def _box(tshape: Tuple[int, ...], items: tuple):
    """(start, stop, post) of a valid basic index; post None when no step > 1."""
    ndim = len(tshape)
    consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
    fill = [slice(None)] * (ndim - consumed)
    expanded: List[Any] = []
    for it in items:
        expanded.extend(fill if it is Ellipsis else [it])
    if not any(it is Ellipsis for it in items):
        expanded.extend(fill)
    start: List[int] = []
    stop: List[int] = []
    post: List[Any] = []
    steps = False
    d = 0
    for it in expanded:
        if it is None:
            post.append(None)
            continue
        n = tshape[d]
        d += 1
        if isinstance(it, slice):
            a, b, s = it.indices(n)
            count = len(range(a, b, s))
            start.append(a)
            stop.append(a + (count - 1) * s + 1 if count else a)
            post.append(slice(None, None, s) if s != 1 else slice(None))
            steps = steps or s != 1
        else:
            i = it + n if it < 0 else it
            start.append(i)
            stop.append(i + 1)
            post.append(0)
    return tuple(start), tuple(stop), (tuple(post) if steps else None)


def plan_request(f, name: str, index: Any) -> SliceRequest:
    """The request for ``f.get_slice(name)[index]``: validated as torch (or
    numpy) indexing validates it, with the same errors."""
    e = f._entry(name)
    what = f"tensor '{name}'"
    fshape = tuple(e.shape)
    tshape = _adapt.torch_shape(e.code, fshape, what) if f._framework == "pt" else fshape
    f4 = tshape != fshape  # float4_e2m1fn_x2: torch elements are pairs of file values
    items = _basic_items(index)
    if items is None:
        # Advanced indexing: the whole tensor, then the index as torch/numpy apply it.
        return SliceRequest(name, (0,) * len(fshape), fshape, e.nbytes, None, index)
    shape = _result_shape(f._framework, tshape, items)
    start, stop, post = _box(tshape, items)
    if f4:
        start = start[:-1] + (2 * start[-1],)
        stop = stop[:-1] + (2 * stop[-1],)
    nbytes = _BITS[e.code]
    for a, b in zip(start, stop):
        nbytes *= b - a
    nbytes //= 8
    return SliceRequest(name, start, stop, nbytes, shape, post)


Requests = Union[Mapping[str, Any], Iterable[Union[SliceRequest, Tuple[str, Any]]]]


def plan_requests(f, requests: Requests) -> List[SliceRequest]:
    """Requests from {name: index} or [(name, index) or SliceRequest, ...];
    the index ``...`` is the whole tensor."""
    pairs = requests.items() if isinstance(requests, Mapping) else requests
    out = []
    for r in pairs:
        if isinstance(r, SliceRequest):
            out.append(r)
        else:
            name, index = r
            out.append(plan_request(f, name, index))
    return out


def read_requests(f, requests: List[SliceRequest], device: Any = None) -> List[Any]:
    """Reads every request in one plan (one ckptio_model_read call) and
    returns the results in order."""
    if f.format != "safetensors":
        raise ValueError(f"{f.path}: slices are read from safetensors files and directories; this is a "
                         f"{f.format} file: use get_tensor(name)[...]")
    dev = f._device if device is None else _adapt.parse_device(device)
    if f._framework == "numpy" and dev.kind != "cpu":
        raise ValueError(f"framework='numpy' loads to the cpu only, not {dev}")
    if dev.kind == "cuda":
        dev = _adapt.resolve_cuda(dev)
    targets = []
    boxes = []
    cuda_devices = set()
    for r in requests:
        e = f._entry(r.name)
        what = f"tensor '{r.name}'"
        if len(r.start) != len(e.shape) or len(r.stop) != len(e.shape):
            raise ValueError(f"{f.path}: {what} has {len(e.shape)} dimensions; the request's box has "
                             f"{len(r.start)} and {len(r.stop)}")
        box_shape = tuple(b - a for a, b in zip(r.start, r.stop))
        if any(n < 0 for n in box_shape):
            raise ValueError(f"{f.path}: {what}: box start {list(r.start)} is past stop {list(r.stop)}")
        t = _adapt.new_target(e.code, box_shape, dev, f._framework, what, safetensors=True)
        if t.mem_kind == _adapt.MEM_CUDA:
            cuda_devices.add(t.value.device.index)
        targets.append((e.index, tuple(r.start), tuple(r.stop), t.address, t.capacity, t.mem_kind))
        boxes.append(t.value)
    _adapt.sync_current_stream(cuda_devices)
    f._reader.read_slices(targets)
    out = []
    for r, box in zip(requests, boxes):
        if r.post is not None:
            out.append(box[r.post])
        else:
            out.append(box.reshape(r.shape))
    return out


class Slice:
    """``f.get_slice(name)``: a tensor not read yet, as safetensors' PySafeSlice.

    ``get_shape()`` and ``get_dtype()`` describe the whole tensor (the
    file's shape as a list, the safetensors dtype name such as "F32");
    indexing reads only the bytes the index covers into a tensor on the
    handle's device: basic indexing (ints, negative ones too, slices with any
    positive step, ``...``, None) follows torch's semantics and errors
    (numpy's for framework="numpy"); other indices (lists, tensors, bools)
    read the whole tensor and index it.
    """

    __slots__ = ("_f", "_name", "_entry")

    def __init__(self, f, name: str):
        self._f = f
        self._name = name
        self._entry = f._entry(name)

    def get_shape(self) -> List[int]:
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        return _adapt.dtype_name(self._entry.code)

    def __getitem__(self, index: Any):
        return read_requests(self._f, [plan_request(self._f, self._name, index)])[0]

    def __repr__(self) -> str:
        return f"<ckptio.Slice {self._name!r} {self.get_dtype()} {self.get_shape()}>"
