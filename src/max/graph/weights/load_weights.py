"""``WeightsFormat``, ``weights_format(paths)`` and ``load_weights(paths)``."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any, Sequence

from max.graph.weights.protocol import Weights

__all__ = ["WeightsFormat", "load_weights", "weights_format"]


class WeightsFormat(str, enum.Enum):
    """Checkpoint file formats."""

    gguf = "gguf"
    safetensors = "safetensors"
    pytorch = "pytorch"


_EXT = {
    ".gguf": WeightsFormat.gguf,
    ".safetensors": WeightsFormat.safetensors,
    ".bin": WeightsFormat.pytorch,
    ".pt": WeightsFormat.pytorch,
    ".pth": WeightsFormat.pytorch,
}


def _format_of(path: Any) -> WeightsFormat | None:
    name = os.fspath(path).lower()
    if name.endswith(".safetensors.index.json"):
        return WeightsFormat.safetensors
    return _EXT.get(os.path.splitext(name)[1])


def weights_format(weight_paths: Sequence[Any]) -> WeightsFormat:
    """The format shared by all ``weight_paths`` (by extension).

    ValueError for an empty list, mixed formats or an unknown extension.
    """
    if isinstance(weight_paths, (str, os.PathLike)):
        weight_paths = [weight_paths]
    paths = list(weight_paths)
    if not paths:
        raise ValueError("weights_format: no weight paths given")
    found: dict[WeightsFormat, Any] = {}
    for p in paths:
        f = _format_of(p)
        if f is None:
            raise ValueError(
                f"weights_format: {os.fspath(p)!r} has an unsupported extension; expected one of "
                f"{sorted(_EXT)} (or a model.safetensors.index.json)"
            )
        found.setdefault(f, p)
    if len(found) > 1:
        desc = ", ".join(f"{f.value} ({os.fspath(p)})" for f, p in found.items())
        raise ValueError(f"weights_format: paths mix formats: {desc}")
    return next(iter(found))


def load_weights(paths: Sequence[Path | str]) -> Weights:
    """A Weights object for checkpoint ``paths`` (format picked by extension)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    fmt = weights_format(paths)
    if fmt is WeightsFormat.safetensors:
        from max.graph.weights.safetensors import SafetensorWeights

        return SafetensorWeights(paths)
    if fmt is WeightsFormat.gguf:
        if len(paths) != 1:
            raise ValueError(f"load_weights: GGUF checkpoints are a single file, got {len(paths)}: {paths}")
        from max.graph.weights.gguf import GGUFWeights

        return GGUFWeights(paths[0])
    from max.graph.weights.pytorch import PytorchWeights

    return PytorchWeights(paths)
