"""save / load / open: state dicts to and from checkpoint files.

The formats themselves (parsing, validation, layout, CRCs, I/O) live in
libckptio; this module maps between Python objects (state dicts, torch
tensors, numpy arrays) and the extension's address lists.
"""

from __future__ import annotations

import collections
import os
from operator import itemgetter
from typing import Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Union

from . import _adapt, _bulk, _ckptio, _distributed, _memory, _model, _progress, _sharded
from ._torch_objects import build_torch_object, mapped_tensors as _torch_tensors
from ._errors import make_error

PathLike = Union[str, "os.PathLike[str]"]

_E_FORMAT = _ckptio.E_FORMAT
_E_UNSUPPORTED = _ckptio.E_UNSUPPORTED


def _fail(status: int, path: str, message: str):
    return make_error(status, _ckptio.status_name(status), 0, 0, None, path, -1, None, f"{path}: {message}")


class TensorInfo(NamedTuple):
    """Where one tensor lives in a checkpoint file.

    ``dtype`` is the safetensors spelling ("BF16"); ``shape`` is in the
    file's terms; ``offset`` is the absolute file offset of its first byte
    (element [0, ..., 0]) in ``file`` (the shard holding it, for a
    directory) and ``nbytes`` its byte count. ``contiguous`` is False for a
    torch.save view whose bytes are not one range of the file.
    """

    name: str
    dtype: str
    shape: Tuple[int, ...]
    offset: int
    nbytes: int
    contiguous: bool = True
    file: Optional[str] = None


class StorageInfo(NamedTuple):
    """One storage (``data/<key>`` record) of a torch.save file: its bytes
    are ``nbytes`` at ``offset``; ``location`` is the device it was saved from."""

    key: str
    location: str
    dtype: str
    nbytes: int
    offset: int
    crc32: int


def _framework(framework: str) -> str:
    if framework in ("pt", "torch"):
        return "pt"
    if framework in ("np", "numpy"):
        return "numpy"
    raise ValueError(f"framework must be 'pt' or 'numpy', not {framework!r}")


def _detect(path: str, kind: Optional[str] = None) -> str:
    if kind is None:
        kind = _ckptio.format_detect(path)
    if kind in ("safetensors", "torch"):
        return kind
    if kind == "torch_legacy":
        raise _fail(_E_UNSUPPORTED, path, "legacy (pre-1.6, non-zip) torch.save files are not supported; "
                    "re-save with torch.save(..., _use_new_zipfile_serialization=True)")
    if kind == "dcp":
        raise _fail(_E_UNSUPPORTED, path, "is a torch.distributed.checkpoint directory, not a checkpoint file; "
                    "load it with torch.distributed.checkpoint and ckptio.dcp.FileSystemReader")
    if kind in ("directory", "hf_index") and (os.path.isdir(path) or (_ckptio.path_is_object(path) and
                                                                       not path.endswith(".json"))):
        raise _fail(_E_UNSUPPORTED, path, "is a directory, not a checkpoint file")
    if kind == "hf_index":
        raise _fail(_E_UNSUPPORTED, path, "is a Hugging Face index (JSON), not a checkpoint file; open its shards")
    raise _fail(_E_FORMAT, path, "not a safetensors or torch.save zip file (unrecognised first bytes)")


class _Entry(NamedTuple):
    index: int
    code: int
    shape: Tuple[int, ...]
    offset: int
    nbytes: int
    contiguous: bool


class CheckpointFile:
    """An open checkpoint for lazy, selective loading (like ``safetensors.safe_open``).

    Created by :func:`ckptio.open`; works for safetensors and torch.save
    files, and for Hugging Face directories of safetensors shards (or their
    ``*.index.json``) as one handle over all shards. Use it as a context
    manager, or call :meth:`close`.
    """

    def __init__(self, path: PathLike, framework: str = "pt", device: Any = "cpu", *, engine=None,
                 allow_symlinks: bool = False, mmap: bool = False):
        self._path = os.fspath(path)
        self._framework = _framework(framework)
        self._device = _adapt.parse_device(device)
        if self._framework == "numpy" and self._device.kind != "cpu":
            raise ValueError(f"framework='numpy' loads to the cpu only, not {self._device}")
        self._mmap = bool(mmap)
        if self._mmap and self._device.kind != "cpu":
            raise ValueError(f"mmap=True maps the file into host memory for cpu tensors; device {self._device} "
                             "reads into GPU memory: leave mmap off")
        self._mappings: Dict[int, Any] = {}
        # Directories and indexes are always safetensors models (libckptio's ckptio_model).
        kind = _ckptio.format_detect(self._path, engine)  # an s3:// path's requests with the engine's settings
        self.format = "safetensors" if _model.is_model_path(self._path, kind) else _detect(self._path, kind)
        # name -> row index; rows are the extension's tuples, made into _Entry on demand
        # (a file of 100,000 tensors pays for a dict, not for 100,000 objects).
        self._index: Dict[str, int] = {}
        self._has_metadata = False
        if self.format == "safetensors":
            # A row and a name per tensor, however many: known only once it is read.
            with _bulk.no_gc():
                self._reader = _ckptio.ModelReader(self._path, engine, allow_symlinks)
                self._shards = self._reader.shards
                self._rows = self._reader.tensors
                self._index = dict(zip(map(itemgetter(0), self._rows), range(len(self._rows))))
            self._order = None  # the rows' order: offset_keys() lists it when asked
            self._metadata = self._reader.metadata
            self._has_metadata = self._reader.has_metadata
        else:
            self._shards = [self._path]
            self._reader = _ckptio.TorchReader(self._path, engine)
            self._rows = self._tensor_rows = self._reader.tensors
            by_offset = []
            for i, row in enumerate(self._rows):
                name = row[0]
                if name not in self._index:
                    self._index[name] = i
                    by_offset.append((row[9], i, name))
            self._order = [name for _, _, name in sorted(by_offset)]
            self._metadata = {}

    # -- description ----------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._path

    @property
    def shards(self) -> List[str]:
        """Paths of the files read: the shards of a directory (sorted), else the file itself."""
        return list(self._shards)

    def keys(self) -> List[str]:
        """Tensor names, sorted (torch files: dotted paths such as "layer.0.weight")."""
        return sorted(self._index)

    def offset_keys(self) -> List[str]:
        """Tensor names in file order (by data offset; a directory: shard by shard)."""
        return [row[0] for row in self._rows] if self._order is None else list(self._order)

    def metadata(self) -> Dict[str, str]:
        """The safetensors ``__metadata__`` dict ({} when absent and for torch files)."""
        return dict(self._metadata)

    def info(self, name: str) -> TensorInfo:
        """Dtype, shape, absolute file offset and byte count of one tensor."""
        e = self._entry(name)
        file = self._shards[self._rows[e.index][5]] if self.format == "safetensors" else self._path
        return TensorInfo(name, _adapt.dtype_name(e.code), e.shape, e.offset, e.nbytes, e.contiguous, file)

    def storages(self) -> List[StorageInfo]:
        """torch.save files: every storage record with its file offset (what
        GdsFile.load_storage / save_storage need); [] for safetensors."""
        if self.format != "torch":
            return []
        return [StorageInfo(key, loc, _adapt.dtype_name(code), nbytes, offset, crc)
                for key, loc, code, nbytes, offset, crc in self._reader.storages]

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def _entry(self, name: str) -> _Entry:
        try:
            i = self._index[name]
        except KeyError:
            raise KeyError(f"{self._path}: no tensor named {name!r}") from None
        row = self._rows[i]
        if self.format == "safetensors":
            name, code, shape, offset, nbytes, _ = row
            return _Entry(i, code, tuple(shape), offset, nbytes, True)
        return _Entry(i, row[1], tuple(row[2]), row[9], row[10], row[8])

    def _mapping(self, shard: int = 0):
        """The mapping of shard `shard` (the file itself for torch files), made once per handle."""
        m = self._mappings.get(shard)
        if m is None:
            m = self._mappings[shard] = self._reader.map(shard) if self.format == "safetensors" else self._reader.map()
        return m

    # -- reading ----------------------------------------------------------------------
    def get_tensor(self, name: str, device: Any = None, *, out: Any = None):
        """Reads one tensor (a new tensor on `device`, or into `out`)."""
        return self.get_tensors([name], device, out={name: out} if out is not None else None)[name]

    def get_tensors(self, names: Optional[Iterable[str]] = None, device: Any = None, *,
                    out: Optional[Mapping[str, Any]] = None, progress: "_progress.Progress" = None) -> Dict[str, Any]:
        """Reads several tensors in one pass (one engine plan; GIL released).

        `names` defaults to every tensor (or the keys of `out`); `out` maps
        names to existing tensors/arrays to fill in place (dtype and shape
        must match the file). Returns {name: tensor} in the order asked.
        `progress`: a callable (done, total) in bytes, or True for a bar;
        an exception it raises cancels the read and is raised here.
        """
        if names is None:
            names = list(out.keys()) if out is not None else self.keys()
        else:
            names = list(names)
        dev = self._device if device is None else _adapt.parse_device(device)
        if self._framework == "numpy" and dev.kind != "cpu":
            raise ValueError(f"framework='numpy' loads to the cpu only, not {dev}")
        if self._mmap and (dev.kind != "cpu" or out is not None):
            raise ValueError(f"{self._path}: this handle maps the file (mmap=True): its tensors are cpu tensors over "
                             "the mapping; read into GPU memory or into out= with a handle opened without mmap")
        if dev.kind == "cuda":
            dev = _adapt.resolve_cuda(dev)
        st = self.format == "safetensors"
        if dev.kind == "cpu" and out is None and (self._mmap or (st and self._framework == "pt")):
            with _progress.reporting(progress, f"load {self._path}"):
                return self._get_cpu(names)
        result: Dict[str, Any] = {}
        moves: Dict[str, Any] = {}
        targets = []
        cuda_devices = set()
        for name in names:
            e = self._entry(name)
            what = f"tensor '{name}'"
            if out is not None and out.get(name) is not None:
                t = _adapt.existing_target(out[name], e.code, e.shape, what, self._path, safetensors=st)
                if not e.contiguous and t.mem_kind == _adapt.MEM_CUDA:
                    raise ValueError(f"{self._path}: {what} is a non-contiguous view in the file; "
                                     "read it into a cpu tensor")
            elif not e.contiguous and dev.kind == "cuda":
                # ckptio gathers strided views through host memory only.
                t = _adapt.new_target(e.code, e.shape, _adapt.Device("cpu", None), self._framework, what,
                                      safetensors=st)
                moves[name] = dev
            else:
                t = _adapt.new_target(e.code, e.shape, dev, self._framework, what, safetensors=st)
            if t.mem_kind == _adapt.MEM_CUDA:
                cuda_devices.add(t.value.device.index)
            result[name] = t.value
            targets.append((e.index, t.address, t.capacity, t.mem_kind))
        _adapt.sync_current_stream(cuda_devices)
        with _progress.reporting(progress, f"load {self._path}"):
            self._reader.read(targets)
        for name, d in moves.items():
            result[name] = result[name].to(str(d))
        return result

    def _get_cpu(self, names: List[str]) -> Dict[str, Any]:
        """New cpu tensors, or views of the mapped file with mmap=True, built
        a few buffers at a time (_bulk.py); {name: tensor} in the order asked."""
        try:
            index = list(map(self._index.__getitem__, names))
        except KeyError as exc:
            raise KeyError(f"{self._path}: no tensor named {exc.args[0]!r}") from None
        with _bulk.no_gc(len(index)):
            if self.format == "torch":
                if self._framework != "pt":
                    raise ValueError(f"{self._path}: mmap=True maps torch files for framework='pt' only")
                made = _torch_tensors(self._reader, self._mapping(), sorted(set(index)))
                return {name: made[i] for name, i in zip(names, index)}
            rows = self._rows
            items = [(i,) + rows[i] for i in sorted(set(index))]
            if self._framework == "numpy":
                made = _bulk.numpy_mapped(items, self._mapping)
            elif self._mmap:
                made, left = _bulk.load_mapped(self._reader, items, self._mapping)
                if left:
                    _bulk.load_copied(self._reader, left, made)
            else:
                made = _bulk.load_copied(self._reader, items)
            return dict(zip(names, map(made.__getitem__, index)))

    # -- slices (_model.py) -------------------------------------------------------------
    def get_slice(self, name: str) -> "_model.Slice":
        """A tensor to index before reading, like safetensors' ``get_slice``:
        ``f.get_slice("w")[:, 1024:2048]`` reads only those bytes, to the
        handle's device. ``get_shape()``, ``get_dtype()`` describe it."""
        if self.format != "safetensors":
            raise ValueError(f"{self._path}: get_slice() reads safetensors files and directories; this is a "
                             f"{self.format} file: use get_tensor(name)[...]")
        return _model.Slice(self, name)

    def get_slices(self, requests: "_model.Requests", device: Any = None, *, process_group: Any = None,
                   batch_bytes: Optional[int] = None):
        """Reads many tensors and slices in ONE engine plan: ``requests`` is
        {name: index} (returns {name: tensor}) or a list of (name, index)
        pairs or :class:`SliceRequest` (returns a list). An index is what
        ``get_slice(name)[index]`` takes; ``...`` is the whole tensor.

        ``process_group``: every rank of the group calls this with its own
        requests; each needed byte is read from storage once across the
        group and the rest arrives over it (docs/MODELS.md, "Every byte read
        once"; ``ckptio.last_load_stats()`` says what this rank moved)."""
        if process_group is not None:
            out = _distributed.get_slices(self, requests, device, process_group, batch_bytes)
        else:
            out = _model.read_requests(self, _model.plan_requests(self, requests), device)
        if isinstance(requests, Mapping):
            return dict(zip(requests.keys(), out))
        return out

    def plan_slices(self, requests: "_model.Requests") -> List["_model.SliceRequest"]:
        """The requests as plain data (box per dimension, bytes, what to
        apply after reading), validated but not read: lists of them can be
        split between ranks and read with :meth:`read_slices`."""
        return _model.plan_requests(self, requests)

    def read_slices(self, requests: List["_model.SliceRequest"], device: Any = None, *,
                    process_group: Any = None, batch_bytes: Optional[int] = None) -> List[Any]:
        """Reads planned requests (from :meth:`plan_slices`) in one plan
        (``process_group``: read once across the group, as :meth:`get_slices`)."""
        if process_group is not None:
            return _distributed.get_slices(self, requests, device, process_group, batch_bytes, planned=True)
        return _model.read_requests(self, list(requests), device)

    def load_object(self, device: Any = None, *, progress: "_progress.Progress" = None) -> Any:
        """torch.save files: the whole saved object (as ``torch.load`` returns
        it, with every tensor on `device`): dicts, OrderedDicts, lists,
        scalars, nn.Parameters; views keep sharing their storages.
        `progress` as for :meth:`get_tensors`."""
        if self.format != "torch":
            raise ValueError(f"{self._path}: load_object() is for torch.save files; this is {self.format}")
        if self._framework != "pt":
            raise ValueError("load_object() builds torch objects; use framework='pt'")
        dev = self._device if device is None else _adapt.parse_device(device)
        if dev.kind == "cuda":
            dev = _adapt.resolve_cuda(dev)
        with _progress.reporting(progress, f"load {self._path}"):
            return build_torch_object(self._reader, dev, self._mapping() if self._mmap else None)

    def verify(self) -> Dict[str, int]:
        """Reads all data and checks it: torch.save files against every record's
        CRC-32; safetensors files against the checksum manifest written by
        ``save(..., checksums=True)`` (CkptioError with status E_NOT_FOUND when
        there is none, E_STALE when another save wrote it). A mismatch raises CkptioError
        E_CHECKSUM naming the record or the tensor and its byte range."""
        return self._reader.verify()

    def close(self) -> None:
        self._reader.close()

    @property
    def closed(self) -> bool:
        return self._reader.closed

    def __enter__(self) -> "CheckpointFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} tensors"
        return f"<ckptio.CheckpointFile {self._path!r} ({self.format}, {state})>"


def open(path: PathLike, framework: str = "pt", device: Any = "cpu", *, engine=None,
         allow_symlinks: bool = False, mmap: bool = False) -> CheckpointFile:
    """Opens a checkpoint for lazy access: ``keys()``, ``metadata()``,
    ``info(name)``, ``get_tensor(name, device=...)``, ``get_slice(name)``.
    The format is detected from the file's first bytes; a directory (or a
    ``*.index.json``) is a Hugging Face safetensors model, one handle over
    all its shards. ``allow_symlinks=True`` lets a directory's shards be
    symlinks to files outside it (the Hugging Face hub cache); by default
    they are refused. ``mmap=True``: tensors are views of the file mapped
    into memory (cpu only), as :func:`load` gives them."""
    return CheckpointFile(path, framework, device, engine=engine, allow_symlinks=allow_symlinks, mmap=mmap)


def load(path: Union[PathLike, bytes, bytearray, memoryview, Any], device: Any = "cpu",
         keys: Optional[Iterable[str]] = None, *, framework: str = "pt", out: Optional[Mapping[str, Any]] = None,
         engine=None, allow_symlinks: bool = False, progress: "_progress.Progress" = None,
         process_group: Any = None, tp_dim: "_distributed.TpRule" = None, slices: "_model.Requests" = None,
         batch_bytes: Optional[int] = None, mmap: bool = False) -> Any:
    """Loads a checkpoint; the format is detected from the file's first bytes.

    Args:
        path: a safetensors or torch.save (zip) file, or a Hugging Face
            directory of safetensors shards (or its ``*.index.json``): all
            shards are read in one engine plan. Also the checkpoint itself
            as bytes, bytearray or memoryview, or a binary file object (read
            from its position), as ``safetensors.torch.load`` and
            ``torch.load(buffer)`` take them.
        device: "cpu", "cuda", "cuda:N", an int N or a torch.device; tensors
            are allocated there and the bytes go straight in.
        keys: names to load (default: all). A missing name is a KeyError.
        framework: "pt" (torch tensors) or "numpy" (arrays, cpu only).
        out: names -> existing tensors/arrays to fill in place.
        engine: a ckptio.Engine (default: the shared default engine).
        allow_symlinks: a directory's shards may be symlinks leaving it.
        progress: a callable (done, total) in bytes, or True for a bar (tqdm
            when installed); an exception it raises (KeyboardInterrupt
            included) cancels the load and is raised here.
        mmap: cpu tensors over the file mapped into memory instead of
            copies, as ``safetensors.torch.load_file`` and
            ``torch.load(mmap=True)`` give them: private and copy-on-write
            (writes to a tensor never reach the file), bytes read when first
            touched. A tensor the layout cannot map (an offset that is not a
            multiple of its element size) is read. Not with `out`, a GPU
            `device` or `process_group`. docs/PYTHON.md says when it is
            faster and what a file truncated under it does.
        process_group: a torch.distributed group; every rank calls load and
            each needed byte is read from storage once across the group, the
            rest delivered over it (safetensors files and directories;
            docs/MODELS.md, "Every byte read once"; ``ckptio.last_load_stats()``).
        tp_dim: with process_group: this rank takes ``torch.tensor_split(t,
            world, dim)[rank]`` of each tensor, dim given by an int (tensors of
            2+ dimensions; 0-D/1-D ones whole), {name pattern: dim or None} or
            a callable (name, shape) -> dim or None.
        slices: {name: index} or [(name, index)], as ``get_slices`` takes
            them; returns what ``get_slices`` returns.
        batch_bytes: with process_group: bytes of shared tensors exchanged
            per step (default 1 GiB); each rank holds about two batches of
            exchange buffers on its GPU during the load.

    Returns, for safetensors files and whenever `keys`, `out` or
    framework="numpy" is given: a flat dict name -> tensor. For a torch.save
    file otherwise: the saved object itself, as ``torch.load(path,
    map_location=device, weights_only=True)`` returns it.
    """
    if process_group is not None:
        if mmap:
            raise ValueError("load(..., process_group=) exchanges bytes between ranks; mmap=True maps a file for "
                             "one process: pass one of them")
        if out is not None or progress is not None or framework != "pt" or _memory.is_memory(path):
            raise ValueError("load(..., process_group=) reads a path into new torch tensors: out=, progress=, "
                             "framework='numpy' and in-memory checkpoints are not supported with it")
        return _distributed.load(path, lambda: CheckpointFile(path, "pt", device, engine=engine,
                                                              allow_symlinks=allow_symlinks),
                                 device, keys, slices=slices, tp_dim=tp_dim, process_group=process_group,
                                 batch_bytes=batch_bytes)
    if batch_bytes is not None:
        raise ValueError("batch_bytes= sizes the exchange of a load with process_group=: pass process_group=")
    if tp_dim is not None:
        raise ValueError("tp_dim= splits tensors between the ranks of a process_group: pass process_group=")
    if slices is not None:
        if keys is not None or out is not None:
            raise ValueError("slices= names its own tensors: pass keys= and out= without it")
        with CheckpointFile(path, framework, device, engine=engine, allow_symlinks=allow_symlinks) as f:
            return f.get_slices(slices)
    if _memory.is_memory(path):
        dev = _adapt.parse_device(device)
        if progress is None and out is None and framework == "pt" and dev.kind == "cpu":
            if engine is None:
                _ckptio.default_engine()  # as for a save to bytes
            got = _memory.load_in_memory(path, keys)
            if got is not None:
                return got
        # The bar is named after what the caller gave, not the memory file's /proc name.
        label = "load bytes" if isinstance(path, (bytes, bytearray, memoryview)) else "load stream"
        with _progress.reporting(progress, label), _memory.readable_path(path) as mpath:
            return load(mpath, device, keys, framework=framework, out=out, engine=engine, mmap=mmap)
    # The cyclic collector waits for the whole load (_bulk.no_gc), and the handle with its row per tensor goes
    # before it runs again: its first collection then walks what the load returns, not also what it used.
    with _bulk.no_gc():
        f = CheckpointFile(path, framework, device, engine=engine, allow_symlinks=allow_symlinks, mmap=mmap)
        with f:
            if f.format == "torch" and keys is None and out is None and f._framework == "pt":
                got = f.load_object(progress=progress)
            else:
                got = f.get_tensors(keys, out=out, progress=progress)
        del f
    return got


def prepare_gpu(device: Any = "cuda", *, engine=None) -> None:
    """Starts pinning the host staging memory that loads to `device` will use,
    on a background thread, and returns at once.

    A process's first GPU load otherwise pins its staging as it goes (the
    slots it needs, up to 2 of 4 MiB per worker thread), which slows it:
    this pins all of them (128 MiB with 16 threads). A model server calls it
    while it builds its model, so that the load which follows starts with
    its staging ready (docs/GPU.md#pinning has the measurements).
    The CUDA driver pins and allocates GPU memory one at a time, so GPU
    allocations made meanwhile wait for the pinning: call it ahead of work
    that does not allocate GPU memory (reading configs, building the model
    on the meta device). A load that starts meanwhile stops the pinning and pins what
    it needs itself. The memory stays with the engine for later transfers.

    Args:
        device: "cuda", "cuda:N", an int N or a torch.device.
        engine: a ckptio.Engine (default: the shared default engine, which
            ``ckptio.load`` uses).
    """
    dev = _adapt.parse_device(device)
    if dev.kind != "cuda":
        raise ValueError(f"prepare_gpu: device {dev} is not a CUDA device")
    dev = _adapt.resolve_cuda(dev)
    (engine if engine is not None else _ckptio.default_engine()).prepare_gpu(dev.index)


# ---- saving ------------------------------------------------------------------------------


class TensorRef(tuple):
    """A tensor in the tree handed to _ckptio.torch_save: (storage id, dtype
    code, shape, stride, storage_offset, requires_grad, is_parameter)."""

    __slots__ = ()


class DtypeRef(str):
    """A torch.dtype in the tree handed to _ckptio.torch_save (its torch name)."""

    __slots__ = ()


def _torch_tree(obj: Any, path: str):
    """Replaces tensors and dtypes by TensorRef/DtypeRef; returns (tree,
    storages, CUDA devices, objects to keep alive)."""
    torch = _adapt.torch_module()
    storages: List[Tuple[int, int, str, int, int]] = []
    storage_ids: Dict[Tuple[str, int], Tuple[int, int]] = {}
    memo: Dict[int, Any] = {}
    keep: List[Any] = []
    cuda = set()

    def tensor_ref(t, where: str) -> TensorRef:
        what = f"tensor '{where}'"
        _adapt.check_savable(t, what, path)
        is_param = isinstance(t, torch.nn.Parameter)
        requires_grad = bool(t.requires_grad)
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        keep.append(t)
        code = _adapt.code_of_torch_dtype(t.dtype, f"{path}: {what}")
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError) as exc:
            raise TypeError(f"{path}: {what}: its storage cannot be read ({exc}); ckptio saves plain dense "
                            "tensors") from None
        nbytes = s.nbytes()
        location = "cpu" if t.device.type == "cpu" else f"cuda:{t.device.index}"
        key = (location, s.data_ptr()) if nbytes else None
        if key is not None and key in storage_ids:
            sid, scode = storage_ids[key]
            if scode != code:
                raise RuntimeError(f"{path}: {what} views the same storage as another tensor with a different "
                                   f"dtype ({_adapt.dtype_name(code)} vs {_adapt.dtype_name(scode)}); "
                                   "torch.save refuses this too")
        else:
            sid = len(storages)
            if t.device.type == "cuda":
                kind = _adapt.MEM_CUDA
                cuda.add(t.device.index)
            else:
                kind = _adapt.host_kind(t)
            storages.append((code, nbytes, location, s.data_ptr() if nbytes else 0, kind))
            if key is not None:
                storage_ids[key] = (sid, code)
        return TensorRef((sid, code, tuple(t.shape), tuple(t.stride()), t.storage_offset(), requires_grad,
                          is_param))

    def conv(o: Any, where: str) -> Any:
        if o is None or isinstance(o, (bool, int, float, str, bytes)):
            return o
        hit = memo.get(id(o))
        if hit is not None:
            return hit
        if isinstance(o, torch.Tensor):
            r = tensor_ref(o, where)
        elif isinstance(o, torch.dtype):
            r = DtypeRef(str(o).split(".")[-1])
        elif isinstance(o, dict):
            r = collections.OrderedDict() if isinstance(o, collections.OrderedDict) else {}
            for k, v in o.items():
                r[conv(k, where)] = conv(v, f"{where}.{k}" if where else str(k))
        elif isinstance(o, list):
            r = [conv(v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(o)]
        elif isinstance(o, tuple):
            r = tuple(conv(v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(o))
        elif isinstance(o, (set, frozenset)):
            r = {conv(v, where) for v in o}
        elif isinstance(o, bytearray):
            r = bytes(o)
        else:
            hint = ("; for numpy values: torch.from_numpy(a) or a.tolist(), or torch.save, whose numpy arrays "
                    "and scalars ckptio.load reads" if type(o).__module__.split(".")[0] == "numpy" else "")
            raise TypeError(f"{path}: cannot save {type(o).__module__}.{type(o).__qualname__} at "
                            f"'{where or '<root>'}' in a torch checkpoint (ckptio writes tensors, dtypes, "
                            f"containers, str, bytes, int, float, bool and None{hint})")
        memo[id(o)] = r
        keep.append(o)
        return r

    return conv(obj, ""), storages, cuda, keep


def _save_torch(obj: Any, spath: str, alignment: int, crc: bool, engine,
                in_place: bool = False) -> List[Optional[Tuple[int, str]]]:
    tree, storages, cuda, keep = _torch_tree(obj, spath)
    _adapt.sync_current_stream(cuda)
    offsets = _ckptio.torch_save(spath, tree, storages, TensorRef, DtypeRef, collections.OrderedDict,
                                 alignment, None, crc, engine, in_place)
    del keep  # the tensors' memory had to stay alive until here
    return offsets


# Extensions that mean torch.save files (PyTorch's own, Hugging Face's
# pytorch_model.bin, Lightning's .ckpt); everything else is safetensors.
TORCH_EXTENSIONS = (".pt", ".pth", ".bin", ".ckpt")


def format_for_path(path: Optional[str], format: Optional[str]) -> str:
    """The format a save writes: `format` when given, else by the file's
    extension (.pt .pth .bin .ckpt: "torch"; otherwise "safetensors")."""
    if format is not None:
        return str(format).lower()
    if path is not None and os.path.splitext(path)[1].lower() in TORCH_EXTENSIONS:
        return "torch"
    return "safetensors"


def save(state_dict: Any, path: Optional[PathLike] = None, format: Optional[str] = None,
         metadata: Optional[Mapping[str, str]] = None, *, align: Optional[int] = None, crc: bool = True,
         checksums: bool = False, engine=None, progress: "_progress.Progress" = None,
         max_shard_size: Union[int, str, None] = None, overwrite: bool = False) -> Optional[bytes]:
    """Saves a state dict atomically (temporary file, fsync, rename), or as
    a Hugging Face directory of safetensors shards.

    Args:
        state_dict: name -> torch.Tensor (cpu or cuda) or numpy.ndarray
            (safetensors). For format="torch", any tree of dicts,
            OrderedDicts, lists, tuples, tensors, nn.Parameters, dtypes and
            scalars (what ``torch.load(weights_only=True)`` accepts).
        path: the destination; an existing file is replaced only on success.
            None: the checkpoint is returned as bytes (like
            ``safetensors.torch.save``), nothing is written to disk.
        format: "safetensors" or "torch" (torch.save zip, readable by
            ``torch.load``). Default: by `path`'s extension, ".pt", ".pth",
            ".bin" and ".ckpt" are "torch", anything else (and bytes)
            "safetensors".
        metadata: safetensors only: str -> str pairs for ``__metadata__``.
        align: safetensors: 4096 (default) starts the data section on a 4 KiB
            boundary (header padded with spaces, a valid safetensors file), 8
            gives the reference writer's exact layout. torch: the storage
            alignment, 1..65536 (default 4096; torch.save's own is 64).
        crc: torch only: CRC-32 of every record, host or GPU storages
            (default True; computed while the data is written).
        checksums: safetensors only: also write NAME.ckptio-manifest.json
            with XXH3-64 checksums per 4 MiB block of every tensor, checked by
            ``ckptio.open(path).verify()`` and ``ckptio verify``; the file's
            metadata then holds "ckptio.save_id", which binds it to the manifest.
        engine: a ckptio.Engine (default: the shared default engine).
        progress: a callable (done, total) in bytes, or True for a bar (tqdm
            when installed); an exception it raises (KeyboardInterrupt
            included) cancels the save: no file appears, an older one stays.

    A Hugging Face directory is written when `max_shard_size` is given
    (bytes, or "5GB", "500MB"; default "5GB"), when `path` ends in "/"
    (also "s3://bucket/model/") or names an existing directory: split and
    named as huggingface_hub's ``save_torch_state_dict`` does, all shards
    written at once, the index last; a model already there is refused
    unless ``overwrite=True`` (docs/PYTHON.md "Sharded directories").

    A save over an existing file keeps its permission bits (and, where
    permitted, owner and group); a new file gets 0666 & ~umask.

    safetensors: nested dicts are flattened with "." ({"a": {"b": t}} ->
    "a.b"); non-contiguous tensors are written through a contiguous copy;
    tensors whose memory overlaps are refused (the format cannot express
    sharing; use format="torch", which keeps views and shared storages).
    """
    if path is None and max_shard_size is not None:
        raise ValueError("max_shard_size writes a directory of shards; give its path (saving to bytes makes one file)")
    if path is not None and _sharded.is_directory_target(os.fspath(path), max_shard_size):
        _save(state_dict, os.fspath(path), format, metadata, align, crc, checksums, engine, progress, False,
              shards=(max_shard_size, overwrite))
        return None
    if overwrite:
        raise ValueError("overwrite applies to a directory of shards; a file is always replaced atomically")
    if path is None:
        if checksums:
            raise ValueError("checksums=True writes a manifest beside a file; saving to bytes has no file")
        if progress is None:
            # Host tensors to safetensors: laid out and copied straight into the bytes object. No
            # engine moves them, but the first save makes the default one all the same (its
            # settings are checked then: the misspelling warning of the first save stays).
            if engine is None:
                _ckptio.default_engine()
            data = _save(state_dict, _memory.NAME, format, metadata, align, crc, False, engine, None, True,
                         to_bytes=True)
            if data is not None:
                return data
        return _memory.save_to_bytes(
            lambda mpath: _save(state_dict, mpath, format, metadata, align, crc, False, engine, progress, True))
    _save(state_dict, os.fspath(path), format, metadata, align, crc, checksums, engine, progress, False)
    return None


def _check_only_tensors(flat: Dict[str, Any], spath: str) -> None:
    """safetensors holds tensors only; a training state often holds a step
    counter or a config too: say which key, and which format keeps it."""
    for name, value in flat.items():
        if _adapt.is_torch_tensor(value) or _adapt.is_numpy_array(value):
            continue
        cls = type(value)
        kind = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
        what = "None" if value is None else f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}"
        raise TypeError(f"{spath}: '{name}' is {what}, not a tensor, and safetensors stores only tensors: save "
                        "it in the torch.save format (a path ending in .pt, or format='torch'), which keeps such "
                        "values, or leave it out")


def _save(state_dict: Any, spath: str, format: Optional[str], metadata: Optional[Mapping[str, str]],
          align: Optional[int], crc: bool, checksums: bool, engine, progress: "_progress.Progress",
          in_place: bool, to_bytes: bool = False, shards: Optional[Tuple[Any, bool]] = None) -> Optional[bytes]:
    """Saves to `spath`; with `to_bytes`, returns the safetensors file of host
    tensors as bytes instead, or None (nothing done) for the other cases;
    with `shards` (max_shard_size, overwrite), a Hugging Face directory."""
    fmt = _sharded.check_options(spath, format, checksums, align) if shards else format_for_path(
        spath if not in_place else None, format)
    what = "save bytes" if in_place else f"save {spath}"
    if checksums and fmt != "safetensors":
        raise ValueError(f"{spath}: checksums=True is for safetensors; torch.save files carry CRC-32s (crc=True)")
    if to_bytes and fmt != "safetensors":
        return None
    if fmt in ("torch", "pt", "pytorch"):
        if metadata:
            raise ValueError(f"{spath}: metadata is a safetensors feature; torch.save files have none")
        alignment = 0 if align is None else int(align)
        with _progress.reporting(progress, what):
            _save_torch(state_dict, spath, alignment, crc, engine, in_place)
        return
    if fmt != "safetensors":
        raise ValueError(f"format must be 'safetensors' or 'torch', not {format!r}")
    flat = _adapt.flatten(state_dict)
    _check_only_tensors(flat, spath)
    _adapt.check_state_dict(flat, spath)
    overlaps = _adapt.find_overlaps(flat)
    if overlaps:
        groups = "; ".join("{" + ", ".join(sorted(g)) + "}" for g in overlaps)
        raise ValueError(f"{spath}: tensors share memory and safetensors cannot express sharing: {groups}. "
                         "Clone them, save only one, or use format='torch'.")
    if metadata is not None:
        metadata = dict(metadata)
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"{spath}: metadata must map str to str; got {k!r}: {type(v).__name__}")
            _adapt.check_utf8(k, "metadata key", spath)
            _adapt.check_utf8(v, f"metadata value of {k!r}:", spath)
    sources = [_adapt.tensor_source(name, value, safetensors=True, path=spath) for name, value in flat.items()]
    if shards is not None:
        _adapt.sync_current_stream({s.cuda_index for s in sources if s.mem_kind == _adapt.MEM_CUDA})
        _sharded.save([(s.name, s.code, s.shape, s.address, s.nbytes, s.mem_kind) for s in sources], spath,
                      shards[0], metadata, engine, progress, shards[1])
        del sources  # the memory had to stay alive until here
        return None
    if to_bytes:
        if any(s.mem_kind == _adapt.MEM_CUDA for s in sources):
            return None
        return _ckptio.safetensors_serialize([(s.name, s.code, s.shape, s.address, s.nbytes, s.mem_kind)
                                              for s in sources], metadata, 4096 if align is None else align)
    _adapt.sync_current_stream({s.cuda_index for s in sources if s.mem_kind == _adapt.MEM_CUDA})
    with _progress.reporting(progress, what):
        _ckptio.safetensors_save(
            spath,
            [(s.name, s.code, s.shape, s.address, s.nbytes, s.mem_kind) for s in sources],
            metadata,
            4096 if align is None else align,
            engine,
            checksums,
            in_place,
        )
    del sources  # the memory had to stay alive until here
    return None


def save_torch(obj: Any, path: PathLike, *, align: Optional[int] = None, crc: bool = True,
               engine=None) -> List[Optional[Tuple[int, str]]]:
    """Like ``save(obj, path, format="torch")``, returning where each
    distinct storage's bytes went: a list (in first-use order) of
    (file offset, record key), None for storages no tensor saved."""
    spath = os.fspath(path)
    return _save_torch(obj, spath, 0 if align is None else int(align), crc, engine)
