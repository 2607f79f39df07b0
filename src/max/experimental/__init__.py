"""Experimental APIs: eager/lazy tensors (``tensor``), graph ops usable on them
(``functional``) and random tensor factories (``random``).

These APIs may change between releases.
"""

from max.experimental import functional, random, tensor  # noqa: F401
from max.experimental.tensor import Tensor  # noqa: F401

__all__ = ["functional", "random", "tensor", "Tensor"]
