"""``max.driver``: devices, streams and device-resident buffers, on PyTorch.

* ``Device`` (``CPU``, ``Accelerator``), ``DeviceSpec`` and the device queries
  (``accelerator_count``, ``scan_available_devices``, ...): :mod:`max.driver.device`.
* ``DeviceStream`` (also ``DeviceQueue``) / ``DeviceEvent``: :mod:`max.driver.stream`.
* virtual (compile-only) devices and the CPU target: :mod:`max.driver.virtual`;
  ``batch_inplace_copy``; ``load_max_buffer`` (``.max`` checkpoints).
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
from max.driver.batch_copy import batch_inplace_copy
from max.driver.checkpoint import load_max_buffer
from max.driver.virtual import (
    get_virtual_cpu_target,
    get_virtual_device_api,
    get_virtual_device_count,
    get_virtual_device_target_arch,
    is_virtual_device_mode,
    set_virtual_cpu_target,
    set_virtual_device_api,
    set_virtual_device_count,
    set_virtual_device_target_arch,
)

DeviceQueue = DeviceStream  # the 26.6 name of DeviceStream; both stay

from max import __version__  # noqa: E402  (the package version, as max.driver.__version__)

__all__ = [
    "__version__",
    "Accelerator",
    "Buffer",
    "CPU",
    "DLPackArray",
    "Device",
    "DeviceEvent",
    "DeviceQueue",
    "DeviceSpec",
    "DeviceStream",
    "MemMapTensor",
    "Tensor",
    "accelerator_api",
    "accelerator_architecture_name",
    "accelerator_count",
    "batch_inplace_copy",
    "device_from_torch",
    "devices_exist",
    "get_virtual_cpu_target",
    "get_virtual_device_api",
    "get_virtual_device_count",
    "get_virtual_device_target_arch",
    "is_virtual_device_mode",
    "load_devices",
    "load_max_buffer",
    "scan_available_devices",
    "set_virtual_cpu_target",
    "set_virtual_device_api",
    "set_virtual_device_count",
    "set_virtual_device_target_arch",
]
