"""``Signals``: the per-device signal buffers collectives take (``ops.allreduce.sum``, ``ops.allgather``).

On GPUs the reference's collective kernels use these buffers to synchronise peers.  libremax
moves collective data with torch device copies, so the buffers only have to exist (one per
device, on that device) for the graph to type-check; they stay small.
"""

from __future__ import annotations

from typing import Sequence

from max.dtype import DType
from max.graph import BufferType, DeviceRef

__all__ = ["Signals"]


class Signals:
    """Signal buffers for the collectives of a graph over ``devices``.

    ``input_types()`` gives the graph input types (one ``uint8 [NUM_BYTES]`` buffer per device);
    ``buffers()`` gives the matching driver buffers to pass to ``Model.execute``.
    """

    NUM_BYTES = 64
    """Bytes of each device's signal buffer."""

    def __init__(self, devices: Sequence[DeviceRef]) -> None:
        devs = [DeviceRef.from_device(d) for d in devices]
        if not devs:
            raise ValueError("Signals: devices must not be empty")
        self.devices = devs

    def input_types(self) -> list[BufferType]:
        """One ``BufferType(uint8, [NUM_BYTES])`` per device."""
        return [BufferType(DType.uint8, [self.NUM_BYTES], d) for d in self.devices]

    def buffers(self) -> list:
        """Zeroed driver buffers matching :meth:`input_types`."""
        import numpy as np

        from max.driver import Buffer

        return [Buffer.from_numpy(np.zeros(self.NUM_BYTES, np.uint8)).to(d.to_device()) for d in self.devices]
