"""Exceptions raised by ckptio.

Every failure of the C library becomes a :class:`CkptioError` (an ``OSError``)
whose message is the library's own: it names the file, the byte offset, the
tensor or field, and what was wrong. The pieces are also attributes.
"""

from __future__ import annotations

import errno as _errno
from typing import Optional

__all__ = [
    "CkptioError",
    "CkptioFileNotFoundError",
    "CkptioPermissionError",
    "CkptioFileExistsError",
]


class CkptioError(OSError):
    """A failure reported by libckptio.

    Attributes:
        status: the ``ckptio_status`` code (negative int), e.g. ``-4``.
        status_name: its name without prefix, e.g. ``"E_FORMAT"``.
        errno: errno of the failed system call, or ``None``.
        cuda_result: ``CUresult`` of a failed CUDA driver call, or ``None``.
        operation: ``"open"``, ``"pread"``, ``"parse"``, ... or ``None``.
        path: the file involved, or ``None`` (also in ``filename``).
        offset: byte offset in that file, or ``None``.
        subject: tensor name, JSON field, record, ... or ``None``.
        message: the complete message (also ``str(error)``).
        source: ``"file.c:line"`` inside libckptio that raised it (for bug reports).
    """

    status: int
    status_name: str
    cuda_result: Optional[int]
    operation: Optional[str]
    path: Optional[str]
    offset: Optional[int]
    subject: Optional[str]
    message: str
    source: Optional[str]

    def __str__(self) -> str:
        return getattr(self, "message", None) or super().__str__()

    def __reduce__(self):
        # OSError pickles only its args: keep every field, because torch
        # pickles a failing rank's exception to report it on the coordinator.
        return (_rebuild, (type(self), self.args, dict(self.__dict__), self.errno, self.strerror, self.filename))


def _rebuild(cls, args, fields, err, strerror, filename):
    exc = cls(*args)
    exc.__dict__.update(fields)
    exc.errno, exc.strerror, exc.filename = err, strerror, filename
    return exc


class CkptioFileNotFoundError(CkptioError, FileNotFoundError):
    """A file or directory that ckptio needed does not exist."""


class CkptioPermissionError(CkptioError, PermissionError):
    """The operating system refused access to a file."""


class CkptioFileExistsError(CkptioError, FileExistsError):
    """A file exists where an exclusive create was asked for."""


_E_NOT_FOUND = -6
_E_EXISTS = -15
_E_PERMISSION = -16


def _class_for(status: int, sys_errno: int) -> type:
    if status == _E_NOT_FOUND and sys_errno in (_errno.ENOENT, _errno.ENOTDIR):
        return CkptioFileNotFoundError
    if status == _E_PERMISSION or sys_errno in (_errno.EACCES, _errno.EPERM):
        return CkptioPermissionError
    if status == _E_EXISTS or sys_errno == _errno.EEXIST:
        return CkptioFileExistsError
    return CkptioError


def make_error(
    status: int,
    status_name: str,
    sys_errno: int,
    cuda_result: int,
    operation: Optional[str],
    path: Optional[str],
    offset: int,
    subject: Optional[str],
    message: str,
    source: Optional[str] = None,
) -> CkptioError:
    """Builds the exception for one ``ckptio_error_info`` record (called by the
    extension with the fields of ``ckptio_last_error()``)."""
    cls = _class_for(status, sys_errno)
    exc = cls(message)
    exc.errno = sys_errno or None
    exc.strerror = message
    exc.filename = path
    exc.status = status
    exc.status_name = status_name
    exc.cuda_result = cuda_result or None
    exc.operation = operation
    exc.path = path
    exc.offset = offset if offset is not None and offset >= 0 else None
    exc.subject = subject
    exc.message = message
    exc.source = source
    return exc


def amend_error(exc: CkptioError, suffix: str) -> CkptioError:
    """The same error with `suffix` appended to its message: advice that
    only the Python caller can give (e.g. the option that would have
    avoided it). Every other field is kept."""
    fields = dict(exc.__dict__)
    new = make_error(exc.status, exc.status_name, exc.errno or 0, exc.cuda_result or 0, exc.operation, exc.path,
                     -1 if exc.offset is None else exc.offset, exc.subject, exc.message + suffix, exc.source)
    for k, v in fields.items():
        if k not in ("message", "strerror"):
            setattr(new, k, v)
    return new
