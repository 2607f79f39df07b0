"""``MissingLayer``: stands where a model has no layer (e.g. a checkpoint without it)."""

from __future__ import annotations

from typing import Any

from max.nn.layer import Module

__all__ = ["MissingLayer"]


class MissingLayer(Module):
    """A layer slot that holds no layer: it has no weights, so a model keeps its structure (and its
    other weights load) while the slot is empty, and calling it raises ``NotImplementedError`` naming
    the slot and why it is missing."""

    def __init__(self, name: str = "", reason: str = "") -> None:
        super().__init__()
        for arg, v in (("name", name), ("reason", reason)):
            if not isinstance(v, str):
                raise TypeError(f"MissingLayer: {arg} must be a str, got {type(v).__name__}")
        self.name = name
        self.reason = reason

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        what = f"layer {self.name!r}" if self.name else "this layer"
        why = f": {self.reason}" if self.reason else ""
        raise NotImplementedError(f"MissingLayer: {what} is missing from the model and cannot be called{why}")

    def __repr__(self) -> str:
        return f"MissingLayer(name={self.name!r})" if self.name else "MissingLayer()"
