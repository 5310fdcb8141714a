"""Checkpoints as bytes: ``ckptio.save(sd)`` returns them, ``ckptio.load``
takes bytes, a memoryview or a binary file object (what safetensors.torch's
``save``/``load`` and ``torch.save(obj, buffer)`` give object stores and RPC).

The common cases work on the bytes themselves: a safetensors save of host
tensors is laid out by the library and each tensor copied once into the
bytes object (``_ckptio.safetensors_serialize``); a load to the CPU parses
the header in place (``safetensors_describe``, the torch reader's
``torch_reader_from_bytes``) and copies each tensor (or each pack of small
ones) once out of the bytes (load_in_memory). The rest - GPU tensors, torch
files saved to bytes, progress bars, ``out=`` - goes through an anonymous
memory file (``memfd_create``) that the library reads and writes through its
``/proc/self/fd/N`` name: the same parsers, validation and writers as for
files on disk, nothing written to any file system, nothing left behind if the
process dies. A save writes that file in place (there is nothing to rename
over it) and returns its content.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
import warnings
from typing import Any, Dict, Iterable, Iterator, Optional

from . import _adapt, _bulk, _ckptio
from ._errors import CkptioError

NAME = "<bytes>"  # what error messages call the data instead of /proc/self/fd/N


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
                setattr(exc, attr, value.replace(path, NAME))
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (exc.args[0].replace(path, NAME),) + tuple(exc.args[1:])
        if getattr(exc, "path", None) == path:
            exc.path = exc.filename = NAME
        raise
    except (ValueError, TypeError, KeyError) as exc:
        if exc.args and isinstance(exc.args[0], str) and path in exc.args[0]:
            exc.args = (exc.args[0].replace(path, NAME),) + tuple(exc.args[1:])
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


def _bytes_of(source: Any) -> Optional[Any]:
    """The checkpoint's bytes (bytes, bytearray, memoryview), or None for a
    file object over a regular file at its start (read through its descriptor)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return source
    if _regular_file_at_start(source) is not None:
        return None
    data = source.read()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"ckptio.load: the file object's read() returned {type(data).__name__}, not bytes "
                        "(open the file in binary mode)")
    return data


def _address(data) -> Any:
    """(address, length, owner) of the bytes of `data` without a copy; the
    owner keeps them alive (a memoryview: a uint8 tensor over it)."""
    if isinstance(data, (bytes, bytearray)):
        address, length = _ckptio.memory_of(data)
        return address, length, data
    torch = _adapt.torch_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given buffer is not writable": it is only read
        u8 = torch.frombuffer(memoryview(data).cast("B"), dtype=torch.uint8)
    return u8.data_ptr(), u8.numel(), u8


def load_in_memory(source: Any, keys: Optional[Iterable[str]]) -> Optional[Dict[str, Any]]:
    """ckptio.load of a checkpoint held in memory into new CPU torch tensors,
    copied once out of the bytes; None when this path does not apply (a file
    object over a regular file, a torch file with `keys`, bytes that are not
    a checkpoint: the memory-file path says what is wrong)."""
    data = _bytes_of(source)
    if data is None or not len(data):
        return None
    address, length, owner = _address(data)
    kind = _ckptio.format_detect_memory(address, length)
    if kind == "safetensors":
        rows, _ = _ckptio.safetensors_describe(address, length, NAME)
        if keys is None and len(rows) <= _bulk.COPY_ONE_BY_ONE_MAX:
            return _bulk.copy_each(address, rows)  # `owner` keeps the bytes alive until here
        if keys is None:
            names = sorted(row[0] for row in rows)
            wanted = range(len(rows)) if len(rows) < 2 else [i for _, i in sorted((row[0], i)
                                                                                    for i, row in enumerate(rows))]
        else:
            index = {row[0]: i for i, row in enumerate(rows)}
            names = list(keys)
            try:
                wanted = [index[name] for name in names]
            except KeyError as exc:
                raise KeyError(f"{NAME}: no tensor named {exc.args[0]!r}") from None
        with _bulk.no_gc(len(rows)):
            made = _bulk.copy_from(address, [(i,) + row for i, row in enumerate(rows)] if keys is None
                                   else [(i,) + rows[i] for i in sorted(set(wanted))])
        del owner  # the bytes had to stay alive until here
        return {name: made[i] for name, i in zip(names, wanted)}
    if kind == "torch" and keys is None and isinstance(data, bytes):
        from ._torch_objects import build_torch_object

        torch = _adapt.torch_module()
        reader = _ckptio.torch_reader_from_bytes(data, NAME)
        try:
            storages = []
            for _, _, _, nbytes, offset, _ in reader.storages:
                s = torch.UntypedStorage(nbytes)
                if nbytes:
                    _ckptio.copy(s.data_ptr(), address + offset, nbytes)
                storages.append(s)
            return build_torch_object(reader, _adapt.Device("cpu", None), storages=storages)
        finally:
            reader.close()
    return None


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
