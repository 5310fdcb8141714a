"""ckptio.Snapshots: copies of training state that overlap compute
(docs/SNAPSHOTS.md).

``take(state_dict)`` returns a host copy of a state dict (model, optimizer,
extra state) whose tensors live in one pinned pool, sized once and reused.
GPU tensors are copied by libckptio on a copy stream of its own
(ckptio_snapshot_take), ordered after the work the training stream had
queued: the forward and backward passes that follow run beside the copy,
and the next optimizer step waits for it on the GPU (a pre-hook on every
``torch.optim.Optimizer.step``, or ``before_update()`` in a loop without
one). Tensors no optimizer owns (buffers a forward pass changes, frozen
weights, gathered copies) are copied first and the training stream waits
for them at once. Host tensors and other values are copied during the call.
So what is saved for step k equals the state at the end of step k, bit for
bit, while training goes on.
"""

from __future__ import annotations

import copy
import ctypes
import io
import logging
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

from . import _ckptio

_log = logging.getLogger("ckptio.snapshot")

_ALIGN = 4096  # every tensor starts on a page: the data files align items so, and O_DIRECT needs it

# Every open Snapshots, for the optimizer hook; and the optimizers that have stepped
# (whose parameters and state only their step changes).
_live: "weakref.WeakSet[Snapshots]" = weakref.WeakSet()
_optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
_hook_lock = threading.Lock()
_hook_handle = None


def _optimizer_step_pre_hook(optimizer, args, kwargs):
    _optimizers.add(optimizer)
    for s in list(_live):
        s._before_update_current()
    return None


def _install_hook() -> None:
    global _hook_handle
    with _hook_lock:
        if _hook_handle is None:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            _hook_handle = register_optimizer_step_pre_hook(_optimizer_step_pre_hook)


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.4
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    return DTensor


class SnapshotUnsupported(TypeError):
    """A value the snapshot cannot copy (a ShardedTensor, a sparse or
    quantized tensor, a tensor on a device other than CPU and CUDA)."""


def _span(t) -> int:
    """Elements of t's storage its view reaches, from its first element."""
    if t.is_contiguous():
        return t.numel()
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)


class _Guarded:
    """The data and storage addresses of tensors only an optimizer step (or
    the caller, after before_update) changes, cached per optimizer."""

    def __init__(self) -> None:
        self._cache: "weakref.WeakKeyDictionary[Any, Tuple[tuple, set]]" = weakref.WeakKeyDictionary()
        self.extra: set = set()

    @staticmethod
    def _add(ptrs: set, t, dtensor) -> None:
        if dtensor is not None and isinstance(t, dtensor):
            t = t._local_tensor
        ptrs.add(t.data_ptr())
        ptrs.add(t.untyped_storage().data_ptr())

    def addresses(self) -> set:
        import torch

        dtensor = _dtensor_type()
        out = set(self.extra)
        for opt in list(_optimizers):
            key = (sum(len(g["params"]) for g in opt.param_groups), len(opt.state))
            hit = self._cache.get(opt)
            if hit is None or hit[0] != key:
                ptrs: set = set()
                for g in opt.param_groups:
                    for p in g["params"]:
                        self._add(ptrs, p, dtensor)
                for st in opt.state.values():
                    for v in st.values():
                        if isinstance(v, torch.Tensor):
                            self._add(ptrs, v, dtensor)
                hit = (key, ptrs)
                self._cache[opt] = hit
            out |= hit[1]
        return out


class _Box:
    """A Snapshots' pool and what its snapshots need to give it back: a snapshot released (or dropped)
    after close() frees the pool then, so that close() never frees memory a snapshot's tensors still show."""

    def __init__(self) -> None:
        self.pool: Optional[Any] = None
        self.cv = threading.Condition()
        self.held = False
        self.closed = False

    def release(self) -> None:
        with self.cv:
            pool, held = self.pool, self.held
            self.held = False
            try:
                if pool is not None and held:
                    pool.release()
            finally:
                if self.closed and pool is not None:
                    self.pool = None
                    pool.close()
                self.cv.notify_all()


class Snapshot:
    """One snapshot taken by :meth:`Snapshots.take`.

    ``state_dict`` is the host copy, with the structure of the state given
    (DTensors keep their placement, around host local tensors); read its
    tensors only after :meth:`wait`. :meth:`release` hands the pool back
    for the next snapshot (also done when the object is dropped)."""

    def __init__(self, owner: "Snapshots", state_dict: Any, nbytes: int, sources: List[Any], devices: List[int]):
        self.state_dict = state_dict
        self.nbytes = nbytes
        self.devices = devices
        self._owner = owner
        self._sources = sources  # GPU tensors read by copies still running: not freed (and reused) before them
        self._waited = not devices
        self._released = False
        self._finalizer = weakref.finalize(self, _Box.release, owner._box)

    def copied(self) -> bool:
        """True once the copies have completed (never blocks)."""
        if self._waited:
            return True
        done = self._owner._box.pool.copied()
        if done:
            self._waited = True
            self._sources = []
        return done

    def wait(self) -> None:
        """Blocks until the copies have completed; raises a copy's failure."""
        if self._released:
            raise RuntimeError("the snapshot was released")
        if not self._waited:
            self._owner._box.pool.wait()
            self._waited = True
            self._sources = []

    def release(self) -> None:
        """Ends the snapshot: the pool takes the next one. Idempotent."""
        if self._released:
            return
        self._released = True
        self._sources = []
        self._finalizer.detach()
        self._owner._box.release()


class Snapshots:
    """A pinned pool for snapshots of training state, one at a time.

    * :meth:`prepare` sizes the pool from a state dict and starts pinning it
      in the background (pinning costs ~0.3-0.6 s per GiB: do it well ahead
      of the first save); :meth:`take` does it too, then waits for it.
    * :meth:`take` copies a state dict as described in the module's
      docstring and returns a :class:`Snapshot`.
    * :meth:`before_update`: the explicit form of the optimizer hook, for a
      loop that changes tensors without ``torch.optim``: call it before
      queueing the update (after :meth:`guard` named those tensors).
    * :meth:`close` frees the pool (also at exit).

    ``device``: the CUDA device whose context pins the pool (default: the
    first CUDA device of the state, else a host pool for CPU state).
    """

    def __init__(self) -> None:
        self._box = _Box()
        self._cv = self._box.cv
        self._held_ref: Optional["weakref.ReferenceType[Snapshot]"] = None
        self._views: Dict[tuple, Any] = {}
        self._base = None  # a uint8 CPU tensor over the whole pool
        self._guarded = _Guarded()
        self._closed = False
        self._retired: List[Any] = []
        _live.add(self)
        try:
            _install_hook()
        except ImportError:  # no torch: snapshots of nothing
            pass

    # ---- pool ------------------------------------------------------------------------------------------
    @property
    def _pool(self):
        return self._box.pool

    def _ensure_pool(self, nbytes: int, device: int) -> None:
        """A pool of at least nbytes pinned for `device` (-1: host), made now if need be (pinning runs in the
        background). Called with no snapshot held."""
        pool = self._pool
        if pool is not None:
            info = pool.info()
            if info["nbytes"] >= nbytes and (device < 0 or info["pinned"]):
                return
            _log.warning("ckptio.Snapshots: the snapshot pool (%d bytes) is too small for this state (%d bytes) or "
                         "not pinned for CUDA: pinning a new one (call prepare() with the whole state ahead)",
                         info["nbytes"], nbytes)
            self._retire(pool)
        self._box.pool = _ckptio.SnapshotPool(max(nbytes, 1), device)
        info = self._box.pool.info()
        import torch

        buf = (ctypes.c_uint8 * info["nbytes"]).from_address(info["address"])
        self._base = torch.frombuffer(buf, dtype=torch.uint8)
        self._views = {}

    def _retire(self, pool) -> None:
        """Frees an old pool on a thread of its own: unpinning synchronises the device."""
        self._base = None
        self._views = {}
        t = threading.Thread(target=pool.close, name="ckptio-snapshot-pool-free", daemon=True)
        t.start()
        self._retired.append(t)

    def prepare(self, state_dict: Any) -> None:
        """Sizes the pool for state_dict and starts pinning it in the background."""
        plan = self._plan(state_dict)
        with self._cv:
            if not self._box.held and not self._box.closed:
                self._ensure_pool(plan.nbytes, plan.pool_device)
                self._build(plan.template)  # the host views, made now rather than in the first take

    def info(self) -> Dict[str, Any]:
        """The pool: address, nbytes, ready_bytes (pinned so far), device, pinned, held; {} without one."""
        pool = self._pool
        return pool.info() if pool is not None else {}

    def wait_ready(self) -> None:
        """Blocks until the whole pool is pinned."""
        pool = self._pool
        if pool is not None:
            pool.wait_ready(pool.info()["nbytes"])

    # ---- taking ----------------------------------------------------------------------------------------
    class _Plan:
        __slots__ = ("copies", "entries", "nbytes", "devices", "pool_device", "template", "sources")

    def _plan(self, state_dict: Any) -> "Snapshots._Plan":
        """Lays the state's tensors out in the pool (each on a page) and builds the host state dict's recipe."""
        import torch

        dtensor = _dtensor_type()
        guarded = self._guarded.addresses()
        plan = Snapshots._Plan()
        plan.copies, plan.entries, plan.devices, plan.sources = [], [], [], []
        offset = 0
        early = _ckptio.SNAPSHOT_EARLY

        def tensor(t, dt_spec):
            nonlocal offset
            if t.is_sparse or t.is_quantized or t.layout != torch.strided:
                raise SnapshotUnsupported(f"a {t.layout} tensor cannot be snapshot")
            dev = t.device
            if dev.type == "cuda":
                index = dev.index if dev.index is not None else torch.cuda.current_device()
            elif dev.type == "cpu":
                index = -1
            else:
                raise SnapshotUnsupported(f"a tensor on {dev} cannot be snapshot (CPU and CUDA only)")
            if t.is_conj() or t.is_neg():
                raise SnapshotUnsupported("a tensor with a lazy conjugate or negation cannot be snapshot")
            nbytes = _span(t) * t.element_size()
            at = offset
            offset = (offset + nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
            if nbytes:
                flags = 0
                if index >= 0:
                    ptr = t.data_ptr()
                    if ptr not in guarded and t.untyped_storage().data_ptr() not in guarded:
                        flags = early
                    if index not in plan.devices:
                        plan.devices.append(index)
                    plan.sources.append(t)
                plan.copies.append((t.data_ptr(), at, nbytes, index, flags))
            entry = (at, nbytes, t.dtype, tuple(t.shape), None if t.is_contiguous() else tuple(t.stride()), dt_spec)
            plan.entries.append(entry)
            return entry

        def walk(v):
            if isinstance(v, torch.Tensor):
                if dtensor is not None and isinstance(v, dtensor):
                    return ("T", tensor(v._local_tensor.detach(), v._spec))
                if type(v) is not torch.Tensor and not isinstance(v, torch.nn.Parameter):
                    raise SnapshotUnsupported(f"a {type(v).__name__} cannot be snapshot")
                return ("T", tensor(v.detach(), None))
            if isinstance(v, dict):
                return ("D", type(v), [(k, walk(x)) for k, x in v.items()])
            if isinstance(v, list):
                return ("L", [walk(x) for x in v])
            if isinstance(v, tuple) and type(v) is tuple:
                return ("U", [walk(x) for x in v])
            if v is None or isinstance(v, (int, float, str, bytes, bool)):
                return ("V", v)
            if hasattr(v, "state_dict") and hasattr(v, "load_state_dict") and not isinstance(v, type):
                return walk(v.state_dict())  # a Stateful, as torch.distributed.checkpoint takes it at save time
            if isinstance(v, io.BytesIO):
                return ("V", io.BytesIO(v.getvalue()))
            return ("V", copy.deepcopy(v))  # RNG states, data-loader positions, ...: their value now

        plan.template = walk(state_dict)
        plan.nbytes = offset
        plan.pool_device = plan.devices[0] if plan.devices else -1
        return plan

    def _host(self, entry) -> Any:
        """The host tensor (a view of the pool) of a laid-out entry; views are reused from save to save."""
        view = self._views.get(entry[:5])
        if view is None:
            at, nbytes, dtype, shape, stride = entry[:5]
            import torch

            if nbytes == 0:
                view = torch.empty(shape, dtype=dtype)
            else:
                raw = self._base[at:at + nbytes].view(dtype)
                view = raw.view(shape) if stride is None else raw.as_strided(shape, stride)
            self._views[entry[:5]] = view
        spec = entry[5]
        if spec is not None:
            dtensor = _dtensor_type()
            return dtensor(view, spec, requires_grad=False)
        return view

    def _build(self, node) -> Any:
        kind = node[0]
        if kind == "T":
            return self._host(node[1])
        if kind == "D":
            out = {}
            if node[1] is not dict:
                try:
                    out = node[1]()  # an OrderedDict stays one
                except TypeError:
                    pass
            for k, x in node[2]:
                out[k] = self._build(x)
            return out
        if kind == "L":
            return [self._build(x) for x in node[1]]
        if kind == "U":
            return tuple(self._build(x) for x in node[1])
        return node[1]

    def take(self, state_dict: Any) -> Snapshot:
        """Copies state_dict into the pool as described above and returns at once. While an earlier snapshot
        is held (its save still writing), waits for its release."""
        import torch

        if self._closed:
            raise RuntimeError("ckptio.Snapshots is closed")
        plan = self._plan(state_dict)
        with self._cv:
            while self._box.held:  # an earlier snapshot's save still writes it
                self._cv.wait(0.05)
            if self._box.closed:
                raise RuntimeError("ckptio.Snapshots is closed")
            self._ensure_pool(plan.nbytes, plan.pool_device)
            info = self._pool.info()
            if info["ready_bytes"] < plan.nbytes:
                _log.warning("ckptio.Snapshots: this snapshot waits for its pool to be pinned (%d of %d bytes "
                             "ready); prepare() ahead of the first save avoids it", info["ready_bytes"], plan.nbytes)
            streams = [(d, torch.cuda.current_stream(d).cuda_stream) for d in plan.devices]
            self._pool.take(plan.copies, streams)
            try:
                host = self._build(plan.template)
            except BaseException:
                self._pool.release()
                raise
            self._box.held = True
            snap = Snapshot(self, host, plan.nbytes, plan.sources, plan.devices)
            self._held_ref = weakref.ref(snap)
        return snap

    def _held(self) -> Optional[Snapshot]:
        """The snapshot holding the pool, if any."""
        snap = self._held_ref() if self._held_ref is not None else None
        return None if snap is None or snap._released or not self._box.held else snap

    # ---- the training side -----------------------------------------------------------------------------
    def _before_update_current(self) -> None:
        held = self._held()
        if held is None or held._waited:
            return
        import torch

        pool = self._pool
        for d in held.devices:
            pool.before_update(d, torch.cuda.current_stream(d).cuda_stream)

    def before_update(self, stream=None) -> None:
        """Makes `stream` (default: the current stream of each device the held snapshot copies from) wait,
        on the GPU, for the snapshot's copies: call before queueing work that changes tensors guard() named.
        Optimizer steps do this themselves (a pre-hook on torch.optim.Optimizer.step)."""
        held = self._held()
        if held is None or held._waited:
            return
        if stream is None:
            self._before_update_current()
            return
        self._pool.before_update(stream.device.index, stream.cuda_stream)

    def guard(self, tensors) -> None:
        """Tensors changed only after before_update() (a loop updating weights without torch.optim): their
        copies overlap compute instead of holding the training stream at the take."""
        dtensor = _dtensor_type()
        for t in tensors:
            _Guarded._add(self._guarded.extra, t, dtensor)

    def close(self) -> None:
        """Frees the pool, or, while a snapshot is held (its save still writing), has that snapshot's release
        free it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        with self._cv:
            self._box.closed = True
            self._base = None
            self._views = {}
            pool = None if self._box.held else self._box.pool
            if pool is not None:
                self._box.pool = None
        if pool is not None:
            pool.close()
        for t in self._retired:
            t.join()

    def __enter__(self) -> "Snapshots":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: Optional[Snapshots] = None
_shared_lock = threading.Lock()


def shared() -> Snapshots:
    """The process's Snapshots that ckptio.dcp.FileSystemWriter uses by default (writers are often made
    per save; the pool outlives them)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed:
            _shared = Snapshots()
        return _shared


Snapshots.shared = staticmethod(shared)  # type: ignore[attr-defined]

__all__ = ["Snapshots", "Snapshot", "SnapshotUnsupported", "shared"]
