"""A drop-in for ``torch.cuda.gds``: GdsFile, gds_register_buffer, gds_deregister_buffer.

``torch.cuda.gds.GdsFile`` needs cuFile and a file system that the
nvidia-fs driver accepts; elsewhere it fails. ckptio's runs on libckptio's
GDS file API (``ckptio_gds_*``): cuFile where the driver accepts the file,
otherwise ckptio's pinned-staging pipeline for CUDA storages, and plain file
I/O for CPU storages. :attr:`GdsFile.last_path` tells which path ran.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Dict, Optional, Tuple

from . import _adapt, _ckptio
from ._errors import make_error

__all__ = ["GdsFile", "gds_register_buffer", "gds_deregister_buffer"]

# Buffers registered with gds_register_buffer: (device, address) -> nbytes.
# cuFile registrations are per process; libckptio registers buffers per file,
# so every open GdsFile gets every registered buffer.
_registered: Dict[Tuple[str, int], int] = {}
_open_files: "weakref.WeakSet[GdsFile]" = weakref.WeakSet()


def _storage_memory(storage: Any, what: str) -> Tuple[int, int, int, Optional[int], str]:
    """(address, nbytes, mem_kind, cuda index, device str) of a torch storage."""
    torch = _adapt.torch_module()
    if isinstance(storage, torch.Tensor):
        raise TypeError(f"{what}: expected a storage (tensor.untyped_storage()), not a tensor")
    if isinstance(storage, torch.TypedStorage):
        storage = storage._untyped_storage
    if not isinstance(storage, torch.UntypedStorage):
        raise TypeError(f"{what}: expected a torch.UntypedStorage, not {type(storage).__name__}")
    device = storage.device
    nbytes = storage.nbytes()
    address = storage.data_ptr() if nbytes else 0
    if device.type == "cuda":
        return address, nbytes, _adapt.MEM_CUDA, device.index, str(device)
    if device.type == "cpu":
        kind = _adapt.host_kind(storage)
        return address, nbytes, kind, None, "cpu"
    raise ValueError(f"{what}: storages on {device} are not supported (cpu or cuda only)")


def gds_register_buffer(s: Any) -> None:
    """Registers a CUDA storage as a GDS buffer (``cuFileBufRegister``).

    Only device memory can be registered: a CPU storage is a ValueError.
    ckptio's pipeline needs no registration; where cuFile runs, every open
    and later opened GdsFile registers the buffer with it.
    """
    address, nbytes, kind, _, device = _storage_memory(s, "gds_register_buffer")
    if kind != _adapt.MEM_CUDA:
        raise ValueError(f"gds_register_buffer: the storage is on {device}; only CUDA storages can be registered")
    key = (device, address)
    if key in _registered:
        raise RuntimeError(f"gds_register_buffer: the buffer at 0x{address:x} on {device} is already registered")
    for f in list(_open_files):
        f._buf_register(address, nbytes)
    _registered[key] = nbytes


def gds_deregister_buffer(s: Any) -> None:
    """Deregisters a buffer registered with :func:`gds_register_buffer`."""
    address, nbytes, kind, _, device = _storage_memory(s, "gds_deregister_buffer")
    key = (device, address)
    if key not in _registered:
        raise RuntimeError(f"gds_deregister_buffer: the buffer at 0x{address:x} on {device} is not registered")
    del _registered[key]
    for f in list(_open_files):
        f._buf_deregister(address)


class GdsFile:
    r"""Drop-in for ``torch.cuda.gds.GdsFile``: storage-sized transfers at file offsets.

    Args:
        filename: the file to open.
        flags: ``os.O_*`` flags as for ``os.open`` (``os.O_RDONLY``,
            ``os.O_RDWR``, ``os.O_CREAT``, ``os.O_TRUNC``, ...). ``os.O_DIRECT``
            is added by ckptio where the file system accepts it.
        engine: a ckptio.Engine (default: the shared default engine).

    As in torch, the handle is registered at construction and writes go to
    the file in place. CUDA storages are read and written in order with
    the current CUDA stream of their device; CPU storages (host path) work
    too. :attr:`last_path` names the mechanism of the last transfer
    ("cufile_direct", "cufile_compat", "pipeline" or "host").
    """

    def __init__(self, filename: str, flags: int, *, engine=None):
        self.filename = os.fspath(filename)
        self.flags = flags
        self.handle: Optional[Any] = None
        self._file = _ckptio.GdsHandle(self.filename, flags & ~getattr(os, "O_DIRECT", 0), 0o666, engine)
        self._buffers: Dict[int, int] = {}
        _open_files.add(self)
        self.register_handle()

    def __del__(self) -> None:
        f = getattr(self, "_file", None)
        if f is None:
            return
        if getattr(self, "handle", None) is not None:
            self.handle = None
        f.close()

    # -- handle and buffer registration ------------------------------------------
    def register_handle(self) -> None:
        """Registers the file for transfers (``cuFileHandleRegister``)."""
        if self.handle is not None:
            raise AssertionError("Cannot register a handle that is already registered.")
        self._file.register_handle()
        self.handle = self._file
        for (_, address), nbytes in list(_registered.items()):
            self._buf_register(address, nbytes)

    def deregister_handle(self) -> None:
        """Deregisters the file (``cuFileHandleDeregister``)."""
        if self.handle is None:
            raise AssertionError("Cannot deregister a handle that is not registered.")
        self._file.deregister_handle()
        self.handle = None

    def _buf_register(self, address: int, nbytes: int) -> None:
        if address not in self._buffers and not self._file.closed:
            self._file.buf_register(address, nbytes)
            self._buffers[address] = nbytes

    def _buf_deregister(self, address: int) -> None:
        if self._buffers.pop(address, None) is not None and not self._file.closed:
            self._file.buf_deregister(address)

    # -- transfers ------------------------------------------------------------------
    def _transfer(self, storage: Any, offset: int, write: bool) -> None:
        what = "save_storage" if write else "load_storage"
        if self.handle is None:
            raise AssertionError(f"Cannot {'save data to' if write else 'load data from'} a file that is not "
                                 "registered.")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"GdsFile.{what}: offset must be a non-negative int, not {offset!r}")
        address, nbytes, kind, cuda_index, _ = _storage_memory(storage, f"GdsFile.{what}")
        stream = None
        if kind == _adapt.MEM_CUDA:
            torch = _adapt.torch_module()
            stream = torch.cuda.current_stream(cuda_index).cuda_stream
        op = self._file.write if write else self._file.read
        done = op(address, nbytes, offset, 0, stream)
        if done != nbytes:
            raise make_error(_ckptio.E_TRUNCATED, "E_TRUNCATED", 0, 0, "pread", self.filename, offset, None,
                             f"{self.filename}: {what}: only {done} of {nbytes} bytes at offset {offset} "
                             "(the file ends there)")

    def load_storage(self, storage: Any, offset: int = 0) -> None:
        """Reads ``storage.nbytes()`` bytes at file `offset` into the storage.

        A read reaching past the end of the file is a CkptioError
        (E_TRUNCATED); torch's version would leave the tail unwritten."""
        self._transfer(storage, offset, write=False)

    def save_storage(self, storage: Any, offset: int = 0) -> None:
        """Writes all bytes of the storage to the file at `offset`."""
        self._transfer(storage, offset, write=True)

    # -- beyond torch's API --------------------------------------------------------
    @property
    def last_path(self) -> str:
        """How the last transfer moved: "cufile_direct", "cufile_compat",
        "pipeline", "host", or "none" before any."""
        return self._file.io_path()

    @property
    def refusal(self) -> str:
        """Why cuFile is not used for this file ("" if it is or was not tried)."""
        return self._file.refusal()

    def sync(self) -> None:
        """fsync the file's data (writes are not durable before this)."""
        self._file.sync()

    def close(self) -> None:
        """Closes the file (torch relies on ``del``; both work here)."""
        self.handle = None
        self._file.close()

    def __enter__(self) -> "GdsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
