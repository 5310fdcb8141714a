"""A state dict saved as a Hugging Face directory (``ckptio.save(sd, "dir/",
max_shard_size=...)``): sharded safetensors and model.safetensors.index.json,
at a local directory or an ``s3://`` prefix, all shards in one engine job
(ckptio_model_save). This module parses the shard size as huggingface_hub
does and calls the C entry; the state dict's checks are ``_api``'s.
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional, Union

from . import _ckptio, _progress

DEFAULT_SHARD_SIZE = "5GB"  # huggingface_hub's MAX_SHARD_SIZE
# huggingface_hub's parse_size_to_int units (decimal, as it counts).
_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def parse_size(value: Union[int, str], where: str) -> int:
    """max_shard_size in bytes: a positive int, or a string such as "5GB",
    "500MB", "1.5GB" (units TB, GB, MB, KB of 10**3 steps, any case), as
    huggingface_hub's parse_size_to_int reads it."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{where}: max_shard_size must be an int (bytes) or a string such as '5GB', not "
                        f"{type(value).__name__}")
    if isinstance(value, str):
        text = value.strip()
        unit = text[-2:].upper()
        if unit not in _UNITS:
            raise ValueError(f"{where}: max_shard_size {value!r} has no unit TB, GB, MB or KB (e.g. '5GB', "
                             "'500MB'), or give an int of bytes")
        try:
            number = float(text[:-2].strip())
        except ValueError:
            raise ValueError(f"{where}: max_shard_size {value!r}: {text[:-2].strip()!r} is not a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError(f"{where}: max_shard_size {value!r} is not a finite size")
        size = int(number * _UNITS[unit])
    else:
        size = value
    if size <= 0:
        raise ValueError(f"{where}: max_shard_size must be positive, not {value!r}")
    if size >= 1 << 64:
        raise ValueError(f"{where}: max_shard_size {value!r} is too large")
    return size


def check_options(path: str, format: Optional[str], checksums: bool, align: Optional[int]) -> str:
    """The format of a directory save ("safetensors"), or ValueError for options it does not take."""
    if (format is not None and str(format).lower() != "safetensors") or checksums or align not in (None, 4096):
        raise ValueError(f"{path}: a directory of shards is safetensors with 4 KiB-aligned data, without checksum "
                         "manifests (format='safetensors', align=4096, checksums=False)")
    return "safetensors"


def is_directory_target(path: str, max_shard_size: Any) -> bool:
    """A save writes a directory when a shard size is given, when the path
    ends in '/', or when it names an existing local directory."""
    if max_shard_size is not None or path.endswith("/"):
        return True
    return not path.startswith("s3://") and os.path.isdir(path)


def save(tensors: List[tuple], path: str, max_shard_size: Any, metadata: Optional[Mapping[str, str]], engine,
         progress: "_progress.Progress", overwrite: bool) -> int:
    """Writes the directory; returns its shard count."""
    size = parse_size(DEFAULT_SHARD_SIZE if max_shard_size is None else max_shard_size, path)
    with _progress.reporting(progress, f"save {path}"):
        return _ckptio.model_save(path, tensors, size, metadata, engine, bool(overwrite))
