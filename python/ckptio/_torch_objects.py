"""torch.save files as Python objects: the restricted unpickler's value tree
(``_ckptio.TorchReader.tree``) with tensors over storages read into memory, or
over the file mapped into memory (``mmap=True``, as ``torch.load(mmap=True)``
makes them: each storage its byte range of the mapping)."""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional

from . import _adapt, _bulk


def mapped_storages(reader, mapping) -> List[Any]:
    """Every storage of a torch file as its byte range of the file's
    mapping, as torch.load(mmap=True) makes them (no alignment required)."""
    torch = _adapt.torch_module()
    whole = _bulk.mapped_storage(mapping)
    return [whole[offset:offset + nbytes] if nbytes else torch.UntypedStorage(0)
            for _, _, _, nbytes, offset, _ in reader.storages]


def mapped_tensors(reader, mapping, indices: List[int]) -> Dict[int, Any]:
    """Tensors `indices` of a mapped torch file, with their saved strides
    and offsets (views share their storage, as in the file)."""
    torch = _adapt.torch_module()
    storages = mapped_storages(reader, mapping)
    rows = reader.tensors
    out = {}
    for i in indices:
        name, code, shape, stride, soff, sidx = rows[i][:6]
        out[i] = torch.empty(0, dtype=_adapt.torch_dtype(code, f"tensor '{name}'")).set_(storages[sidx], soff, shape,
                                                                                          stride)
    return out


def build_torch_object(reader, dev: "_adapt.Device", mapping=None, storages: Optional[List[Any]] = None) -> Any:
    """The object a ``_ckptio.TorchReader`` holds, as ``torch.load`` returns it
    (tensors on `dev`, views sharing their storages, torch.Size kept): the
    restricted unpickler's value tree made into Python objects. Shared by
    :meth:`CheckpointFile.load_object` and ckptio.dcp's byte items. With a
    `mapping` (of the reader's file) the storages are views of it; with
    `storages`, those (one per record, in the reader's order)."""
    torch = _adapt.torch_module()
    tdev = str(dev)
    if storages is not None:
        pass
    elif mapping is not None:
        storages = mapped_storages(reader, mapping)
    else:
        rows = reader.storages
        storages = []
        targets = []
        for i, (key, _, _, nbytes, _, _) in enumerate(rows):
            s = torch.UntypedStorage(nbytes, device=tdev)
            storages.append(s)
            if nbytes:
                kind = _adapt.MEM_CUDA if dev.kind == "cuda" else _adapt.MEM_HOST
                targets.append((i, s.data_ptr(), nbytes, kind))
        if dev.kind == "cuda":
            _adapt.sync_current_stream({dev.index})
        reader.read_storages(targets)
    made: Dict[int, Any] = {}
    tensor_rows = reader.tensors

    def make_tensor(index: int):
        t = made.get(index)
        if t is None:
            name, code, shape, stride, soff, sidx, rg, is_param, _, _, _ = tensor_rows[index]
            t = torch.empty((0,), dtype=_adapt.torch_dtype(code, f"tensor '{name}'"), device=tdev)
            t.set_(storages[sidx], soff, shape, stride)
            if is_param:
                t = torch.nn.Parameter(t, requires_grad=bool(rg))
            elif rg:
                t.requires_grad_(True)
            made[index] = t
        return t

    def make_dict(ordered: bool):
        return collections.OrderedDict() if ordered else {}

    def make_dtype(name: str):
        return getattr(torch, name)

    def set_attrs(obj, attrs):
        for k, v in attrs.items():
            setattr(obj, k, v)

    return reader.tree(make_tensor, make_dict, make_dtype, torch.device, set_attrs, torch.Size, numpy_value)


def numpy_value(cls: str, args: tuple) -> Any:
    """The numpy value of a node the restricted unpickler checked and built as
    data (src/format/pickle_numpy.c): a dtype from its text ("<f8"), an array
    or scalar copied out of its bytes with np.frombuffer. numpy's own
    unpickling is never run; the result is what it gives (an array in native
    byte order, as numpy swaps one pickled in the other)."""
    try:
        import numpy as np
    except ImportError:
        raise ModuleNotFoundError("this checkpoint holds numpy values: install numpy to load them") from None
    if cls == "numpy.dtype":
        return np.dtype(args[0])
    if cls == "numpy.ndarray":
        dtype, shape, fortran, data = args
        array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        return array.astype(dtype.newbyteorder("="), order="K")  # a copy, writable, in native byte order
    if cls == "numpy.generic":
        dtype, data = args
        return np.frombuffer(data, dtype=dtype)[0]
    raise TypeError(f"ckptio: no numpy value of class {cls!r}")
