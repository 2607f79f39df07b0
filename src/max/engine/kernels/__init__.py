"""The kernel table: one torch implementation per graph op, keyed by op name.

Each family module (``elementwise``, ``reduction``, ...) mirrors
``max.graph.ops.<family>`` and registers its kernels with :func:`kernel`.
A kernel is called as ``fn(*operand_tensors, **attrs)`` where ``attrs`` are
the node's attributes with dims resolved to ints, ``DType`` converted to
``torch.dtype`` and ``DeviceRef`` to ``torch.device``; chain operands are
dropped.  It returns one tensor, or a tuple for multi-result ops.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

_FAMILIES = (
    "elementwise",
    "reduction",
    "shape",
    "indexing",
    "linalg",
    "norm",
    "creation",
    "device",
    "debug",
    "control_flow",
    "buffer",
    "custom",
    "recurrent",
    "fused",
    "quantized",
    "ragged",
    "decoder",
    "moe", "lora", "float8", "attention",
    "conv", "pool", "signal", "distributed", "complex", "vision", "random",
)


@dataclass(frozen=True)
class KernelSpec:
    name: str
    fn: Callable
    pure: bool = True  # False: never constant-folded, CSE'd or removed when unused
    foldable: bool = True  # False: pure but not worth/safe folding at compile time
    # prepare(operands, **attrs) -> callable(*dynamic operands) or None: specialise the kernel once at
    # load for a node whose operands are partly constants (weights); ``operands`` has the bound tensor
    # at each constant position and None elsewhere.  None: call ``fn`` as usual.
    prepare: Callable | None = None


KERNELS: dict[str, KernelSpec] = {}
_loaded = False


def kernel(name: str, *, pure: bool = True, foldable: bool = True) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the kernel of op ``name``."""

    def deco(fn: Callable) -> Callable:
        KERNELS[name] = KernelSpec(name, fn, pure, foldable)
        return fn

    return deco


def register(name: str, fn: Callable, *, pure: bool = True, foldable: bool = True) -> None:
    KERNELS[name] = KernelSpec(name, fn, pure, foldable)


def preparer(name: str) -> Callable[[Callable], Callable]:
    """Attach a load-time ``prepare`` function to the (already registered) kernel ``name``."""

    def deco(fn: Callable) -> Callable:
        spec = KERNELS[name]
        KERNELS[name] = KernelSpec(spec.name, spec.fn, spec.pure, spec.foldable, fn)
        return fn

    return deco


def load_builtin_kernels() -> dict[str, KernelSpec]:
    global _loaded
    if not _loaded:
        for fam in _FAMILIES:
            try:
                importlib.import_module(f"{__name__}.{fam}")
            except ModuleNotFoundError as e:
                if e.name != f"{__name__}.{fam}":
                    raise
        _loaded = True
    return KERNELS
