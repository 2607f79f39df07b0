"""Device ops: ``transfer_to``."""

from __future__ import annotations

from typing import Any

import numpy as np

from max.graph.ops._common import as_device_ref, as_tensor, fail, is_scalar_like, stage1
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = ["transfer_to"]


def transfer_to(x: Any, device: Any) -> TensorValue:
    """``x`` copied to ``device`` (a ``DeviceRef`` or ``driver.Device``).

    Returns ``x`` itself when it already lives there.  ``x`` must be a
    tensor value (or a ``Dim``/``Shape``); for Python scalars or numpy
    arrays use ``ops.constant(value, dtype, device)`` instead.
    """
    op = "transfer_to"
    if is_scalar_like(x) or isinstance(x, np.ndarray):
        fail(op, f"x must be a tensor value, Dim or Shape, got {type(x).__name__}; "
                 "make a constant on the target device with ops.constant(value, dtype, device)", TypeError)
    x = as_tensor(x, op=op)
    if device is None:
        fail(op, "device must be a DeviceRef or driver.Device, got None", TypeError)
    dev = as_device_ref(device, op)
    if dev == x.device:
        return x
    return stage1(op, [x], TensorType(x.dtype, x.shape, dev), {"device": dev})
