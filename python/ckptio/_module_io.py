"""``ckptio.save_model`` / ``ckptio.load_model``: torch modules with tied
weights, as ``safetensors.torch.save_model`` / ``load_model`` handle them.

safetensors cannot express two names for one memory (GPT-2's ``lm_head``
tied to ``wte``), so a save keeps one name per group of tensors sharing a
storage, by safetensors' own rule (``_remove_duplicate_names``: among the
names that cover the whole storage, the first in sorted order; on load the
names found in the file are preferred) and records each dropped name in
``__metadata__`` as ``{dropped: kept}``. A load restores the ties by
writing into the model's own tensors, which still share their memory, and
reports the dropped names neither as missing nor as unexpected. Files are
byte-identical to safetensors' with ``align=8``.

Speed: where the model's tensor matches the file's (dtype, shape,
contiguous, on cpu or cuda) and the model loads the standard way (no module
overrides ``_load_from_state_dict``, no load_state_dict hooks), the bytes are
read straight into the model's parameters and buffers (GPU memory
included), in one engine plan; everything else goes through
``Module.load_state_dict`` as safetensors does, with its checks and errors.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from . import _adapt, _api


# ---- which names share memory (safetensors.torch's rule) -----------------------------------


def _storage_ptr(t) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0  # meta and other storage-less tensors share nothing


def _storage_nbytes(t) -> int:
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return 0


def _end_ptr(t) -> int:
    if t.nelement():
        return t.view(-1)[-1].data_ptr() + t.element_size()
    return t.data_ptr()


def shared_groups(state_dict: Dict[str, Any]) -> List[Set[str]]:
    """Names grouped by storage (device, address, size), each group split
    where its tensors' byte ranges do not overlap (disjoint slices of one
    storage are not shared); singletons included."""
    by_storage: Dict[Tuple[Any, int, int], Set[str]] = collections.defaultdict(set)
    for name, t in state_dict.items():
        if t.device.type != "meta" and _storage_ptr(t) != 0 and _storage_nbytes(t) != 0:
            by_storage[(t.device, _storage_ptr(t), _storage_nbytes(t))].add(name)
    groups: List[Set[str]] = []
    # First-seen order (safetensors sorts these disjoint sets, which keeps
    # it): it decides the order of the {dropped: kept} metadata entries.
    for names in by_storage.values():
        if len(names) < 2:
            groups.append(names)
            continue
        areas = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in names)
        _, last_stop, first = areas[0]
        groups.append({first})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                groups.append({name})
            else:
                groups[-1].add(name)
            last_stop = stop
    return groups


def _is_complete(t) -> bool:
    return t.data_ptr() == _storage_ptr(t) and t.nelement() * t.element_size() == _storage_nbytes(t)


def names_to_drop(state_dict: Dict[str, Any], *, preferred_names: Iterable[str] = ()) -> Dict[str, List[str]]:
    """{kept name: [names dropped for it]} for every group of names sharing
    memory: kept is the first (sorted) name covering the whole storage, one of
    `preferred_names` if any qualifies."""
    preferred = set(preferred_names)
    drop: Dict[str, List[str]] = collections.defaultdict(list)
    for group in shared_groups(state_dict):
        complete = sorted(n for n in group if _is_complete(state_dict[n]))
        if not complete:
            raise RuntimeError(f"cannot save the tensors {sorted(group)}: they share memory and none covers the whole "
                               "storage, so keeping one would not keep the others' bytes; clone them first")
        keep = complete[0]
        chosen = [n for n in complete if n in preferred]
        if chosen:
            keep = chosen[0]
        for name in sorted(group):
            if name != keep:
                drop[keep].append(name)
    return drop


# ---- save ----------------------------------------------------------------------------------


def save_model(model, path=None, metadata: Optional[Dict[str, str]] = None, force_contiguous: bool = True, *,
               format: Optional[str] = None, align: Optional[int] = None, checksums: bool = False, engine=None,
               progress: Any = None) -> Optional[bytes]:
    """Saves ``model.state_dict()``; tied weights keep one name.

    safetensors (the default unless `path` ends in .pt, .pth, .bin or .ckpt):
    as ``safetensors.torch.save_model`` does, each group of names sharing
    memory keeps one and ``metadata`` gets ``{dropped: kept}`` for the others
    (a caller's entry of that key is kept). torch format: the state dict as
    is (torch files keep shared storages themselves). `path` None returns
    bytes. Other arguments as for :func:`ckptio.save`.
    """
    state_dict = model.state_dict()
    spath = None if path is None else os.fspath(path)
    fmt = _api.format_for_path(spath, format)
    if fmt in ("torch", "pt", "pytorch"):
        return _api.save(state_dict, spath, fmt, metadata, align=align, checksums=checksums, engine=engine,
                         progress=progress)
    for kept, dropped in names_to_drop(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            if name not in metadata:
                metadata[name] = kept
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    return _api.save(state_dict, spath, fmt, metadata, align=align, checksums=checksums, engine=engine,
                     progress=progress)


# ---- load ----------------------------------------------------------------------------------


def _loads_plainly(model) -> bool:
    """No module changes how load_state_dict copies (then reading straight
    into the model's tensors is what load_state_dict would do)."""
    torch = _adapt.torch_module()
    base = torch.nn.Module._load_from_state_dict
    for m in model.modules():
        if type(m)._load_from_state_dict is not base:
            return False
        if getattr(m, "_load_state_dict_pre_hooks", None) or getattr(m, "_load_state_dict_post_hooks", None):
            return False
    return True


def _direct_targets(f: "_api.CheckpointFile", model_sd: Dict[str, Any], names: List[str]) -> Dict[str, Any]:
    """The file's tensors that can be read straight into the model's: same
    dtype and shape, contiguous, on cpu or cuda, no two overlapping."""
    st = f.format == "safetensors"
    out: Dict[str, Any] = {}
    for name in names:
        t = model_sd.get(name)
        e = f._entry(name)
        if t is None or not e.contiguous or t.device.type not in ("cpu", "cuda") or t.numel() == 0:
            continue
        try:
            _adapt.existing_target(t, e.code, e.shape, f"tensor '{name}'", f.path, safetensors=st)
        except (TypeError, ValueError):
            continue  # load_state_dict converts, or names the mismatch
        out[name] = t.detach()
    # Names tied in the model and all present in the file: read one, copy the rest.
    for group in _adapt.find_overlaps(out):
        for name in sorted(group)[1:]:
            del out[name]
    return out


def load_model(model, path, strict: bool = True, device: Any = "cpu", *, engine=None,
               progress: Any = None) -> Tuple[Set[str], List[str]]:
    """Loads a checkpoint into `model` (``safetensors.torch.load_model``'s
    semantics), ties included: names dropped by :func:`save_model` are
    restored through the memory they share in the model.

    Returns ``(missing, unexpected)`` as safetensors does (a set and a list):
    model names the file did not fill, file names the model has no place for
    (and, in a safetensors file, a second name of a tie). torch.save files
    may hold both names of a tie, as ``torch.save(model.state_dict())``
    writes them.
    With ``strict=True`` either is a RuntimeError listing them, as torch's
    ``load_state_dict`` words it. `device` is where tensors that cannot be
    read straight into the model go before ``load_state_dict`` copies them.
    `path`: a file, a Hugging Face directory, bytes or a file object.
    """
    if _api._memory.is_memory(path):
        label = "load bytes" if isinstance(path, (bytes, bytearray, memoryview)) else "load stream"
        with _api._progress.reporting(progress, label), _api._memory.readable_path(path) as mpath:
            return load_model(model, mpath, strict, device, engine=engine)
    model_sd = model.state_dict()
    with _api.CheckpointFile(path, "pt", device, engine=engine) as f:
        file_names = f.keys()
        # torch files keep shared storages: both names of a tie are at home there.
        ties_in_file_unexpected = f.format == "safetensors"
        drop = names_to_drop(model_sd, preferred_names=file_names)
        direct = _direct_targets(f, model_sd, file_names) if _loads_plainly(model) else {}
        rest = [n for n in file_names if n not in direct]
        loaded = f.get_tensors(list(direct) + rest, out=direct, progress=progress) if file_names else {}
    # The file's order, as load_file returns it to load_state_dict.
    state_dict = collections.OrderedDict((n, loaded[n]) for n in file_names if n not in direct)
    missing_l, unexpected = model.load_state_dict(state_dict, strict=False)
    if direct:
        # Plain modules: missing is every model name the file lacks, in the
        # model's order, as load_state_dict of the whole file would say.
        present = set(file_names)
        missing_l = [n for n in model_sd if n not in present]
    missing = set(missing_l)
    for dropped in drop.values():
        for name in dropped:
            if name in missing:
                missing.remove(name)  # filled through the memory it shares
            elif ties_in_file_unexpected:
                unexpected.append(name)  # safetensors' rule: the file should hold one name per tie
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, list(unexpected)
