"""The engines of FileSystemWriters made without ``engine=``: one per distinct
configuration (``sync`` from ``sync_files``, ``staging_bytes`` from
``per_thread_copy_ahead``), created on first use and kept for the life of the
process, so that a script saving every N steps through a new writer reuses
the engine's worker threads, staging memory and stored parts' buffers
instead of making them again for every save.

They are not the default engine (``ckptio.default_engine()``, what readers
and ``ckptio.save``/``load`` use without ``engine=``): an engine runs one
call at a time, and an ``async_save`` writing in the background must not hold
up a load, or a plain save, of the training loop. An Engine made before
fork() works in the child (the package rebuilds its threads there), so the
cache is kept across fork; only its lock, which a parent thread may have
held at the fork, is replaced.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Optional, Tuple

from .._ckptio import Engine

_engines: Dict[Tuple[int, Optional[int]], Engine] = {}
_mutex = threading.Lock()


def writer_engine(sync: bool, copy_ahead: Optional[int]) -> Engine:
    """The process's writer engine for `sync` and torch's `per_thread_copy_ahead` (None: torch's
    default, which keeps the engine's staging default)."""
    key = (1 if sync else 0, None if copy_ahead is None else int(copy_ahead))
    with _mutex:
        engine = _engines.get(key)
        if engine is None:
            engine = Engine(sync=key[0])
            if copy_ahead is not None:
                # torch: bytes copied ahead from the GPU per writer thread. Here
                # GPU bytes move through the engine's pinned staging buffers, one
                # per worker: per_thread_copy_ahead becomes the staging per worker.
                workers = max(int(engine.get("threads")), 1)
                lo, hi = Engine.bounds("staging_bytes")
                engine.set("staging_bytes", min(max(key[1] * workers, lo), hi))
            _engines[key] = engine
        return engine


def _fresh_mutex_in_child() -> None:
    global _mutex
    _mutex = threading.Lock()


os.register_at_fork(after_in_child=_fresh_mutex_in_child)
