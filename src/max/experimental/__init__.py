"""Experimental APIs: eager/lazy tensors (``tensor``), graph ops usable on them
(``functional``), random tensor factories (``random``), modules over tensors
(``nn``) and distributed-tensor sharding (``sharding``).

These APIs may change between releases.
"""

from max.experimental import functional, random, tensor  # noqa: F401
from max.experimental.tensor import Tensor  # noqa: F401

__all__ = ["functional", "nn", "random", "sharding", "tensor", "Tensor"]


def __getattr__(name: str):  # nn and sharding import on first use
    if name in ("nn", "sharding"):
        import importlib

        return importlib.import_module(f"max.experimental.{name}")
    raise AttributeError(f"module 'max.experimental' has no attribute {name!r}")
