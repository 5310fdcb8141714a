"""Directory-level commit steps of a DCP save: atomic small files, the save
token in data file names, and removal of what older saves left behind."""

from __future__ import annotations

import os
import re
import uuid
from typing import Iterable, Optional, Set

# __{rank}_{token}_{n}.distcp: the names ckptio.dcp gives data files.
_DATA_RE = re.compile(r"^__(\d+)_([0-9a-f]{12})_(\d+)\.distcp$")
# Anything a DCP writer (torch's or ckptio's) may leave in a checkpoint directory.
_STALE_RE = re.compile(r"^(__\d+_.*\.distcp|\.ckptio-manifest-[0-9a-f]+\.json|\.metadata\.tmp|__\d+\.metadata\.tmp)$")


def token_of(files: Iterable[str]) -> Optional[str]:
    """The save token shared by ckptio-named data files, else None."""
    tokens = set()
    for name in files:
        m = _DATA_RE.match(name)
        if not m:
            return None
        tokens.add(m.group(2))
    return tokens.pop() if len(tokens) == 1 else None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(dirpath, name: str, data: bytes, sync: bool) -> None:
    """Writes dirpath/name through a temporary: write, fsync, rename, fsync the
    directory (without sync: no fsyncs). On failure the old file is untouched."""
    dirpath = os.fspath(dirpath)
    final = os.path.join(dirpath, name)
    tmp = os.path.join(dirpath, f".{name}.ckptio-tmp-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if sync:
        fsync_dir(dirpath)


def remove_stale(dirpath, keep: Set[str], sync: bool) -> None:
    """Deletes data files, manifests and temporaries of older saves (anything
    a DCP writer names that the new .metadata does not reference)."""
    dirpath = os.fspath(dirpath)
    removed = False
    for name in os.listdir(dirpath):
        if name in keep:
            continue
        if _STALE_RE.match(name) or ".ckptio-tmp-" in name:
            try:
                os.unlink(os.path.join(dirpath, name))
                removed = True
            except FileNotFoundError:
                pass
    if removed and sync:
        fsync_dir(dirpath)
