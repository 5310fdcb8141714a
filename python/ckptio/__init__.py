"""ckptio: move tensor checkpoints between GPU/host memory and storage at disk speed.

A thin Python layer over libckptio (a C library): the formats (safetensors,
...), the I/O engine (io_uring / pread, O_DIRECT, parallel workers) and the
GPU path all run in C with the GIL released; this package only adapts torch
tensors and numpy arrays.

    import ckptio
    ckptio.save(model.state_dict(), "model.safetensors")   # "model.pt": torch.save format
    sd = ckptio.load("model.safetensors", device="cuda")
    ckptio.save_model(model, "model.safetensors")           # tied weights: one name kept
    ckptio.load_model(model, "model.safetensors")           # ties restored
    with ckptio.open("model.safetensors") as f:
        w = f.get_tensor("layer.0.weight", device="cuda:0")
    sd = ckptio.load("model_dir/", device="cuda")           # Hugging Face directory, all shards
    ckptio.convert("ckpt/step100", "model_dir/", to="hf")    # any format into any other
    with ckptio.safe_open("model_dir/", framework="pt") as f:  # drop-in for safetensors.safe_open
        part = f.get_slice("embed.weight")[:, :1024]         # reads only those bytes

Errors are :class:`CkptioError` (an ``OSError``) carrying the library's
message, which names the file, the offset and what was wrong.
"""

from ._errors import (  # noqa: F401  (must come first: the extension imports it)
    CkptioError,
    CkptioFileExistsError,
    CkptioFileNotFoundError,
    CkptioPermissionError,
)
from . import _ckptio
from ._ckptio import Engine, default_engine
from ._api import CheckpointFile, StorageInfo, TensorInfo, load, open, prepare_gpu, save, save_torch
from ._gds import GdsFile, gds_deregister_buffer, gds_register_buffer
from ._module_io import load_model, save_model
from ._model import Slice, SliceRequest
from ._distributed import LoadStats, last_load_stats
from ._safe_open import safe_open
from ._manager import CheckpointManager, SkippedSave
from ._snapshot import Snapshot, Snapshots
from ._convert import convert

__version__: str = _ckptio.version()


def __getattr__(name: str):
    # ckptio.dcp builds on torch.distributed: it is imported on first use, so
    # `import ckptio` (and the `ckptio` command's launcher) never imports torch.
    if name == "dcp":
        import importlib

        return importlib.import_module(".dcp", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def option_names() -> list:
    """Names of the engine settings, for ``Engine(**settings)`` and ``Engine.set``."""
    return _ckptio.option_names()


__all__ = [
    "__version__",
    "save",
    "load",
    "open",
    "safe_open",
    "CheckpointFile",
    "Slice",
    "SliceRequest",
    "LoadStats",
    "last_load_stats",
    "TensorInfo",
    "StorageInfo",
    "save_torch",
    "prepare_gpu",
    "save_model",
    "load_model",
    "CheckpointManager",
    "SkippedSave",
    "Snapshots",
    "Snapshot",
    "convert",
    "GdsFile",
    "gds_register_buffer",
    "gds_deregister_buffer",
    "Engine",
    "default_engine",
    "option_names",
    "CkptioError",
    "CkptioFileNotFoundError",
    "CkptioPermissionError",
    "CkptioFileExistsError",
]
