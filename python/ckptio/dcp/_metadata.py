"""Loads a DCP ``.metadata`` file without running code from it.

torch's FileSystemReader reads ``.metadata`` with an unrestricted
``pickle.load``: a hostile checkpoint directory can run any code on load.
Here libckptio's restricted unpickler (DCP mode) reads the pickle into a
value tree; only the classes docs/FORMATS.md lists for ``.metadata`` may be
named, and anything else fails with CkptioError E_DISALLOWED naming the
global. This module then builds torch's real objects from the tree by an
explicit table of classes: nothing is looked up by a name taken from the
file, and state is applied the way pickle's BUILD applies it (instance
``__dict__`` update, ``TensorProperties.__setstate__`` with checked values).

Files from torch <= 2.2 name TensorProperties and MEM_FORMAT_ENCODING under
``torch.distributed._shard.sharded_tensor.metadata``. The allowlist
(src/format/pickle_dcp.c) gives the tree the current names for them, so they
are rebuilt here as today's ``TensorProperties`` / ``_MEM_FORMAT_ENCODING``
with the same checks (torch itself keeps the old classes, which hold the
same fields).

A torch whose ``TensorProperties`` has no ``strides`` field reads only the
5-field state; a 6-field one (written by a newer torch) is refused with
E_FORMAT, as torch's own ``pickle.load`` refuses it.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import pathlib
from typing import Any, Dict

import torch
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint.filesystem import _StorageInfo

from .. import _ckptio
from .._errors import make_error

_MD = "torch.distributed.checkpoint.metadata."
# Classes whose instances are rebuilt as pickle does for a dataclass:
# cls.__new__(cls) (NEWOBJ with no arguments), then BUILD updates __dict__.
_DATACLASSES = {
    _MD + "Metadata": _md.Metadata,
    _MD + "TensorStorageMetadata": _md.TensorStorageMetadata,
    _MD + "BytesStorageMetadata": _md.BytesStorageMetadata,
    _MD + "ChunkStorageMetadata": _md.ChunkStorageMetadata,
    _MD + "MetadataIndex": _md.MetadataIndex,
    _MD + "StorageMeta": _md.StorageMeta,
    "torch.distributed.checkpoint.filesystem._StorageInfo": _StorageInfo,
}
_LAYOUTS = {str(layout): layout for layout in (torch.strided, torch.sparse_coo, torch.sparse_csr, torch.sparse_csc,
                                                torch.sparse_bsr, torch.sparse_bsc, torch._mkldnn)}
_DTYPES = {str(d)[len("torch."):]: d for d in vars(torch).values() if isinstance(d, torch.dtype)}
# Newer torch pickles TensorProperties with a 6th field, strides; older torch (2.11 for one) has no such
# field, and its __setstate__ takes exactly 5, so its own pickle.load refuses 6-field files.
_PROPS_HAVE_STRIDES = "strides" in {f.name for f in dataclasses.fields(_md.TensorProperties)}


class _Refused(Exception):
    pass


def _error(origin: str, message: str):
    return make_error(_ckptio.E_FORMAT, "E_FORMAT", 0, 0, "load DCP metadata", origin, None, ".metadata",
                      f"{origin}: load DCP metadata: {message}")


class _Builder:
    def __init__(self) -> None:
        self.memo: Dict[int, Any] = {}
        self.keep = []  # the tree nodes memo ids refer to stay alive while building

    def build(self, node):
        if type(node) is not tuple:  # None, bool, int, float, str, bytes: every other node is a tagged tuple
            return node
        hit = self.memo.get(id(node))
        if hit is not None:
            return hit[0]
        value = self._build(node)
        self.memo[id(node)] = (value,)
        self.keep.append(node)
        return value

    def _build(self, node):
        tag = node[0]
        if tag == _ckptio.PICKLE_TAG_LIST:
            return [self.build(x) for x in node[1]]
        if tag == _ckptio.PICKLE_TAG_TUPLE:
            return tuple(self.build(x) for x in node[1])
        if tag == _ckptio.PICKLE_TAG_SET:
            return {self.build(x) for x in node[1]}
        if tag == _ckptio.PICKLE_TAG_DICT:
            _, ordered, pairs, attrs = node
            if attrs is not None:
                raise _Refused("a dict with attributes (BUILD state) does not occur in DCP metadata")
            d = collections.OrderedDict() if ordered else {}
            for k, v in pairs:
                d[self.build(k)] = self.build(v)
            return d
        if tag == _ckptio.PICKLE_TAG_DTYPE:
            dtype = _DTYPES.get(node[1])
            if dtype is None:
                raise _Refused(f"dtype torch.{node[1]} does not exist in this torch")
            return dtype
        if tag == _ckptio.PICKLE_TAG_OBJECT:
            return self._object(node[1], node[2], node[3])
        raise _Refused(f"unknown node tag {tag!r}")

    def _object(self, cls_name: str, args_node, state_node):
        args = self.build(args_node)
        cls = _DATACLASSES.get(cls_name)
        if cls is not None:
            if args:
                raise _Refused(f"{cls_name} created with arguments {args!r} (pickle passes none)")
            obj = cls.__new__(cls)
            if state_node is not None:
                state = self.build(state_node)
                if not isinstance(state, dict):
                    raise _Refused(f"{cls_name} state is a {type(state).__name__}, not a dict")
                for k, v in state.items():
                    if not isinstance(k, str) or not k.isidentifier() or k.startswith("__"):
                        raise _Refused(f"{cls_name} state has the field name {k!r}")
                    obj.__dict__[k] = v
            return obj
        if state_node is not None and cls_name != _MD + "TensorProperties":
            raise _Refused(f"{cls_name} with BUILD state")
        if cls_name == "torch.Size":
            if len(args) > 1 or (args and (not isinstance(args[0], (tuple, list)) or
                                           not all(type(x) is int for x in args[0]))):
                raise _Refused(f"torch.Size of {args!r} (want one tuple of ints)")
            return torch.Size(args[0] if args else ())
        if cls_name == "torch.serialization._get_layout":
            if len(args) != 1 or not isinstance(args[0], str) or args[0] not in _LAYOUTS:
                raise _Refused(f"unknown layout {args!r}")
            return _LAYOUTS[args[0]]
        if cls_name == _MD + "_MEM_FORMAT_ENCODING":
            if len(args) != 1 or type(args[0]) is not int:
                raise _Refused(f"_MEM_FORMAT_ENCODING of {args!r}")
            try:
                return _md._MEM_FORMAT_ENCODING(args[0])
            except ValueError:
                raise _Refused(f"_MEM_FORMAT_ENCODING has no member {args[0]}") from None
        if cls_name == "pathlib.PosixPath":
            if not all(isinstance(a, str) for a in args):
                raise _Refused(f"PosixPath of {args!r} (want strings)")
            return pathlib.PosixPath(*args)
        if cls_name == _MD + "TensorProperties":
            return self._tensor_properties(args, state_node)
        raise _Refused(f"no mapping for class {cls_name}")

    def _tensor_properties(self, args, state_node):
        if args:
            raise _Refused(f"TensorProperties created with arguments {args!r}")
        obj = _md.TensorProperties.__new__(_md.TensorProperties)
        if state_node is None:
            return obj
        state = self.build(state_node)
        ok = isinstance(state, tuple) and len(state) in (5, 6)
        if ok:
            dtype, layout, requires_grad, mem, pin = state[:5]
            strides = state[5] if len(state) == 6 else None
            ok = (isinstance(dtype, torch.dtype) and isinstance(layout, torch.layout) and type(requires_grad) is bool
                  and isinstance(mem, _md._MEM_FORMAT_ENCODING) and type(pin) is bool and
                  (strides is None or (isinstance(strides, tuple) and all(type(s) is int for s in strides))))
        if not ok:
            raise _Refused(f"TensorProperties state {state!r} is not (dtype, layout, bool, "
                           "_MEM_FORMAT_ENCODING, bool[, strides])")
        if len(state) == 6 and not _PROPS_HAVE_STRIDES:
            raise _Refused(f"TensorProperties state has 6 fields (strides {state[5]!r}): the checkpoint was "
                           f"written by a newer torch, and torch {torch.__version__}'s TensorProperties has no "
                           "strides field (torch's own reader cannot load it either)")
        obj.__setstate__(state)
        return obj


def _check(md) -> None:
    if not isinstance(md, _md.Metadata):
        raise _Refused(f"the pickled object is a {type(md).__name__}, not a Metadata")
    sdm = md.__dict__.get("state_dict_metadata")
    if not isinstance(sdm, dict):
        raise _Refused("Metadata.state_dict_metadata is missing or not a dict")
    for fqn, item in sdm.items():
        if not isinstance(item, (_md.TensorStorageMetadata, _md.BytesStorageMetadata)):
            raise _Refused(f"state_dict_metadata[{fqn!r}] is a {type(item).__name__}")
    sd = md.__dict__.get("storage_data")
    if sd is not None and not isinstance(sd, dict):
        raise _Refused("Metadata.storage_data is not a dict")


def metadata_from_bytes(data: bytes, origin: str = "<memory>") -> _md.Metadata:
    """The Metadata pickled in `data`, read without running code. Raises
    CkptioError: E_DISALLOWED naming a global outside the allowlist,
    E_TRUNCATED / E_FORMAT for a malformed pickle or object graph."""
    # The tree and the objects are millions of new containers for a large
    # checkpoint, none of them garbage: the cyclic collector's passes over
    # them took most of the time (100k chunks on the 2-core VM: 12 s before
    # this and the tree's unshared scalars, under 4 s after;
    # bench/bench_dcp_metadata.py).
    paused = gc.isenabled()
    gc.disable()
    try:
        tree = _ckptio.dcp_metadata_tree(bytes(data), origin)
        md = _Builder().build(tree)
        _check(md)
    except _Refused as e:
        raise _error(origin, str(e)) from None
    except (TypeError, ValueError, RecursionError) as e:  # unhashable keys, ...
        raise _error(origin, f"{type(e).__name__}: {e}") from None
    finally:
        if paused:
            gc.enable()
    return md


def load_metadata(path) -> _md.Metadata:
    """Reads and unpickles the ``.metadata`` file at `path` (see metadata_from_bytes)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    return metadata_from_bytes(data, path)


__all__ = ["load_metadata", "metadata_from_bytes"]
