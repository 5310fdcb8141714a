"""Reading a small file that a checkpoint names (a ``.metadata``, a manifest).

Python's ``open()`` of a FIFO waits for a writer forever, and of a device runs
its driver's open. The file is opened through libckptio instead
(``ckptio_file_open``, src/io/open_regular.c): only a regular file is ever
opened, anything else under the name fails at once with a CkptioError naming
the path and what it is.
"""

from __future__ import annotations

import ctypes
import os

from . import _ckptio


def read_file(path, engine=None) -> bytes:
    """The whole content of the regular file `path`, read through `engine`
    (default: the shared default engine)."""
    with _ckptio.File(os.fspath(path), _ckptio.OPEN_READ, engine) as f:
        size = f.size()
        buf = bytearray(size)
        if size:
            f.read([(ctypes.addressof(ctypes.c_char.from_buffer(buf)), size, 0, _ckptio.MEM_HOST)])
    return bytes(buf)
