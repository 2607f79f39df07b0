"""``max.driver``: devices, streams and device-resident buffers, on PyTorch.

* ``Device`` (``CPU``, ``Accelerator``), ``DeviceSpec`` and the device queries
  (``accelerator_count``, ``scan_available_devices``, ...): :mod:`max.driver.device`.
* ``DeviceStream`` / ``DeviceEvent``: :mod:`max.driver.stream`.
* ``Buffer`` (alias ``Tensor``), ``MemMapTensor``, ``DLPackArray``:
  :mod:`max.driver.buffer`.
"""

from max.driver.device import (
    CPU,
    Accelerator,
    Device,
    DeviceSpec,
    accelerator_api,
    accelerator_architecture_name,
    accelerator_count,
    device_from_torch,
    devices_exist,
    load_devices,
    scan_available_devices,
)
from max.driver.stream import DeviceEvent, DeviceStream
from max.driver.buffer import Buffer, DLPackArray, MemMapTensor, Tensor

from max import __version__  # noqa: E402  (the package version, as max.driver.__version__)

__all__ = [
    "__version__",
    "Accelerator",
    "Buffer",
    "CPU",
    "DLPackArray",
    "Device",
    "DeviceEvent",
    "DeviceSpec",
    "DeviceStream",
    "MemMapTensor",
    "Tensor",
    "accelerator_api",
    "accelerator_architecture_name",
    "accelerator_count",
    "device_from_torch",
    "devices_exist",
    "load_devices",
    "scan_available_devices",
]
