"""ckptio.convert: any checkpoint ckptio reads into any format it writes, in C
(``ckptio_convert``, the same call as ``ckptio convert IN OUT``)."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from . import _ckptio, _warn


def convert(src: "os.PathLike[str] | str", dst: "os.PathLike[str] | str", *, to: Optional[str] = None,
            shard_size: Optional[int] = None, alignment: Optional[int] = None, engine=None) -> Dict[str, Any]:
    """Converts the checkpoint at `src` (a safetensors file, a Hugging Face
    directory or its index, a torch.save file, a torch.distributed.checkpoint
    directory; detected from its bytes) into `dst`, tensor by tensor in
    bounded memory, the tensors bit for bit.

    Args:
        to: "safetensors", "hf" (a Hugging Face directory: shards and
            model.safetensors.index.json), "torch" (a torch.save file, a flat
            dict of tensors) or "dcp" (a torch.distributed.checkpoint
            directory as ``ckptio.dcp`` writes it, with its checksum
            manifest). None: by `dst`'s name, as ``ckptio convert`` decides
            (``*.safetensors``, ``*.pt``/``.pth``/``.bin``/``.ckpt``; a
            directory is Hugging Face for a DCP input, else say `to`).
        shard_size: the largest shard of a Hugging Face output (default 5 GB,
            5 * 10**9); implies to="hf".
        alignment: storage alignment of a torch.save output (default 4096).
        engine: a ckptio.Engine (default: the shared default engine).

    `dst` is written atomically: a file through a temporary renamed over it,
    a directory built beside it and renamed into place (it must not exist or
    be empty). What `dst` cannot hold (non-tensor values, byte items,
    __metadata__) is said in one UserWarning each, pointing at the caller.
    Returns {"from", "to", "tensors", "bytes", "files", "byte_items",
    "dropped", "shared"}. Raises CkptioError naming the file and the reason
    (before anything is written when the input, a dtype or `dst` rules it out).
    """
    r = _ckptio.convert(os.fspath(src), os.fspath(dst), to if to is not None else "auto",
                        0 if shard_size is None else int(shard_size), 0 if alignment is None else int(alignment),
                        engine)
    for line in r.pop("notes").splitlines():
        _warn.warn(line, UserWarning)
    return r
