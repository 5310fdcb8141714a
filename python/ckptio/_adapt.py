"""Adapters between torch / numpy objects and the extension's plain arguments.

Nothing here reads or writes files: it maps dtypes (through the C library's
dtype table), parses devices, turns tensors and arrays into
(address, nbytes, memory kind) and allocates destination tensors. torch and
numpy are imported lazily, so ``import ckptio`` needs neither.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import _ckptio

MEM_HOST = _ckptio.MEM_HOST
MEM_PINNED = _ckptio.MEM_PINNED
MEM_CUDA = _ckptio.MEM_CUDA

# (code, safetensors name or None, torch name or None, bits) for every ckptio dtype.
DTYPES: List[Tuple[int, Optional[str], Optional[str], int]] = [tuple(r) for r in _ckptio.dtypes()]
_BY_CODE = {r[0]: r for r in DTYPES}
_CODE_BY_TORCH_NAME = {r[2]: r[0] for r in DTYPES if r[2]}
_F4 = next(r[0] for r in DTYPES if r[1] == "F4")
# numpy has these under the torch spelling; the rest (bfloat16, float8, ...) it lacks.
_NUMPY_NAMES = {"bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                "float16", "float32", "float64", "complex64", "complex128"}


def dtype_name(code: int) -> str:
    """The safetensors spelling of a dtype code ("F32"), else the torch one."""
    row = _BY_CODE[code]
    return row[1] or row[2] or str(code)


def torch_module():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is installed where tests run
        raise ImportError("this ckptio function needs PyTorch (pip install torch)") from exc
    return torch


def is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_numpy_array(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def torch_dtype(code: int, what: str):
    """torch.dtype for a dtype code; TypeError naming `what` when torch lacks it."""
    torch = torch_module()
    name = _BY_CODE[code][2]
    dt = getattr(torch, name, None) if name else None
    if dt is None:
        raise TypeError(f"{what}: dtype {dtype_name(code)} has no torch equivalent in torch {torch.__version__}")
    return dt


def code_of_torch_dtype(dtype, what: str) -> int:
    name = str(dtype).split(".")[-1]
    code = _CODE_BY_TORCH_NAME.get(name)
    if code is None:
        raise TypeError(f"{what}: torch dtype {dtype} is not supported by ckptio")
    return code


def numpy_dtype(code: int, what: str):
    import numpy as np

    name = _BY_CODE[code][2]
    if name not in _NUMPY_NAMES:
        raise TypeError(f"{what}: dtype {dtype_name(code)} has no numpy equivalent; load it with framework='pt'")
    return np.dtype(name).newbyteorder("<")


def code_of_numpy_dtype(dtype, what: str) -> int:
    if dtype.name not in _NUMPY_NAMES:
        raise TypeError(f"{what}: numpy dtype {dtype} is not supported by ckptio")
    return _CODE_BY_TORCH_NAME[dtype.name]


# ---- devices -------------------------------------------------------------------------


class Device(NamedTuple):
    kind: str  # "cpu" or "cuda"
    index: Optional[int]

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse_device(device: Any) -> Device:
    """Accepts "cpu", "cuda", "cuda:N", an int N (cuda:N) or a torch.device."""
    if device is None:
        return Device("cpu", None)
    if isinstance(device, bool):
        raise TypeError(f"device must be a str, int or torch.device, not {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device index must be >= 0, not {device}")
        return Device("cuda", device)
    if not isinstance(device, str):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(device, torch.device):
            return parse_device(str(device))
        raise TypeError(f"device must be a str, int or torch.device, not {type(device).__name__}")
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported: ckptio moves data to 'cpu' or 'cuda[:N]'")
    if kind == "cpu":
        if index:
            raise ValueError(f"device {device!r}: cpu takes no index")
        return Device("cpu", None)
    if index:
        if not index.isdigit():
            raise ValueError(f"device {device!r}: bad CUDA device index")
        return Device("cuda", int(index))
    return Device("cuda", None)


def host_kind(value: Any) -> int:
    """MEM_PINNED for page-locked cpu tensors/storages, else MEM_HOST.

    In a child forked after its parent initialised CUDA, torch's
    ``is_pinned()`` raises (CUDA cannot be used there): no memory is pinned
    for such a process, so it is host memory."""
    try:
        return MEM_PINNED if value.is_pinned() else MEM_HOST
    except RuntimeError:
        return MEM_HOST


def resolve_cuda(device: Device) -> Device:
    """Checks CUDA is usable and pins the index (None = the current device)."""
    torch = torch_module()
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {device}: CUDA is not available (torch.cuda.is_available() is False)")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device cuda:{index} does not exist ({torch.cuda.device_count()} CUDA devices)")
    return Device("cuda", index)


def sync_current_stream(devices) -> None:
    """Waits for the current stream of each CUDA device.

    ckptio's GPU transfers run on streams of their own: tensors the caller's
    current stream is still producing (saves), or memory the caching
    allocator handed out while kernels on it may still use the block (loads),
    must be ready first.
    """
    if not devices:
        return
    torch = torch_module()
    for index in sorted(devices):
        torch.cuda.current_stream(index).synchronize()


# ---- what can be written -------------------------------------------------------------------


def _where(what: str, path: Optional[str]) -> str:
    return f"{path}: {what}" if path else what


def check_savable(value: Any, what: str, path: Optional[str] = None, *, any_device: bool = False) -> None:
    """Refuses a torch tensor ckptio cannot write, naming it (and the file)
    and saying what to save instead: nested, sparse and other non-strided
    layouts, meta tensors (no data), quantized tensors, devices other than
    cpu and cuda (unless `any_device`: the caller copies to the cpu)."""
    torch = sys.modules["torch"]
    where = _where(what, path)
    if getattr(value, "is_nested", False):
        raise TypeError(f"{where} is a nested tensor, which a checkpoint file cannot hold: save its components "
                        "(t.unbind()) or a padded copy (t.to_padded_tensor(0))")
    if value.layout != torch.strided:
        kind = "a sparse" if "sparse" in str(value.layout) else "a non-strided"
        raise TypeError(f"{where} is {kind} tensor ({value.layout}); ckptio writes dense tensors only: save "
                        "t.to_dense() instead (the file may be much larger)")
    if value.device.type == "meta":
        raise ValueError(f"{where} is on the meta device and has no data to save: materialise it first (for a "
                         "module, model.to_empty(device='cpu') and then load or initialise its weights)")
    if value.is_quantized:
        raise TypeError(f"{where} is a quantized tensor ({value.dtype}); ckptio stores plain dtypes only: save "
                        "t.dequantize(), or t.int_repr() with t.q_scale() and t.q_zero_point()")
    if not any_device and value.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{where}: tensors on device '{value.device}' cannot be saved (cpu or cuda only); move "
                         "it with t.cpu()")


def check_destination(value: Any, what: str, path: Optional[str] = None) -> None:
    """Refuses a torch tensor ckptio cannot read into (an ``out=`` target),
    naming it: nested, sparse and other non-strided, quantized tensors."""
    torch = sys.modules["torch"]
    where = _where(what, path)
    if getattr(value, "is_nested", False):
        raise TypeError(f"{where}: the destination is a nested tensor; read into a dense tensor")
    if value.layout != torch.strided:
        raise TypeError(f"{where}: the destination is a {value.layout} tensor; read into a dense (strided) tensor")
    if value.is_quantized:
        raise TypeError(f"{where}: the destination is a quantized tensor ({value.dtype}); read into a tensor of "
                        "the file's dtype")


def data_ptr(value: Any, what: str, path: Optional[str] = None) -> int:
    """value.data_ptr(), or an error naming the tensor for the tensors
    check_savable() does not know (subclasses without storage)."""
    try:
        return value.data_ptr()
    except RuntimeError as exc:
        raise TypeError(f"{_where(what, path)}: its memory cannot be read ({exc}); ckptio saves plain dense "
                        f"tensors ({type(value).__module__}.{type(value).__qualname__} given)") from None


def check_utf8(text: str, what: str, path: Optional[str] = None) -> None:
    """Refuses a str UTF-8 cannot encode (a lone surrogate, as file names
    decoded with errors='surrogateescape' hold), naming it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise ValueError(f"{_where(what, path)} {text!r} holds the lone surrogate {bad!r} (U+{ord(bad):04X}) at "
                         f"position {exc.start}, which UTF-8 cannot encode and safetensors headers are UTF-8: "
                         "rename it (format='torch' keeps such names, as torch.save does)") from None


def check_state_dict(flat: Dict[str, Any], path: Optional[str] = None) -> None:
    """The names and tensors of a flattened state dict, before anything
    touches their memory (safetensors)."""
    for name, value in flat.items():
        check_utf8(name, "tensor name", path)
        if is_torch_tensor(value):
            check_savable(value, f"tensor '{name}'", path)


# ---- sources (tensors to write) ---------------------------------------------------------


class Source(NamedTuple):
    name: str
    code: int
    shape: Tuple[int, ...]  # in the file format's terms (F4: elements, not pairs)
    address: int
    nbytes: int
    mem_kind: int
    cuda_index: Optional[int]
    keep: Any  # the object owning the memory: keep it alive for the call


def tensor_source(name: str, value: Any, *, safetensors: bool, path: Optional[str] = None) -> Source:
    """Describes a torch tensor or numpy array for writing.

    Non-contiguous tensors and arrays are copied into contiguous ones here
    (the only copy ckptio makes on save); big-endian numpy arrays are
    converted to little-endian. Errors name the tensor (and `path`).
    """
    what = f"tensor '{name}'"
    if is_torch_tensor(value):
        check_savable(value, what, path)
        if value.is_conj() or value.is_neg():
            value = value.resolve_conj().resolve_neg()
        if not value.is_contiguous():
            value = value.contiguous()
        code = code_of_torch_dtype(value.dtype, _where(what, path))
        shape = tuple(value.shape)
        if code == _F4 and safetensors:
            # torch packs two float4 values per element (float4_e2m1fn_x2);
            # safetensors counts single values: the last dimension doubles.
            if not shape:
                raise ValueError(f"{what}: a 0-d float4_e2m1fn_x2 tensor has no safetensors shape")
            shape = shape[:-1] + (shape[-1] * 2,)
        nbytes = value.numel() * value.element_size()
        if value.device.type == "cuda":
            kind, cuda_index = MEM_CUDA, value.device.index
        else:
            kind, cuda_index = host_kind(value), None
        return Source(name, code, shape, data_ptr(value, what, path) if nbytes else 0, nbytes, kind, cuda_index,
                      value)
    if is_numpy_array(value):
        np = sys.modules["numpy"]
        if value.dtype.byteorder == ">" or (value.dtype.byteorder == "=" and sys.byteorder == "big"):
            value = value.astype(value.dtype.newbyteorder("<"))
        value = np.ascontiguousarray(value)
        code = code_of_numpy_dtype(value.dtype, _where(what, path))
        return Source(name, code, tuple(int(d) for d in value.shape), value.ctypes.data if value.nbytes else 0,
                      int(value.nbytes), MEM_HOST, None, value)
    raise TypeError(f"{_where(what, path)}: expected a torch.Tensor or numpy.ndarray, got {type(value).__name__}")


def byte_range(value: Any, what: str = "tensor") -> Optional[Tuple[Any, int, int]]:
    """(memory space, first byte, end byte) a tensor/array spans, None if empty."""
    if is_torch_tensor(value):
        if value.numel() == 0:
            return None
        # torch strides are never negative: the view spans from data_ptr to its last element.
        span = 1 + sum((s - 1) * st for s, st in zip(value.shape, value.stride()))
        start = data_ptr(value, what)
        return (str(value.device), start, start + span * value.element_size())
    if is_numpy_array(value):
        if value.size == 0:
            return None
        np = sys.modules["numpy"]
        lo, hi = np.byte_bounds(value) if hasattr(np, "byte_bounds") else np.lib.array_utils.byte_bounds(value)
        return ("cpu", lo, hi)
    return None


def find_overlaps(items: Dict[str, Any]) -> List[List[str]]:
    """Groups of names whose memory overlaps (tensors sharing storage bytes)."""
    ranges = []
    for name, value in items.items():
        r = byte_range(value, f"tensor '{name}'")
        if r is not None:
            ranges.append((r[0], r[1], r[2], name))
    ranges.sort()
    groups: List[List[str]] = []
    current: List[str] = []
    cur_space, cur_end = None, 0
    for space, start, end, name in ranges:
        if current and space == cur_space and start < cur_end:
            current.append(name)
            cur_end = max(cur_end, end)
            continue
        if len(current) > 1:
            groups.append(current)
        current, cur_space, cur_end = [name], space, end
    if len(current) > 1:
        groups.append(current)
    return groups


# ---- destinations (tensors to read into) ---------------------------------------------------


class Target(NamedTuple):
    value: Any  # the tensor or array that receives the bytes
    address: int
    capacity: int
    mem_kind: int


def torch_shape(code: int, shape: Tuple[int, ...], what: str) -> Tuple[int, ...]:
    """A file shape in torch terms (safetensors F4 counts single values)."""
    if code == _F4:
        if not shape or shape[-1] % 2:
            raise ValueError(f"{what}: F4 tensor of shape {list(shape)} cannot be packed into float4_e2m1fn_x2 "
                             "(the last dimension must be even)")
        return shape[:-1] + (shape[-1] // 2,)
    return shape


def new_target(code: int, shape: Tuple[int, ...], device: Device, framework: str, what: str, *,
               safetensors: bool = True, pin_memory: bool = False) -> Target:
    """Allocates an uninitialised destination (torch.empty / numpy.empty)."""
    if framework == "numpy":
        import numpy as np

        arr = np.empty(shape, dtype=numpy_dtype(code, what))
        return Target(arr, arr.ctypes.data if arr.nbytes else 0, int(arr.nbytes), MEM_HOST)
    torch = torch_module()
    tshape = torch_shape(code, shape, what) if safetensors else shape
    dt = torch_dtype(code, what)
    if device.kind == "cuda":
        t = torch.empty(tshape, dtype=dt, device=f"cuda:{device.index}")
        kind = MEM_CUDA
    else:
        t = torch.empty(tshape, dtype=dt, pin_memory=pin_memory)
        kind = MEM_PINNED if pin_memory else MEM_HOST
    nbytes = t.numel() * t.element_size()
    return Target(t, t.data_ptr() if nbytes else 0, nbytes, kind)


def existing_target(value: Any, code: int, shape: Tuple[int, ...], what: str, path: str, *,
                    safetensors: bool = True) -> Target:
    """Checks a caller-provided destination against the file's tensor."""
    if is_torch_tensor(value):
        check_destination(value, what, path)
        tshape = torch_shape(code, shape, what) if safetensors else tuple(shape)
        if code_of_torch_dtype(value.dtype, what) != code:
            raise TypeError(f"{path}: {what} is {dtype_name(code)} in the file but the destination tensor is "
                            f"{value.dtype}")
        if tuple(value.shape) != tshape:
            raise ValueError(f"{path}: {what} has shape {list(tshape)} in the file but the destination tensor has "
                             f"{list(value.shape)}")
        if not value.is_contiguous():
            raise ValueError(f"{path}: {what}: the destination tensor must be contiguous")
        if value.device.type == "cuda":
            kind = MEM_CUDA
        elif value.device.type == "cpu":
            kind = host_kind(value)
        else:
            raise ValueError(f"{path}: {what}: cannot read into a tensor on {value.device}")
        nbytes = value.numel() * value.element_size()
        return Target(value, value.data_ptr() if nbytes else 0, nbytes, kind)
    if is_numpy_array(value):
        if code_of_numpy_dtype(value.dtype, what) != code:
            raise TypeError(f"{path}: {what} is {dtype_name(code)} in the file but the destination array is "
                            f"{value.dtype}")
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"{path}: {what} has shape {list(shape)} in the file but the destination array has "
                             f"{list(value.shape)}")
        if not value.flags.c_contiguous or not value.flags.writeable:
            raise ValueError(f"{path}: {what}: the destination array must be C-contiguous and writeable")
        if value.dtype.byteorder == ">":
            raise ValueError(f"{path}: {what}: the destination array must be little-endian")
        return Target(value, value.ctypes.data if value.nbytes else 0, int(value.nbytes), MEM_HOST)
    raise TypeError(f"{path}: {what}: destination must be a torch.Tensor or numpy.ndarray, "
                    f"not {type(value).__name__}")


# ---- nesting ---------------------------------------------------------------------------------


def flatten(state_dict: Any, sep: str = ".") -> Dict[str, Any]:
    """{"a": {"b": t}} -> {"a.b": t}; refuses non-str keys and name collisions."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, not {type(state_dict).__name__}")
    flat: Dict[str, Any] = {}

    def walk(prefix: str, d: dict) -> None:
        for k, v in d.items():
            if not isinstance(k, str):
                raise TypeError(f"state_dict keys must be str, found {k!r} under '{prefix or '<root>'}'")
            name = f"{prefix}{sep}{k}" if prefix else k
            if isinstance(v, dict):
                walk(name, v)
                continue
            if name in flat:
                raise ValueError(f"state_dict: nested key '{name}' collides with another key once flattened")
            flat[name] = v

    walk("", state_dict)
    return flat
