"""ckptio.dcp.verify: checks a DCP checkpoint directory by the rule ``ckptio
verify DIR`` applies (``ckptio_dcp_validate``): every item against the
manifest ckptio.dcp's writer left (XXH3-64 of every item's stored bytes, or of
each of its parts), or, for a directory without one (torch wrote it), its
structure."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .. import _ckptio
from .._ckptio import Engine


def verify(path, *, engine: Optional[Engine] = None) -> Dict[str, Any]:
    """Checks the checkpoint in directory `path`, the same C call and the same
    result as ``ckptio verify DIR``:

    - with a ckptio manifest beside ``.metadata``: every item is read and its
      XXH3-64 compared with the manifest's (items saved from GPU memory carry
      "parts", hashed ranges computed on the staging copies; each is checked);
    - without one (torch or another writer saved it, or the manifest is
      gone): the structure is checked instead (every item inside its file,
      every archive / SAFETENSORS blob / zstd frame parses and matches the
      dtype and chunk shape of ``.metadata``, chunks tile every tensor when
      several ranks saved). That is not an error: the result says
      ``"manifest": None, "checksums": False`` (the bytes were not compared
      with checksums), as the command's line says "no ckptio manifest".

    Either way every byte item passes the restricted unpickler. Runs in
    libckptio (``ckptio_dcp_open`` + ``ckptio_dcp_validate``): .metadata is
    read with the restricted unpickler, items are read in pieces of at most
    64 MiB, the GIL is released.

    Returns {"items", "checked" (items whose hash matched, or whose structure
    was validated), "unhashed" (manifest items without a hash), "bytes",
    "partial", "manifest" (its file name, or None), "checksums" (True when
    the bytes were compared with the manifest)}. "partial" counts the tensors
    saved in part, which a save of one process may hold (its own shard of a
    tensor, which torch loads back); a save of several ranks must tile every
    tensor, else E_FORMAT names the gap or overlap.
    Raises CkptioError: E_CHECKSUM naming the file, offset and tensor of the
    first mismatch; E_FORMAT when the manifest and .metadata disagree or an
    item does not parse; E_DISALLOWED when .metadata or a byte item names a
    global outside the allowlist (nothing is run).
    """
    return _ckptio.dcp_verify(os.fspath(path), engine)


__all__ = ["verify"]
