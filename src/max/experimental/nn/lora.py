"""Low-rank adapters over eager modules: ``TransparentModule``, ``LoRA``, ``lora_layers`` and
``lora_parameters``.

A ``TransparentModule`` wraps one module (``self.module``) without adding a level to qualified
names: the wrapped module's parameters and children appear under the wrapper's own name, so a
checkpoint of the plain model loads into the wrapped one unchanged.  ``LoRA`` is such a wrapper
around a ``Linear``: ``y = base(x) + (alpha / rank) * (x @ lora_A.T) @ lora_B.T`` with
``lora_A`` ``[rank, in_dim]`` (uniform, PyTorch's Linear init) and ``lora_B`` ``[out_dim, rank]``
(zeros, so a fresh adapter leaves the output unchanged).
"""

from __future__ import annotations

import math
from typing import Any, Iterator

from max.dtype import DType
from max.experimental import random
from max.experimental.nn.module import Module
from max.experimental.tensor import Tensor

__all__ = ["LoRA", "TransparentModule", "lora_layers", "lora_parameters"]


class TransparentModule(Module):
    """Wraps ``module`` without a level of its own in the qualified names of its parameters.

    ``forward`` calls the wrapped module; subclasses add behaviour around it.  The wrapper's own
    tensors (e.g. adapter weights) are parameters next to the wrapped module's.
    """

    def __init__(self, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__}: module must be a Module, got {type(module).__name__}")
        self.module = module

    @property
    def local_parameters(self) -> Iterator[tuple[str, Tensor]]:
        yield from Module.local_parameters.fget(self)  # type: ignore[attr-defined]
        yield from self.module.local_parameters

    @property
    def children(self) -> Iterator[tuple[str, Module]]:
        for name, child in Module.children.fget(self):  # type: ignore[attr-defined]
            if child is not self.module:
                yield name, child
        yield from self.module.children

    def _apply(self, prefix: str, f: Any) -> None:  # keep name-based transforms consistent with the names
        for name, t in list(Module.local_parameters.fget(self)):  # type: ignore[attr-defined]
            setattr(self, name, f(prefix + name, t))
        self.module._apply(prefix, f)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class LoRA(TransparentModule):
    """A rank-``rank`` adapter on a ``Linear`` (or any module with a ``[out, in]`` ``weight``).

    ``scale = alpha / rank`` (``alpha`` defaults to ``rank``: scale 1).  The base module's
    parameters keep their names (``weight``, ``bias``); the adapter adds ``lora_A`` and ``lora_B``.
    """

    def __init__(self, module: Module, rank: int, alpha: float | None = None, *, dtype: DType | None = None,
                 device: Any = None) -> None:
        super().__init__(module)
        weight = getattr(module, "weight", None)
        if not isinstance(weight, Tensor) or weight.rank != 2:
            raise TypeError(f"LoRA: the wrapped module needs a rank-2 weight [out_dim, in_dim], got "
                            f"{type(module).__name__}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"LoRA: rank must be a positive int, got {rank!r}")
        n_out, n_in = (int(d) for d in weight.shape)
        dtype = weight.dtype if dtype is None else dtype
        device = weight.device if device is None else device
        bound = 1.0 / math.sqrt(n_in)
        self.rank = rank
        self.alpha = float(rank if alpha is None else alpha)
        self.lora_A = random.uniform([rank, n_in], range=(-bound, bound), dtype=dtype, device=device)
        self.lora_B = Tensor.zeros([n_out, rank], dtype=dtype, device=device)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def forward(self, x: Any) -> Any:
        return self.module(x) + (x @ self.lora_A.T) @ self.lora_B.T * self.scale


def lora_layers(module: Module) -> Iterator[tuple[str, LoRA]]:
    """``(qualified name, layer)`` for ``module`` itself (name ``""``) and every descendant that is a ``LoRA``."""
    if isinstance(module, LoRA):
        yield "", module
    for name, m in _walk(module, ""):
        if isinstance(m, LoRA):
            yield name, m


def _walk(module: Module, prefix: str) -> Iterator[tuple[str, Module]]:
    # Qualified names of modules as parameters name them (a TransparentModule adds no level).
    transparent = isinstance(module, TransparentModule)
    own = Module.children.fget(module) if transparent else module.children  # type: ignore[attr-defined]
    for name, child in own:
        q = prefix.rstrip(".") if transparent and child is module.module else f"{prefix}{name}"
        yield q, child
        yield from _walk(child, q + "." if q else "")


def lora_parameters(module: Module) -> Iterator[tuple[str, Tensor]]:
    """``(qualified name, tensor)`` for the adapter tensors (``lora_A``, ``lora_B``) of every ``LoRA`` in
    ``module``; the names are those ``module.parameters`` gives them."""
    ids = {id(t) for _n, layer in lora_layers(module) for t in (layer.lora_A, layer.lora_B)}
    for name, t in module.parameters:
        if id(t) in ids:
            yield name, t
