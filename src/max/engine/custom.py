"""The decorator API for custom kernels.

Write a module::

    # my_kernels.py
    import torch
    from max.engine.custom import custom_op

    @custom_op("add_one")
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @custom_op("scale_inplace", inplace=True)
    def scale_inplace(buf: torch.Tensor, *, factor: int) -> None:
        buf.mul_(factor)

then ``ops.custom("add_one", device, [x], [x.type])`` in a graph built with
``custom_extensions=["my_kernels.py"]`` (on the Graph, the session or
``load``).  A kernel receives the op's operands as torch tensors (buffers are
the caller's memory, so in-place kernels mutate them) and the op's
``parameters`` as keyword arguments; it returns its outputs (one tensor or a
tuple matching ``out_types``).  Outputs are checked against ``out_types``.
"""

from __future__ import annotations

from typing import Any, Callable

from max.graph.kernel_library import CustomKernel, KernelLibrary, _REGISTRY, load_extension

__all__ = ["custom_op", "load_extensions", "KernelLibrary"]


def custom_op(name: str, *, inplace: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated function as the kernel of custom op ``name``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"custom_op: name must be a non-empty str, got {name!r}")

    def deco(fn: Callable) -> Callable:
        prev = _REGISTRY.get(name)
        if prev is not None and prev.fn is not fn and getattr(prev.fn, "__qualname__", None) != fn.__qualname__:
            raise ValueError(f"custom_op: a kernel named {name!r} is already registered (from {prev.source})")
        _REGISTRY[name] = CustomKernel(name, fn, inplace, getattr(fn, "__module__", "<python>"))
        return fn

    return deco


def load_extensions(exts: Any) -> list[str]:
    """Import each custom extension; returns the kernel names they registered."""
    names: list[str] = []
    for e in exts if isinstance(exts, (list, tuple)) else [exts]:
        names += load_extension(e)
    return names
