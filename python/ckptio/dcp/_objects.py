"""DCP checkpoints in object storage (``s3://BUCKET/PREFIX``).

torch's FileSystemWriter/Reader reach their directory through a
``FileSystem`` object (``init_path`` makes a ``pathlib.Path``, which would
fold ``s3://`` into ``s3:/``). For an s3:// checkpoint id ckptio.dcp's
writer and reader use :class:`ObjectStore` instead: the same few
operations, on objects through libckptio. Everything that moves data or
commits (data objects, the manifest, ``.metadata``, the lease that stands in
for the directory's lock, the removal of older saves' objects) is
libckptio's, which takes s3:// directories where it takes local ones
(docs/OBJECT_STORAGE.md, "Directories without rename or locks").
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any, Iterator, List, Optional

from .. import _ckptio

# Largest .metadata or manifest read whole (torch writes a few hundred bytes per chunk).
SMALL_MAX = 1 << 31


def is_object(path: Any) -> bool:
    """True for an ``s3://`` checkpoint id."""
    try:
        return _ckptio.path_is_object(os.fspath(path))
    except TypeError:
        return False


def join(directory: str, name: str) -> str:
    """``DIR/NAME`` without doubling a '/' that ends DIR."""
    return directory + name if directory.endswith("/") else f"{directory}/{name}"


def exists(url: str, engine=None) -> bool:
    return _ckptio.object_stat(url, engine)[0] == "file"


def read(url: str, engine=None, max_bytes: int = SMALL_MAX) -> bytes:
    return _ckptio.object_read(url, max_bytes, engine)


def remove(url: str, engine=None) -> None:
    _ckptio.object_delete(url, engine)


class ObjectStore:
    """torch's ``FileSystemBase`` operations on an object store, for the
    parts of torch's FileSystemWriter/Reader that ckptio.dcp keeps."""

    def __init__(self, engine=None) -> None:
        self.engine = engine

    def init_path(self, path) -> str:
        return os.fspath(path)

    def concat_path(self, path, suffix: str) -> str:
        return join(os.fspath(path), suffix)

    def mkdir(self, path) -> None:
        """A prefix needs no creating."""

    def exists(self, path) -> bool:
        return exists(os.fspath(path), self.engine)

    def rm_file(self, path) -> None:
        remove(os.fspath(path), self.engine)

    def rename(self, path, new_path) -> None:
        raise NotImplementedError(f"{path}: an object store has no rename; ckptio.dcp writes every object once, whole")

    def ls(self, path) -> List[str]:
        prefix = join(os.fspath(path), "")
        return [key.rsplit("/", 1)[-1] for key, _, _, is_prefix in _ckptio.object_list(prefix, "/", self.engine)
                if not is_prefix]

    @contextlib.contextmanager
    def create_stream(self, path, mode: str) -> Iterator[io.BytesIO]:
        url = os.fspath(path)
        if "r" in mode:
            yield io.BytesIO(read(url, self.engine))
            return
        buf = io.BytesIO()
        yield buf
        _ckptio.object_put(url, buf.getvalue(), False, self.engine)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return is_object(checkpoint_id)


def store_for(path, engine=None) -> Optional[ObjectStore]:
    """An ObjectStore for an s3:// path, else None (torch's FileSystem stays)."""
    return ObjectStore(engine) if is_object(path) else None


class PrefixListing:
    """The sizes and ETags of the objects directly under a checkpoint's prefix, from one listing
    run on a thread while ``.metadata`` is read: a data object found there opens with no request
    (ckptio_dcp_file_open_listed; its reads name the listed ETag in If-Match, so an object replaced
    since fails with E_STALE as after a HEAD), which takes the HEAD's round trip off the load.
    The listing stops after LIMIT entries; a name not among them, or a listing that failed (no
    permission to list), opens with its HEAD as before. Its ETags are used only if it gives the
    ETag that the GET read alongside answered with (``witness``): a server whose listings give
    other ETags than its GETs (some gateways, encryption modes) would fail every data GET with
    E_STALE; there every data object opens with its HEAD."""

    LIMIT = 1000

    def __init__(self, directory: str, engine=None) -> None:
        import threading

        self._found: dict = {}
        self._witness: Optional[tuple] = None
        self._checked = False  # the witness matched: the ETags may be used
        self._thread = threading.Thread(target=self._run, args=(directory, engine), daemon=True)
        self._thread.start()

    def _run(self, directory: str, engine) -> None:
        try:
            # An engine of its own: calls on one engine take turns, and this one runs beside the
            # .metadata GET. It has the reader's settings for requests (retries, timeouts).
            s3 = {k: v for k, v in engine.options().items() if k.startswith("s3_")} if engine is not None else {}
            lister = _ckptio.Engine(threads=1, **s3)
            rows = _ckptio.object_list(directory.rstrip("/") + "/", "/", lister, etags=True, limit=self.LIMIT)
        except Exception:  # the objects then open with their HEADs; nothing is lost but the round trip
            return
        for key, size, _when, is_prefix, etag in rows:
            if not is_prefix and etag:
                self._found[key.rpartition("/")[2]] = (size, etag)

    def witness(self, name: str, etag: str) -> None:
        """The object `name` was read with `etag` meanwhile: the listing's ETags are trusted only
        if it lists `name` with that ETag."""
        self._witness = (name, etag)

    def get(self, name: str) -> Optional[tuple]:
        """(size, etag) of the object `name` as listed, or None."""
        self._thread.join()
        if self._witness is not None:
            listed = self._found.get(self._witness[0])
            self._checked = listed is not None and listed[1] == self._witness[1]
            self._witness = None
        # Without a matching witness (none given: the .metadata read failed, or it did not match) no listed
        # ETag is used, as in C (dcp_listing.c).
        return self._found.get(name) if self._checked else None
