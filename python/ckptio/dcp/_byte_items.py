"""The save-time check of byte items: a value ckptio's reader would refuse is
refused when it is saved, before anything is written, so that nothing
unloadable is ever committed.

torch's planner pickles each non-tensor value of a state dict with
``torch.save`` into a byte item (DefaultSavePlanner.transform_object). The
bytes it made are run through libckptio's restricted unpickler, the very
check ``ckptio.dcp.FileSystemReader``, ``ckptio.dcp.verify`` and ``ckptio
verify`` apply when they read the item (``ckptio_torch_parse``), so the
writer and every reader agree on what loads. Used by
:class:`ckptio.dcp.FileSystemWriter` (on the bytes it is about to write) and
by :class:`ckptio.CheckpointManager` (on the state dict, before it touches
the root).
"""

from __future__ import annotations

import re
from typing import Any, Optional

from .. import _ckptio
from .._errors import CkptioError

_GLOBAL = re.compile(r"global '([^']+)'")


def _type_name(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _hint(message: str, writer: bool) -> str:
    found = _GLOBAL.search(message)
    refused = found.group(1) if found else None
    if refused == "argparse.Namespace":
        hint = "store vars() of the Namespace (a dict) instead"
    elif refused is not None:
        hint = ("store it as plain values instead: dicts, lists, tuples, str, numbers, tensors, numpy arrays "
                "(for an object: vars(obj) or its state_dict())")
    else:
        hint = "store it as plain values instead: dicts, lists, tuples, str, numbers, tensors, numpy arrays"
    if writer:
        hint += ("; or, for a checkpoint read only by code you trust, FileSystemWriter(..., allow_pickle=True) "
                 "saves it and FileSystemReader(..., allow_pickle=True) loads it")
    return hint


def check(raw: bytes, fqn: str, value: Any, where: str, *, writer: bool) -> None:
    """Raises TypeError naming `where`, the state-dict key `fqn`, the value's
    type and what to do when ckptio's reader would refuse the byte item
    `raw` (torch.save's bytes of `value`). Other failures (out of memory)
    propagate as they are."""
    try:
        _ckptio.torch_reader_from_bytes(raw, "<memory>").close()
    except CkptioError as e:
        if e.status_name == "E_NOMEM":
            raise
        reason = e.message[len("<memory>: "):] if e.message.startswith("<memory>: ") else e.message
        kind = "" if value is None else f" ({_type_name(value)})"
        raise TypeError(f"{where}: cannot save '{fqn}'{kind}: ckptio's reader would refuse it, so the checkpoint "
                        f"could not be loaded back ({reason}); {_hint(reason, writer)}") from None


def plain_state_dict(state_dict: Any) -> Any:
    """What dcp.save saves of `state_dict`: a shallow copy in which every
    top-level Stateful value is replaced by its state_dict(), called once here
    as dcp.save calls it (dcp.save given the copy calls none again)."""
    from torch.distributed.checkpoint.stateful import Stateful

    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}


# Values the reader always loads, pickled by torch.save as they are: None, bool, int within int64, float, str,
# and tuples, lists and dicts of them, kept well inside the reader's nesting limit (512) and small.
_ATOMS = (type(None), bool, float, str)
_PLAIN_DEPTH = 32
_PLAIN_ITEMS = 4096
_INT64 = (-(1 << 63), 1 << 63)


def _plain(v: Any, depth: int) -> bool:
    t = type(v)
    if t in _ATOMS:
        return True
    if t is int:
        return _INT64[0] <= v < _INT64[1]
    if depth >= _PLAIN_DEPTH:
        return False
    if t is tuple or t is list:
        return len(v) <= _PLAIN_ITEMS and all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return len(v) <= _PLAIN_ITEMS and all((type(k) is str or type(k) is int) and _plain(x, depth + 1)
                                              for k, x in v.items())
    return False


def _only_plain_values(v: Any, tensor: type, mapping: type, depth: int = 0) -> bool:
    """True when every value of `v` that is not a tensor is plain (_plain): then no byte item dcp.save would
    make of it can be refused, and nothing needs pickling. Walks as torch's planner flattens (mappings and
    lists into their values); anything else is judged whole."""
    if isinstance(v, tensor):
        return True
    if depth >= _PLAIN_DEPTH:
        return False
    if isinstance(v, mapping):
        return all(_only_plain_values(x, tensor, mapping, depth + 1) for x in v.values())
    if type(v) is list:
        return all(_only_plain_values(x, tensor, mapping, depth + 1) for x in v)
    return _plain(v, depth)


def check_state_dict(state_dict: Any, where: str) -> None:
    """Runs `check` on every byte item torch's default planner would make of
    `state_dict` (after plain_state_dict; flattened as dcp.save flattens it),
    without writing anything. A state whose only values besides tensors are
    plain (None, bool, int, float, str and tuples, lists and dicts of them)
    is accepted without pickling anything: a training loop's state passes in
    well under a millisecond; any other value sends the whole state through
    the planner and the reader's check."""
    from collections.abc import Mapping

    import torch

    if _only_plain_values(state_dict, torch.Tensor, Mapping):
        return
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner, create_default_local_save_plan
    from torch.distributed.checkpoint.planner import WriteItemType

    planner = DefaultSavePlanner()
    planner.set_up_planner(state_dict, is_coordinator=True)
    for wi in create_default_local_save_plan(planner.state_dict, True).items:
        if wi.type == WriteItemType.BYTE_IO:
            check(planner.resolve_data(wi).getvalue(), wi.index.fqn, lookup(planner, wi), where, writer=False)


def lookup(planner: Any, wi: Any) -> Optional[Any]:
    """The value behind byte item `wi` (None when the planner cannot say)."""
    try:
        return planner.lookup_object(wi.index)
    except Exception:  # noqa: BLE001 - only for the message
        return None
