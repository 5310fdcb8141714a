"""Checkpoints as bytes: ``ckptio.save(sd)`` returns them, ``ckptio.load``
takes bytes, a memoryview or a binary file object (what safetensors.torch's
``save``/``load`` and ``torch.save(obj, buffer)`` give object stores and RPC).

The bytes live in an anonymous memory file (``memfd_create``) that the
library reads and writes through its ``/proc/self/fd/N`` name: the same
parsers, validation and writers as for files on disk, nothing written to any
file system, nothing left behind if the process dies. A save writes that
file in place (there is nothing to rename over it) and returns its content.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
from typing import Any, Iterator, Optional

from ._errors import CkptioError

_NAME = "<bytes>"  # what error messages call the data instead of /proc/self/fd/N


def is_memory(source: Any) -> bool:
    """bytes, bytearray, memoryview or an object with ``read`` (not a path)."""
    return isinstance(source, (bytes, bytearray, memoryview)) or (
        not isinstance(source, (str, os.PathLike)) and hasattr(source, "read"))


def _memfd() -> int:
    try:
        return os.memfd_create("ckptio", getattr(os, "MFD_CLOEXEC", 1))
    except (AttributeError, OSError) as exc:  # not Linux, or no memfd (very old kernels)
        raise OSError(f"ckptio: saving to or loading from memory needs memfd_create: {exc}") from None


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


@contextlib.contextmanager
def _renamed(path: str) -> Iterator[None]:
    """Errors name the data "<bytes>", not the memory file's /proc path."""
    try:
        yield
    except CkptioError as exc:
        for attr in ("message", "strerror"):
            value = getattr(exc, attr, None)
            if isinstance(value, str):
                setattr(exc, attr, value.replace(path, _NAME))
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (exc.args[0].replace(path, _NAME),) + tuple(exc.args[1:])
        if getattr(exc, "path", None) == path:
            exc.path = exc.filename = _NAME
        raise
    except (ValueError, TypeError, KeyError) as exc:
        if exc.args and isinstance(exc.args[0], str) and path in exc.args[0]:
            exc.args = (exc.args[0].replace(path, _NAME),) + tuple(exc.args[1:])
        raise


def _regular_file_at_start(source: Any) -> Optional[int]:
    """The descriptor of a file object over a regular file positioned at 0,
    which the library can read through its own name without a copy."""
    try:
        fd = source.fileno()
        if source.tell() != 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return fd
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


@contextlib.contextmanager
def readable_path(source: Any) -> Iterator[str]:
    """A path the library can open for `source` (bytes-like or a binary file
    object), valid inside the block; errors inside name it "<bytes>"."""
    if not isinstance(source, (bytes, bytearray, memoryview)):
        fd = _regular_file_at_start(source)
        if fd is not None:
            path = _fd_path(fd)
            with _renamed(path):
                yield path
            return
        data = source.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"ckptio.load: the file object's read() returned {type(data).__name__}, not bytes "
                            "(open the file in binary mode)")
        source = data
    view = memoryview(source).cast("B")
    fd = _memfd()
    try:
        if view.nbytes:
            os.ftruncate(fd, view.nbytes)
            with mmap.mmap(fd, view.nbytes) as m:
                m[:] = view
        path = _fd_path(fd)
        with _renamed(path):
            yield path
    finally:
        os.close(fd)


def save_to_bytes(write) -> bytes:
    """Runs write(path) (an in-place save to `path`) into a memory file and
    returns what it wrote."""
    fd = _memfd()
    try:
        path = _fd_path(fd)
        with _renamed(path):
            write(path)
        size = os.fstat(fd).st_size
        if size == 0:
            return b""
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            return m[:]
    finally:
        os.close(fd)
