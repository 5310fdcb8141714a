"""ckptio.dcp.verify: checks a DCP checkpoint written by ckptio.dcp against
its manifest (XXH3-64 of every item's stored bytes, or of each of its parts)."""

from __future__ import annotations

import os
from typing import Dict, Optional

from .. import _ckptio
from .._ckptio import Engine


def verify(path, *, engine: Optional[Engine] = None) -> Dict[str, int]:
    """Reads every item of the checkpoint in directory `path` and compares its
    XXH3-64 with the manifest the writer left beside ``.metadata``. Items
    saved from GPU memory carry "parts" (hashed ranges, computed on the
    staging copies) instead of one hash; each part is checked.

    Runs in libckptio (``ckptio_dcp_open`` + ``ckptio_dcp_verify``, the same
    check as ``ckptio verify DIR``): .metadata is read with the restricted
    unpickler, items are hashed in pieces of at most 64 MiB, the GIL is
    released.

    Returns {"items", "checked", "unhashed" (no hash recorded), "bytes", "partial"}: "partial" counts the
    tensors saved in part, which a save of one process may hold (its own shard of a tensor, which torch loads
    back); a save of several ranks must tile every tensor, else E_FORMAT names the gap or overlap.
    Raises CkptioError: E_CHECKSUM naming the file, offset and tensor of the
    first mismatch; E_NOT_FOUND when there is no manifest for this .metadata
    (a checkpoint written by torch, or a save that did not finish);
    E_FORMAT when the manifest and .metadata disagree; E_DISALLOWED when
    .metadata names a global outside the DCP allowlist (nothing is run).
    """
    return _ckptio.dcp_verify(os.fspath(path), engine)


__all__ = ["verify"]
