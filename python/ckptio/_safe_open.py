"""``ckptio.safe_open``: a drop-in for ``safetensors.safe_open``.

Code written for safetensors switches with one import::

    from ckptio import safe_open          # was: from safetensors import safe_open
    with safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
        for name in f.keys():
            w = f.get_tensor(name)
        part = f.get_slice("embed.weight")[:, :1024]

Same methods and results as safetensors 0.8 (``keys`` sorted, ``offset_keys``
in file order, ``metadata`` a dict or None, ``get_tensor``, ``get_tensors``
in offset order, ``get_slice`` with ``get_shape``/``get_dtype``/indexing, the
context manager, "File is closed" after it); the bytes move through
libckptio (parallel, O_DIRECT where it pays, straight into GPU memory) and a
slice reads only what it covers. Beyond safetensors: a Hugging Face
directory or its ``*.index.json`` opens as one file over all its shards.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._api import CheckpointFile, PathLike


class safe_open(CheckpointFile):  # noqa: N801 - the name safetensors uses
    """``safe_open(filename, framework="pt", device="cpu")``, as safetensors'.

    ``framework``: "pt"/"torch"/"pytorch" or "np"/"numpy" (other frameworks
    are a ValueError). ``device``: "cpu", "cuda", "cuda:N" or an int N.
    """

    def __init__(self, filename: PathLike, framework: str = "pt", device: Any = "cpu", *, engine=None,
                 allow_symlinks: bool = False):
        if framework == "pytorch":
            framework = "pt"
        super().__init__(filename, framework, "cpu" if device is None else device, engine=engine,
                         allow_symlinks=allow_symlinks)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("File is closed")

    def metadata(self) -> Optional[Dict[str, str]]:
        """The ``__metadata__`` dict, or None when the file has none (safetensors' rule)."""
        self._check_open()
        return dict(self._metadata) if self._has_metadata else None

    def keys(self) -> List[str]:
        self._check_open()
        return super().keys()

    def offset_keys(self) -> List[str]:
        self._check_open()
        return super().offset_keys()

    def get_tensor(self, name: str, device: Any = None, *, out: Any = None):
        self._check_open()
        return super().get_tensor(name, device, out=out)

    def get_tensors(self, names=None, device: Any = None, *, out=None) -> Dict[str, Any]:
        """Every tensor, keyed in offset order like safetensors' (one engine plan)."""
        self._check_open()
        return super().get_tensors(self.offset_keys() if names is None and out is None else names, device, out=out)

    def get_slice(self, name: str):
        self._check_open()
        return super().get_slice(name)

    def __repr__(self) -> str:
        return f"<ckptio.safe_open {self.path!r} ({'closed' if self.closed else f'{len(self)} tensors'})>"
