"""``PytorchWeights``: ``.bin``/``.pt``/``.pth`` state dicts, loaded without running code.

Files are read only with ``torch.load(path, weights_only=True, mmap=True)``
(the restricted unpickler: tensors, containers and primitive types).  A file
whose pickle refers to anything else (classes, functions -- i.e. code) is
refused with an error naming the file; nothing in it is executed.  Legacy
(pre-zip) files cannot be memory-mapped and are read with ``weights_only``
alone.  Nested dicts are flattened into dotted names; non-tensor entries are
ignored.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

from max.dtype import DType
from max.graph.weights.protocol import TensorInfo, WeightStore, _WeightsBase, progress

__all__ = ["PytorchWeights", "UnsafeCheckpointError", "load_state_dict"]


class UnsafeCheckpointError(ValueError):
    """A PyTorch checkpoint whose pickle contains code (refused, never executed)."""


def _unsafe_globals(path: str) -> list[str]:
    """The globals a checkpoint's pickle names that a weights-only load does not allow (torch's own
    scan of the pickle, which runs nothing); [] when it cannot tell (not a zip checkpoint, damaged)."""
    try:
        from torch.serialization import get_unsafe_globals_in_checkpoint

        return [str(g) for g in get_unsafe_globals_in_checkpoint(path)]
    except Exception:  # noqa: BLE001 - unreadable: reported as corrupt by the caller
        return []


def load_state_dict(path: str) -> dict[str, torch.Tensor]:
    """The flattened ``name -> tensor`` dict of a PyTorch checkpoint, loaded safely."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"PyTorch checkpoint {path} does not exist")
    if os.path.getsize(path) == 0:
        raise ValueError(f"PyTorch checkpoint {path} is empty")

    def _load(mmap: bool) -> Any:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)

    try:
        try:
            obj = _load(True)
        except RuntimeError:  # e.g. the legacy (non-zip) format cannot be memory-mapped: read it instead
            obj = _load(False)
    except pickle.UnpicklingError as e:
        unsafe = _unsafe_globals(path)
        if unsafe:
            raise UnsafeCheckpointError(
                f"PyTorch checkpoint {path} contains Python objects or code that a weights-only load refuses "
                f"({', '.join(unsafe[:5])}); it was not executed. Convert it to safetensors with a trusted tool, "
                f"or load it yourself if you trust it"
            ) from None
        raise ValueError(f"PyTorch checkpoint {path} is corrupt or truncated, or not a weights-only checkpoint "
                         f"({type(e).__name__})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise ValueError(f"PyTorch checkpoint {path} is corrupt or truncated, or not a weights-only checkpoint "
                         f"({type(e).__name__})") from None

    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, o: Any) -> None:
        if isinstance(o, torch.Tensor):
            flat[prefix] = o
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)

    if isinstance(obj, torch.Tensor):
        raise ValueError(f"PyTorch checkpoint {path} holds a single tensor, not a state dict")
    if not isinstance(obj, dict):
        raise ValueError(f"PyTorch checkpoint {path} holds a {type(obj).__name__}, not a state dict")
    walk("", obj)
    return flat


class _PytorchStore(WeightStore):
    format_name = "PyTorch checkpoint"

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.tensors: dict[str, torch.Tensor] = {}
        total = sum(os.path.getsize(p) for p in paths if os.path.exists(p))
        bar = progress(total, "Loading PyTorch checkpoint", len(paths), unit="file")
        infos: dict[str, TensorInfo] = {}
        tensors: dict[str, torch.Tensor] = {}
        try:
            for p in paths:
                sd = load_state_dict(p)
                for name, t in sd.items():
                    if name in infos:
                        raise ValueError(f"PyTorch checkpoint {p}: tensor {name!r} is also in {infos[name].file}")
                    try:
                        dt = DType.from_torch(t.dtype)
                    except ValueError:
                        raise ValueError(f"PyTorch checkpoint {p}: tensor {name!r} has unsupported dtype {t.dtype}") from None
                    infos[name] = TensorInfo(name, dt, tuple(int(d) for d in t.shape), p)
                    tensors[name] = t
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        self.infos = infos
        self.tensors = tensors

    def tensor(self, name: str) -> torch.Tensor:
        return self.tensors[name]


class PytorchWeights(_WeightsBase):
    """Weights from PyTorch state-dict files (``torch.load(weights_only=True, mmap=True)``)."""

    def __init__(self, filepath: Any, tensor_infos: dict[str, Any] | None = None, prefix: str = "",
                 allocated: dict[str, Any] | None = None) -> None:
        paths = [os.fspath(p) for p in filepath] if isinstance(filepath, (list, tuple)) else [os.fspath(filepath)]
        if not paths:
            raise ValueError("PytorchWeights: no files given")
        store = _PytorchStore(paths)
        if tensor_infos is not None:
            keep = set(tensor_infos)
            store.infos = {k: v for k, v in store.infos.items() if k in keep}
        self._init_base(store, prefix, allocated)
