"""Defaults and modes of eager tensors: default device/dtype, ``lazy()`` and the trace context."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, TypeVar

from max import driver
from max.dtype import DType
from max.graph.type import DeviceRef

__all__ = ["contextvar_context", "default_device", "default_dtype", "defaults", "lazy"]

T = TypeVar("T")

# ----------------------------------------------------------------------------- defaults
_DEFAULT_DEVICE: contextvars.ContextVar[Any] = contextvars.ContextVar("max_experimental_device", default=None)
_DEFAULT_DTYPE: contextvars.ContextVar[Any] = contextvars.ContextVar("max_experimental_dtype", default=None)
_LAZY: contextvars.ContextVar[bool] = contextvars.ContextVar("max_experimental_lazy", default=False)


@contextlib.contextmanager
def contextvar_context(var: contextvars.ContextVar[T], value: T) -> Iterator[None]:
    """Set ``var`` to ``value`` for the duration of the ``with`` block."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def _as_device(device: Any, who: str) -> driver.Device:
    if isinstance(device, driver.Device):
        return device
    if isinstance(device, DeviceRef):
        return device.to_device()
    raise TypeError(f"{who}: device must be a driver.Device (CPU(), Accelerator()), got {type(device).__name__} {device!r}")


def default_device(device: Any) -> contextlib.AbstractContextManager:
    """Context manager: new tensors go to ``device`` unless told otherwise."""
    return contextvar_context(_DEFAULT_DEVICE, _as_device(device, "default_device"))


def default_dtype(dtype: DType) -> contextlib.AbstractContextManager:
    """Context manager: new tensors get ``dtype`` unless told otherwise."""
    if not isinstance(dtype, DType):
        raise TypeError(f"default_dtype: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return contextvar_context(_DEFAULT_DTYPE, dtype)


def lazy() -> contextlib.AbstractContextManager:
    """Context manager: ops stage into the compute graph instead of running now.

    Type rules still run at each call.  Tensors made inside realize when a
    value is needed (or with ``.realize``).
    """
    return contextvar_context(_LAZY, True)


def _accelerator_present() -> bool:
    return driver.accelerator_count() > 0


def defaults(dtype: DType | None = None, device: Any = None) -> tuple[DType, driver.Device]:
    """``(dtype, device)`` with every ``None`` replaced by the current default.

    The default device is the one set with :func:`default_device`, else an
    accelerator when one is present, else the CPU.  The default dtype is the
    one set with :func:`default_dtype`, else float32 on a CPU and bfloat16 on
    an accelerator.
    """
    if device is None:
        device = _DEFAULT_DEVICE.get()
        if device is None:
            device = driver.Accelerator() if _accelerator_present() else driver.CPU()
    else:
        device = _as_device(device, "defaults")
    if dtype is None:
        dtype = _DEFAULT_DTYPE.get()
        if dtype is None:
            dtype = DType.float32 if device.is_host else DType.bfloat16
    elif not isinstance(dtype, DType):
        raise TypeError(f"defaults: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return dtype, device

# The graph a Module is being traced into (Module.compile, or a module called inside a Graph):
# ops on tensors of that graph stage nodes into it and give back tensors of it.
_TRACE: contextvars.ContextVar[Any] = contextvars.ContextVar("max_experimental_trace", default=None)
