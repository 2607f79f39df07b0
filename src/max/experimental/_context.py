"""Defaults and modes of eager tensors: default device/dtype, ``lazy()`` and the trace context."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, TypeVar

from max import driver
from max.dtype import DType
from max.graph.type import DeviceRef

__all__ = ["contextvar_context", "default_device", "default_dtype", "defaults", "defaults_like", "lazy"]

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


def _mesh_cls() -> Any:
    from max.experimental.sharding import DeviceMesh  # sharding imports this module

    return DeviceMesh


def _as_device(device: Any, who: str) -> driver.Device:
    if isinstance(device, driver.Device):
        return device
    if isinstance(device, DeviceRef):
        return device.to_device()
    if isinstance(device, _mesh_cls()):
        if not device.is_single:
            raise ValueError(f"{who}: a mesh of {device.num_devices} devices cannot hold an ordinary tensor; "
                             "distribute the tensor instead (max.experimental.sharding)")
        return device.devices[0]
    raise TypeError(f"{who}: device must be a driver.Device (CPU(), Accelerator()), got {type(device).__name__} {device!r}")


def _as_mesh(device: Any, who: str) -> Any:
    mesh = _mesh_cls()
    if isinstance(device, mesh):
        return device
    return mesh.single(_as_device(device, who))


@contextlib.contextmanager
def _set_default(var: contextvars.ContextVar[Any], value: Any, target: Any) -> Iterator[Any]:
    with contextvar_context(var, value):
        yield target


def default_device(device: Any) -> contextlib.AbstractContextManager:
    """Context manager: new tensors go to ``device`` unless told otherwise.

    ``device`` is a ``Device``, a ``DeviceRef`` or a one-device ``DeviceMesh``
    (checked at the call); the ``with`` target is the default as a ``DeviceMesh``.
    """
    mesh = _as_mesh(device, "default_device")
    return _set_default(_DEFAULT_DEVICE, _as_device(mesh, "default_device"), mesh)


def default_dtype(dtype: DType) -> contextlib.AbstractContextManager:
    """Context manager: new tensors get ``dtype`` unless told otherwise (the ``with`` target is ``dtype``)."""
    if not isinstance(dtype, DType):
        raise TypeError(f"default_dtype: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return _set_default(_DEFAULT_DTYPE, dtype, dtype)


def defaults_like(like: Any) -> contextlib.AbstractContextManager:
    """Context manager: the defaults become ``like``'s dtype and device (``like`` a Tensor or TensorType)."""
    from max.graph.type import TensorType

    if isinstance(like, TensorType) or (hasattr(like, "dtype") and hasattr(like, "device")
                                        and not isinstance(like, type)):
        dtype, device = like.dtype, like.device
    else:
        raise TypeError(f"defaults_like: like must be a Tensor or TensorType, got {type(like).__name__}")
    dt, dev = default_dtype(dtype), default_device(device)

    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with dt, dev:
            yield

    return both()


def lazy() -> contextlib.AbstractContextManager:
    """Context manager: ops stage into the compute graph instead of running now.

    Type rules still run at each call.  Tensors made inside realize when a
    value is needed (or with ``.realize``).
    """
    return contextvar_context(_LAZY, True)


def _accelerator_present() -> bool:
    return driver.accelerator_count() > 0


def _default_device() -> Any:
    """The default device as a one-device ``DeviceMesh``: the one set with :func:`default_device`,
    else an accelerator when one is present, else the CPU."""
    device = _DEFAULT_DEVICE.get()
    if device is None:
        device = driver.Accelerator() if _accelerator_present() else driver.CPU()
    return _mesh_cls().single(device)


def _default_dtype(device: Any) -> DType:
    """The default dtype for tensors on ``device`` (a Device, DeviceRef or DeviceMesh): the one set with
    :func:`default_dtype`, else float32 on a CPU and bfloat16 on an accelerator."""
    dtype = _DEFAULT_DTYPE.get()
    if dtype is not None:
        return dtype
    mesh = _as_mesh(device, "_default_dtype")
    return DType.float32 if all(d.is_host for d in mesh.devices) else DType.bfloat16


def _resolve(dtype: DType | None, device: Any, who: str = "defaults") -> tuple[DType, driver.Device]:
    """``(dtype, device)`` with every ``None`` replaced by the current default; device a ``driver.Device``."""
    device = _as_device(_default_device() if device is None else device, who)
    if dtype is None:
        dtype = _default_dtype(device)
    elif not isinstance(dtype, DType):
        raise TypeError(f"{who}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return dtype, device


def defaults(dtype: DType | None = None, device: Any = None) -> tuple[DType, Any]:
    """``(dtype, mesh)`` with every ``None`` replaced by the current default; the device as a ``DeviceMesh``.

    The default device is the one set with :func:`default_device`, else an
    accelerator when one is present, else the CPU.  The default dtype is the
    one set with :func:`default_dtype`, else float32 on a CPU and bfloat16 on
    an accelerator.
    """
    if device is not None and isinstance(device, _mesh_cls()):
        mesh = device
    else:
        mesh = _default_device() if device is None else _as_mesh(device, "defaults")
    if dtype is None:
        dtype = _default_dtype(mesh)
    elif not isinstance(dtype, DType):
        raise TypeError(f"defaults: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return dtype, mesh

# The graph a Module is being traced into (Module.compile, or a module called inside a Graph):
# ops on tensors of that graph stage nodes into it and give back tensors of it.
_TRACE: contextvars.ContextVar[Any] = contextvars.ContextVar("max_experimental_trace", default=None)
