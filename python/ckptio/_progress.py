"""``progress=`` of save, load and the file handle's bulk reads.

The extension reports a call's bytes (done, total) to the callable this
thread put in place with ``_ckptio.set_progress`` (the same engine progress
callback that makes calls interruptible by Ctrl-C: python/src/ckpy_call.c), on the
calling thread, first, at most every 20 ms, and last. An exception the
callable raises cancels the transfer with the usual guarantees (a save leaves
no temporary and the older file untouched) and is what the call raises.

``progress=True`` draws a bar by the rule the ``ckptio`` command's bars
follow too (tools/cli_progress.c; docs/PYTHON.md, "Progress"):

- its label says what moves: "load PATH", "save PATH", "load bytes",
  "load stream" (a file object), "save bytes";
- it appears with the first report, which carries the total, so it never
  shows a transfer of unknown size;
- on a terminal it is redrawn in place at most every 100 ms (tqdm's bar when
  tqdm is installed) and, when the transfer ends, stays as one final line;
- elsewhere (a log, a pipe) nothing is redrawn and no carriage return is
  written: one line when the transfer ends, "LABEL: SIZE in S s (R GB/s)"
  (the final line a terminal keeps too)
  (a Jupyter notebook gets tqdm's widget);
- CKPTIO_NO_PROGRESS=1 (any value but "" and "0") draws nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, Iterator, Optional

from . import _ckptio

Progress = Any  # None/False, True, or a callable (done, total)

INTERVAL = 0.1  # seconds between redraws on a terminal


def size_text(n: float) -> str:
    """"512 B", "1.50 KiB", "8.00 MiB": the CLI's sizes (cli_format_bytes)."""
    if n < 1024:
        return f"{int(n)} B"
    n /= 1024
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.2f} {unit}"
        n /= 1024
    return ""  # not reached


def final_line(label: str, total: int, seconds: float) -> str:
    """What a finished bar leaves: "LABEL: SIZE in S s (R GB/s)" (under a second: "in N.N ms")."""
    rate = total / seconds / 1e9 if seconds > 0 else 0.0
    took = f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"
    return f"{label}: {size_text(total)} in {took} ({rate:.2f} GB/s)"


def _disabled() -> bool:
    off = os.environ.get("CKPTIO_NO_PROGRESS", "")
    return off not in ("", "0")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _Bar:
    """Reports of one or more C calls as one transfer: a call that starts
    over (done back to 0 after an earlier call ended) adds its bytes."""

    def __init__(self, label: str):
        self.label = label
        self.start: Optional[float] = None
        self._base = 0        # bytes of the calls that ended
        self._call = (0, 0)   # the current call's (done, total)
        self.done = 0
        self.total = 0

    def __call__(self, done: int, total: int) -> None:
        if self.start is None:
            self.start = time.monotonic()
        elif done < self._call[0]:
            self._base += self._call[1]
        self._call = (done, total)
        self.done, self.total = self._base + done, self._base + total
        self.show()

    def show(self) -> None:  # pragma: no cover - overridden
        pass

    def seconds(self) -> float:
        return time.monotonic() - self.start if self.start is not None else 0.0

    def close(self, ok: bool) -> None:  # pragma: no cover - overridden
        pass


class _LineBar(_Bar):
    """On a terminal without tqdm: `label [#####.....]  45%  1.20 GiB / 2.70 GiB  1.10 GB/s`
    redrawn in place, the final line kept."""

    WIDTH = 30

    def __init__(self, label: str, stream):
        super().__init__(label)
        self._stream = stream
        self._drawn = 0.0

    def show(self) -> None:
        now = time.monotonic()
        if self.done != self.total and now - self._drawn < INTERVAL:
            return
        self._drawn = now
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        fill = int(frac * self.WIDTH)
        secs = self.seconds()
        rate = self.done / secs / 1e9 if secs > 0 else 0.0
        self._stream.write(f"\r\033[K{self.label} [{'#' * fill}{'.' * (self.WIDTH - fill)}] {frac * 100:3.0f}%  "
                           f"{size_text(self.done)} / {size_text(self.total)}  {rate:.2f} GB/s")
        self._stream.flush()

    def close(self, ok: bool) -> None:
        if self.start is None:
            return
        self._stream.write("\r\033[K" + (final_line(self.label, self.total, self.seconds()) if ok else "") +
                           ("\n" if ok else ""))
        self._stream.flush()


class _EndLine(_Bar):
    """Not a terminal: nothing until the end, then one line (no carriage return)."""

    def __init__(self, label: str, stream):
        super().__init__(label)
        self._stream = stream

    def close(self, ok: bool) -> None:
        if ok and self.start is not None:
            self._stream.write(final_line(self.label, self.total, self.seconds()) + "\n")
            self._stream.flush()


class _TqdmBar(_Bar):
    """tqdm's bar, made at the first report (so with its total) and left on screen."""

    def __init__(self, tqdm_cls, label: str):
        super().__init__(label)
        self._cls = tqdm_cls
        self._bar = None

    def show(self) -> None:
        if self._bar is None:
            self._bar = self._cls(total=self.total, desc=self.label, unit="B", unit_scale=True, unit_divisor=1024,
                                  leave=True)
        if self._bar.total != self.total:
            self._bar.total = self.total
        self._bar.update(self.done - self._bar.n)

    def close(self, ok: bool) -> None:
        if self._bar is not None:
            self._bar.close()


def _bar(label: str) -> Optional[_Bar]:
    if _disabled():
        return None
    stream = sys.stderr
    terminal = _is_terminal(stream)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    # tqdm on a terminal, and its widget in a notebook (tqdm.auto picks tqdm.notebook there).
    if tqdm is not None and (terminal or "notebook" in getattr(tqdm, "__module__", "")):
        return _TqdmBar(tqdm, label)
    return _LineBar(label, stream) if terminal else _EndLine(label, stream)


@contextlib.contextmanager
def reporting(progress: Progress, label: str) -> Iterator[None]:
    """Reports the ckptio calls made inside the block to `progress`
    (None/False: nothing; True: a bar labelled `label`; else a callable).
    A block inside another that reports already leaves the outer one in place."""
    if progress is None or progress is False:
        yield
        return
    bar = None
    if progress is True:
        bar = _bar(label)
        if bar is None:
            yield
            return
        callback: Callable[[int, int], Any] = bar
    elif callable(progress):
        callback = progress
    else:
        raise TypeError(f"progress must be True, False, None or a callable (done, total), not "
                        f"{type(progress).__name__}")
    previous: Optional[Callable[[int, int], Any]] = _ckptio.set_progress(callback)
    ok = False
    try:
        yield
        ok = True
    finally:
        _ckptio.set_progress(previous)
        if bar is not None:
            bar.close(ok)
