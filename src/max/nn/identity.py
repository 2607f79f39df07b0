"""``Identity``: a layer that returns its input unchanged (a placeholder in configurable models)."""

from __future__ import annotations

from typing import Any

from max.nn.layer import Module

__all__ = ["Identity"]


class Identity(Module):
    """Passes its first argument through unchanged; constructor and extra call arguments are ignored."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return x
