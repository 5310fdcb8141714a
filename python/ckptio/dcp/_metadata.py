"""Loads a DCP ``.metadata`` file without running code from it.

torch's FileSystemReader reads ``.metadata`` with an unrestricted
``pickle.load``: a hostile checkpoint directory can run any code on load.
Here libckptio's restricted unpickler (DCP mode) reads the pickle; only the
classes docs/FORMATS.md lists for ``.metadata`` may be named, and anything
else fails with CkptioError E_DISALLOWED naming the global. torch's real
objects are then built by an explicit table of classes: nothing is looked up
by a name taken from the file, and state is applied the way pickle's BUILD
applies it (instance ``__dict__`` update, ``TensorProperties.__setstate__``
with checked values). The containers, the dataclasses and ``torch.Size`` are
built in C (python/src/ckpy_pickle.c, from the tables below); the rarer classes by
``_other`` here.

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

import array
import collections
import dataclasses
import os
import pathlib
import re
from typing import Optional

import torch
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint.filesystem import _StorageInfo

from .. import _bulk, _ckptio, _files
from .._errors import make_error

_MD = "torch.distributed.checkpoint.metadata."
_NONE = type(None)


def _field(name: str, types: tuple, words: str, *, required: bool = True, items: Optional[type] = None):
    """A field a dataclass's state must give (required) or may give, the types it may have ("words" says them
    in an error) and, for a list or tuple, the type of each item."""
    return (name, types, required, items, words)


# Classes whose instances are rebuilt as pickle does for a dataclass:
# cls.__new__(cls) (NEWOBJ with no arguments), then BUILD updates __dict__;
# then the fields below are checked (other fields, which a newer torch may
# add, are kept as they are). So a .metadata missing a chunk's sizes is an
# E_FORMAT naming the class and field, not an AttributeError in torch's planner.
_DATACLASSES = {
    _MD + "Metadata": (_md.Metadata, (
        _field("state_dict_metadata", (dict,), "a dict"),
        _field("storage_data", (dict, _NONE), "a dict or None", required=False),
        _field("storage_meta", (_md.StorageMeta, _NONE), "a StorageMeta or None", required=False),
        _field("version", (str, _NONE), "a str or None", required=False))),
    _MD + "TensorStorageMetadata": (_md.TensorStorageMetadata, (
        _field("properties", (_md.TensorProperties,), "a TensorProperties"),
        _field("size", (torch.Size,), "a torch.Size"),
        _field("chunks", (list,), "a list of ChunkStorageMetadata", items=_md.ChunkStorageMetadata))),
    _MD + "BytesStorageMetadata": (_md.BytesStorageMetadata, ()),
    _MD + "ChunkStorageMetadata": (_md.ChunkStorageMetadata, (
        _field("offsets", (torch.Size,), "a torch.Size"),
        _field("sizes", (torch.Size,), "a torch.Size"))),
    _MD + "MetadataIndex": (_md.MetadataIndex, (
        _field("fqn", (str,), "a str"),
        _field("offset", (torch.Size, _NONE), "a torch.Size or None", required=False),
        _field("index", (int, _NONE), "an int or None", required=False))),
    _MD + "StorageMeta": (_md.StorageMeta, (
        _field("checkpoint_id", (str, pathlib.PurePath, _NONE), "a str, a path or None", required=False),
        _field("save_id", (str, _NONE), "a str or None", required=False),
        _field("load_id", (str, _NONE), "a str or None", required=False),
        _field("modules", (list,), "a list of str", required=False, items=str))),
    "torch.distributed.checkpoint.filesystem._StorageInfo": (_StorageInfo, (
        _field("relative_path", (str,), "a str"),
        _field("offset", (int,), "an int"),
        _field("length", (int,), "an int"),
        _field("transform_descriptors", (list, tuple, _NONE), "a list of str or None", required=False,
               items=str))),
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


def _other(cls_name: str, args, state):
    """The objects _ckptio.dcp_metadata_objects does not build itself, from
    their arguments and state (already built; state is None but for
    TensorProperties, whose BUILD state the C side lets through)."""
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
        return _tensor_properties(args, state)
    raise _Refused(f"no mapping for class {cls_name}")


def _tensor_properties(args, state):
    if args:
        raise _Refused(f"TensorProperties created with arguments {args!r}")
    obj = _md.TensorProperties.__new__(_md.TensorProperties)
    if state is None:
        return obj
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


def _check_chunks(origin: str, fqn: str, tsm, whole: bool) -> None:
    """Every chunk of a tensor has its rank and lies inside it, and with `whole` together they tile it exactly
    (_ckptio.dcp_check_chunks, the check ``ckptio verify`` makes). torch's planner places chunks by their
    offsets unchecked: with a negative offset, dcp.load put other rows into the tensor without an error; with
    a gap, part of the tensor silently kept its old values. `whole` holds for a directory's .metadata written
    by several ranks (_saved_by_ranks); a rank's own ``__RANK.metadata`` (a save without collectives), or one
    process's save of its own shards, holds only some chunks of a tensor."""
    shape, chunks = tsm.size, tsm.chunks
    nd = len(shape)
    for i, c in enumerate(chunks):
        if len(c.offsets) != nd or len(c.sizes) != nd:
            raise _Refused(f"state_dict_metadata[{fqn!r}]: chunk {i} has {len(c.offsets)} offsets and "
                           f"{len(c.sizes)} sizes for a {nd}-d tensor")
    try:
        offsets = array.array("q", [x for c in chunks for x in c.offsets]).tobytes()
        sizes = array.array("q", [x for c in chunks for x in c.sizes]).tobytes()
        _ckptio.dcp_check_chunks(origin, fqn, tuple(shape), len(chunks), offsets, sizes, whole)
    except OverflowError:
        raise _Refused(f"state_dict_metadata[{fqn!r}]: a size, offset or chunk size does not fit 64 bits") from None


def _saved_by_ranks(storage_data) -> bool:
    """Whether the data files are several ranks' (``__RANK_...``): torch's save planner checked then that every
    tensor's chunks cover it (it checks that only when several ranks plan; a process saving alone may write
    just its own shard of a tensor, and torch loads that shard back). The rule is C's
    (ckptio_dcp_saved_by_ranks), which `ckptio verify` applies too."""
    if not isinstance(storage_data, dict):
        return False
    paths = {getattr(info, "relative_path", None) for info in storage_data.values()}  # fields checked as built
    return _ckptio.dcp_saved_by_ranks([p for p in paths if isinstance(p, str)])


def _check(md, origin: str, whole: bool) -> None:
    if not isinstance(md, _md.Metadata):
        raise _Refused(f"the pickled object is a {type(md).__name__}, not a Metadata")
    sdm = md.__dict__.get("state_dict_metadata")
    if not isinstance(sdm, dict):
        raise _Refused("Metadata.state_dict_metadata is missing or not a dict")
    whole = whole and _saved_by_ranks(md.__dict__.get("storage_data"))
    for fqn, item in sdm.items():
        if not isinstance(fqn, str):
            raise _Refused(f"state_dict_metadata has the key {fqn!r}, not a str")
        if isinstance(item, _md.TensorStorageMetadata):
            _check_chunks(origin, fqn, item, whole)
        elif not isinstance(item, _md.BytesStorageMetadata):
            raise _Refused(f"state_dict_metadata[{fqn!r}] is a {type(item).__name__}")
    sd = md.__dict__.get("storage_data")
    if sd is not None and not isinstance(sd, dict):
        raise _Refused("Metadata.storage_data is not a dict")


def metadata_from_bytes(data: bytes, origin: str = "<memory>", whole: bool = True) -> _md.Metadata:
    """The Metadata pickled in `data`, read without running code. Raises
    CkptioError: E_DISALLOWED naming a global outside the allowlist,
    E_TRUNCATED / E_FORMAT for a malformed pickle or object graph, or for
    chunks outside their tensor or, with `whole` (a directory's .metadata,
    not a rank's own __RANK.metadata) and data files of several ranks, not
    tiling it."""
    # The objects are millions of new containers for a large checkpoint,
    # none of them garbage: the cyclic collector's passes over them would
    # take most of the time (docs/DCP.md#measured).
    try:
        with _bulk.no_gc():
            md = _ckptio.dcp_metadata_objects(bytes(data), origin, _DATACLASSES, torch.Size, _DTYPES,
                                              collections.OrderedDict, _Refused, _other)
            _check(md, origin, whole)
    except _Refused as e:
        raise _error(origin, str(e)) from None
    except (TypeError, ValueError, RecursionError, AttributeError) as e:  # unhashable keys, a key missing a field
        raise _error(origin, f"{type(e).__name__}: {e}") from None
    return md


def load_metadata(path) -> _md.Metadata:
    """Reads and unpickles the ``.metadata`` file at `path` (see metadata_from_bytes); a rank's own
    ``__RANK.metadata`` need not tile its tensors."""
    path = os.fspath(path)
    data = _files.read_file(path)  # a FIFO or device under the name is refused, never waited on
    return metadata_from_bytes(data, path, whole=re.fullmatch(r"__\d+\.metadata", os.path.basename(path)) is None)


__all__ = ["load_metadata", "metadata_from_bytes"]
