"""Warnings that point at the user's line.

A warning raised inside ckptio (a misspelt CKPTIO_* setting noticed when the
first engine is made, what a conversion drops) is about the caller's call,
so it is attributed to the first frame outside this package: the line
``warnings`` shows, filters match and ``catch_warnings`` records is the
user's, wherever inside ckptio the warning was raised.
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type = UserWarning) -> None:
    """warnings.warn(message, category) attributed to the nearest caller outside ckptio."""
    level = 2  # the caller of warn()
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
