"""ckptio.dcp.verify: checks a DCP checkpoint written by ckptio.dcp against
its manifest (XXH3-64 of every item's stored bytes)."""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

import torch

from .. import _adapt, _ckptio
from .._ckptio import Engine
from .._errors import make_error
from . import _commit
from ._metadata import load_metadata
from ._writer import MANIFEST_PREFIX

# XXH3 has no combine step: each item is read whole, one item at a time.


def _error(status_name: str, path: str, offset: int, subject: Optional[str], message: str):
    status = getattr(_ckptio, status_name)
    return make_error(status, status_name, 0, 0, "verify", path, offset, subject, f"{path}: verify: {message}")


def verify(path, *, engine: Optional[Engine] = None) -> Dict[str, int]:
    """Reads every item of the checkpoint in directory `path` and compares its
    XXH3-64 with the manifest the writer left beside ``.metadata``.

    Returns {"items", "checked", "unhashed" (written from GPU memory), "bytes"}.
    Raises CkptioError: E_CHECKSUM naming the file, offset and tensor of the
    first mismatch; E_NOT_FOUND when there is no manifest for this .metadata
    (a checkpoint written by torch, or a save that did not finish);
    E_FORMAT when the manifest and .metadata disagree; E_DISALLOWED when
    .metadata names a global outside the DCP allowlist (nothing is run).
    """
    root = os.fspath(path)
    md_path = os.path.join(root, ".metadata")
    metadata = load_metadata(md_path)  # restricted unpickler: a hostile .metadata runs nothing
    files = sorted({info.relative_path for info in metadata.storage_data.values()})
    token = _commit.token_of(files)
    manifest_path = os.path.join(root, f"{MANIFEST_PREFIX}{token}.json") if token else None
    if manifest_path is None or not os.path.exists(manifest_path):
        raise _error("E_NOT_FOUND", md_path, -1, None,
                     "no ckptio manifest for this checkpoint (written by another writer, or without checksums)")
    with open(manifest_path, "rb") as f:
        doc = json.load(f)
    if doc.get("format") != "ckptio-dcp-manifest" or sorted(doc.get("files", [])) != files:
        raise _error("E_FORMAT", manifest_path, -1, None, "the manifest does not describe the files .metadata names")
    if len(doc["items"]) != len(metadata.storage_data):
        raise _error("E_FORMAT", manifest_path, -1, None,
                     f"the manifest lists {len(doc['items'])} items, .metadata {len(metadata.storage_data)}")
    report = {"items": 0, "checked": 0, "unhashed": 0, "bytes": 0}
    handles: Dict[str, object] = {}
    try:
        for item in doc["items"]:
            report["items"] += 1
            if item["xxh3"] is None:
                report["unhashed"] += 1
                continue
            fpath = os.path.join(root, item["file"])
            fh = handles.get(fpath)
            if fh is None:
                fh = handles[fpath] = _ckptio.File(fpath, _ckptio.OPEN_READ, engine)
            n = int(item["nbytes"])
            buf = torch.empty(n, dtype=torch.uint8)
            if n:
                _ckptio.dcp_read([(fh, buf.data_ptr(), n, int(item["data_offset"]), _adapt.MEM_HOST)], engine)
            got = _ckptio.hash_xxh3(buf.data_ptr() if n else 0, n)
            if f"{got:016x}" != item["xxh3"]:
                raise _error("E_CHECKSUM", fpath, int(item["data_offset"]), item["fqn"],
                             f"item '{item['fqn']}' ({n} bytes at offset {item['data_offset']}) has XXH3-64 "
                             f"{got:016x}, the manifest says {item['xxh3']}")
            report["checked"] += 1
            report["bytes"] += n
    finally:
        for fh in handles.values():
            fh.close()
    return report


__all__ = ["verify"]
