"""Cutting a sequence of reads into batches by a byte budget (no torch here).

Every bounded multi-step read uses it: the multi-rank model load's batches
(_distributed.make_plan), the DCP load-once broadcast's (dcp._broadcast) and
the DCP span reads' (dcp._spans).
"""

from __future__ import annotations

from typing import Callable, List, Sequence, TypeVar

T = TypeVar("T")


def by_budget(items: Sequence[T], nbytes: Callable[[T], int], budget: int) -> List[List[T]]:
    """`items` in order, in batches whose nbytes(item) add up to at most
    `budget`; an item larger than the budget makes a batch alone. No items,
    no batches."""
    batches: List[List[T]] = []
    used = 0
    for item in items:
        n = nbytes(item)
        if not batches or (batches[-1] and used + n > budget):
            batches.append([])
            used = 0
        batches[-1].append(item)
        used += n
    return batches
