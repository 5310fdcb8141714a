"""Slices read as the byte span that covers them, then cut on the target's device.

A requested slice whose bytes are scattered in its stored chunk (more than
``MAX_RUNS`` runs, e.g. half the columns of a row-sharded matrix; many short
runs that fill a good part of their span, ``short_runs_as_span``; or any
slice of a strided chunk) is not read run by run: the span from its first
to its last stored element is read into a buffer on the target's device
(the GPU for CUDA targets, through the engine's pipeline; host memory
otherwise) and the slice is copied out there with one strided copy. Cutting
on the GPU keeps the host out of the way: no single-threaded strided copy
on the CPU, no pageable host-to-device transfer.

The spans of one ``read_data`` are read after its other items, in batches
of at most ``BUDGET`` bytes per device through one reused buffer, so the
extra memory a resharded load takes is bounded (a slice is split along the
dimension of its largest stride, the first of a C-contiguous chunk, into
pieces that fit; one index wider than the budget makes a batch alone).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

import torch

from .. import _adapt, _batches, _ckptio
from .._group_read import align

# Extra memory (per device) that span reads may hold at once.
BUDGET = 1 << 30
# Above this many runs, a slice of a C-contiguous chunk is read as the span that covers it.
MAX_RUNS = 4096
# A slice of many short runs that fill at least a third of their span is read as the span too: one read costs
# about as much as copying a few KiB, so one read of the span and one strided copy cost less than the runs read
# one by one; the span of such a slice is at most MAX_RUNS x 3 x SHORT_RUN_BYTES (48 MiB).
SHORT_RUN_BYTES = 4 << 10
SHORT_RUNS_MIN = 256


def runs(shape: Sequence[int], offs: Sequence[int], lens: Sequence[int]) -> Tuple[int, int, List[int]]:
    """How a slice (offsets, lengths) of a C-contiguous chunk of `shape` lies in
    it: (number of runs of consecutive elements, elements per run, the outer
    dimensions whose every index starts a run). Dimensions j.. are taken whole,
    dimension j-1 partly; each index over the dimensions before j-1 is a run."""
    ndim = len(shape)
    j = ndim
    while j > 0 and offs[j - 1] == 0 and lens[j - 1] == shape[j - 1]:
        j -= 1
    inner = math.prod(shape[j:]) if j < ndim else 1
    run_elems = lens[j - 1] * inner if j > 0 else inner
    outer_dims = list(range(max(j - 1, 0)))
    return (math.prod(lens[d] for d in outer_dims) if outer_dims else 1), run_elems, outer_dims


def short_runs_as_span(nruns: int, run_bytes: int, span_bytes: int) -> bool:
    """Whether a direct read of `nruns` runs of `run_bytes` each, spread over
    `span_bytes`, is better done as one read of the span and a strided copy
    (the reader's rule for slices of at most MAX_RUNS runs)."""
    return nruns >= SHORT_RUNS_MIN and run_bytes <= SHORT_RUN_BYTES and 3 * nruns * run_bytes >= span_bytes


def read_as_span(shape: Sequence[int], offs: Sequence[int], lens: Sequence[int]) -> bool:
    """Whether the reader reads this slice of a C-contiguous chunk as its span
    for its number of runs alone (False for a slice with another number of
    dimensions than the chunk: the reader refuses it, naming the file). The
    sharing plan of a broadcast load asks this; short runs
    (short_runs_as_span) are left to each rank: their spans are small."""
    return len(offs) == len(shape) == len(lens) and runs(shape, offs, lens)[0] > MAX_RUNS


class Span:
    """One piece of a slice: `nbytes` stored bytes at `offset` of `df`, which
    hold the piece as elements `lens` with `stride` (elements) from the span's
    first byte; copied into `target` (a view of the planner's tensor)."""

    __slots__ = ("df", "offset", "nbytes", "dtype", "lens", "stride", "target")

    def __init__(self, df, offset: int, nbytes: int, dtype, lens, stride, target: torch.Tensor):
        self.df, self.offset, self.nbytes = df, offset, nbytes
        self.dtype, self.lens, self.stride, self.target = dtype, tuple(lens), tuple(stride), target

    def device(self) -> torch.device:
        """Where the span's buffer lives: the target's GPU, else host memory."""
        dev = self.target.device
        return dev if dev.type == "cuda" else torch.device("cpu")


def plan(df, base: int, first: int, lens, stride, esize: int, dtype, target: torch.Tensor, spans: List[Span],
         budget: int) -> None:
    """Adds the pieces of the slice whose first element is `first` (elements
    from `base`, the stored storage's byte offset in `df`) with sizes `lens`
    and the stored `stride`. Pieces split the dimension of the largest stride
    (dimension 0 of a C-contiguous chunk) so each spans at most `budget` bytes
    (at least one index of it)."""
    d = max(range(len(lens)), key=lambda i: (lens[i] > 1, stride[i]))
    row = (sum((n - 1) * st for i, (n, st) in enumerate(zip(lens, stride)) if i != d) + 1) * esize
    step = stride[d] * esize
    if step == 0:  # a broadcast dimension: every index holds the same bytes
        per = lens[d]
    else:
        per = 1 if budget <= row else min(lens[d], 1 + (budget - row) // step)
    for a in range(0, lens[d], per):
        k = min(per, lens[d] - a)
        sub = tuple(lens[:d]) + (k,) + tuple(lens[d + 1:])
        spans.append(Span(df, base + (first + a * stride[d]) * esize, row + (k - 1) * step, dtype, sub, stride,
                          target.narrow(d, a, k)))


def read(spans: List[Span], engine, budget: int) -> int:
    """Reads every span and copies its piece into its target; returns the bytes
    read. Batches per device through one buffer, reused: a CUDA buffer is
    written again only after the current stream has finished cutting it."""
    by_device: Dict[Any, List[Span]] = {}
    for s in spans:
        by_device.setdefault(s.device(), []).append(s)
    total = 0
    for dev, group in by_device.items():
        batches = _batches.by_budget(group, lambda s: align(s.nbytes), budget)
        size = max(sum(align(s.nbytes) for s in b) for b in batches)
        buf = torch.empty(size, dtype=torch.uint8, device=dev)
        kind = _adapt.MEM_CUDA if dev.type == "cuda" else _adapt.MEM_HOST
        for batch in batches:
            extents, at = [], 0
            for s in batch:
                extents.append((s.df.file, buf.data_ptr() + at, s.nbytes, s.offset, kind))
                at += align(s.nbytes)
            if dev.type == "cuda":
                _adapt.sync_current_stream({dev.index})  # the previous batch's cuts read this buffer
            _ckptio.dcp_read(extents, engine)
            total += sum(s.nbytes for s in batch)
            at = 0
            for s in batch:
                typed = buf[at:at + s.nbytes].view(s.dtype)
                s.target.copy_(typed.as_strided(s.lens, s.stride, typed.storage_offset()))
                at += align(s.nbytes)
    return total


__all__ = ["BUDGET", "MAX_RUNS", "SHORT_RUNS_MIN", "SHORT_RUN_BYTES", "Span", "plan", "read", "read_as_span",
           "runs", "short_runs_as_span"]
