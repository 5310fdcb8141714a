"""``progress=`` of save, load and the file handle's bulk reads.

The extension reports a call's bytes (done, total) to the callable this
thread put in place with ``_ckptio.set_progress`` (the same engine progress
callback that makes calls interruptible by Ctrl-C: python/src/ckpy_call.c), on the
calling thread, first, at most every 20 ms, and last. An exception the
callable raises cancels the transfer with the usual guarantees (a save leaves
no temporary and the older file untouched) and is what the call raises.

``progress=True`` draws a bar: tqdm's when tqdm is installed, otherwise one
line on stderr redrawn in place.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Iterator, Optional

from . import _ckptio

Progress = Any  # None/False, True, or a callable (done, total)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # not reached


class _LineBar:
    """`what [#####.....]  45%  1.2 GiB / 2.7 GiB  1.1 GiB/s` on stderr."""

    WIDTH = 30

    def __init__(self, what: str):
        self._what = what
        self._start = time.monotonic()
        self._drawn = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done != total and now - self._drawn < 0.1:
            return
        self._drawn = now
        frac = done / total if total else 1.0
        fill = int(frac * self.WIDTH)
        rate = done / max(now - self._start, 1e-9)
        line = (f"\r{self._what} [{'#' * fill}{'.' * (self.WIDTH - fill)}] {frac * 100:3.0f}%  "
                f"{_size(done)} / {_size(total)}  {_size(rate)}/s")
        sys.stderr.write(line)
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _TqdmBar:
    def __init__(self, tqdm_cls, what: str):
        self._bar = tqdm_cls(total=0, desc=what, unit="B", unit_scale=True, unit_divisor=1024, leave=False)

    def __call__(self, done: int, total: int) -> None:
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()


def _bar(what: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _LineBar(what)
    return _TqdmBar(tqdm, what)


@contextlib.contextmanager
def reporting(progress: Progress, what: str) -> Iterator[None]:
    """Reports the ckptio calls made inside the block to `progress`
    (None/False: nothing; True: a bar titled `what`; else a callable)."""
    if progress is None or progress is False:
        yield
        return
    bar = None
    if progress is True:
        bar = _bar(what)
        callback: Callable[[int, int], Any] = bar
    elif callable(progress):
        callback = progress
    else:
        raise TypeError(f"progress must be True, False, None or a callable (done, total), not "
                        f"{type(progress).__name__}")
    previous: Optional[Callable[[int, int], Any]] = _ckptio.set_progress(callback)
    try:
        yield
    finally:
        _ckptio.set_progress(previous)
        if bar is not None:
            bar.close()
