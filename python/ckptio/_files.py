"""Files a checkpoint names: reading a small one (a ``.metadata``, a manifest), and how many of
them a reader keeps open at once.

Python's ``open()`` of a FIFO waits for a writer forever, and of a device runs
its driver's open. The file is opened through libckptio instead
(``ckptio_file_open``, src/io/open_regular.c): only a regular file is ever
opened, anything else under the name fails at once with a CkptioError naming
the path and what it is.
"""

from __future__ import annotations

import ctypes
import os
import resource

from . import _ckptio


# The first bytes read with the file's open: most .metadata files and manifests whole. In object
# storage that open is one GET (no HEAD): the file in one round trip, a larger one's rest in a second.
FIRST_WINDOW = 1 << 20


def read_file(path, engine=None) -> bytes:
    """The whole content of the regular file `path`, read through `engine`
    (default: the shared default engine)."""
    return read_file_pinned(path, engine)[0]


def read_file_pinned(path, engine=None) -> tuple:
    """(content, version) of the regular file `path`: version is the ETag
    every GET of an object named (ckptio_file_version), "" for a local file."""
    head = bytearray(FIRST_WINDOW)
    f, got = _ckptio.file_open_window(os.fspath(path), _address(head), FIRST_WINDOW, engine)
    with f:
        size = f.size()
        version = f.version()
        if size <= got:
            return bytes(memoryview(head)[:size]), version
        buf = bytearray(size)
        buf[:got] = memoryview(head)[:got]
        f.read([(_address(buf) + got, size - got, got, _ckptio.MEM_HOST)])
    return bytes(buf), version


def _address(buf: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def window(nfiles: int) -> int:
    """How many of its files a reader of `nfiles` files keeps open at once: 0 (all of them) when
    `nfiles` is at most min(256, RLIMIT_NOFILE / 16), else that bound (at least 4). The rule of
    libckptio's own readers of many files (models, DCP directories: ckptio__file_window)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    w = 256 if soft == resource.RLIM_INFINITY else min(256, max(4, soft // 16))
    return w if nfiles > w else 0
