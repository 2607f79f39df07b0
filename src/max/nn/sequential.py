"""``Sequential``: call each layer on the previous layer's output."""

from __future__ import annotations

from typing import Any, Sequence

from max.nn.layer import Layer, LayerList

__all__ = ["Sequential"]


class Sequential(LayerList):
    """A stack of layers; ``Sequential([a, b])(x) == b(a(x))``.  Weights are named ``"0.weight"``, ..."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        super().__init__(layers)

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        out = x
        for i, layer in enumerate(self.layers):
            out = layer(out, *args, **kwargs) if i == 0 else layer(out)
        return out
