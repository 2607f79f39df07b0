"""numpy -> Buffer -> torch (DLPack) -> back, showing that memory is shared.

    python examples/02_buffer_roundtrip.py
"""

import numpy as np
import torch

from max import driver
from max.dtype import DType


def main() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = driver.Buffer.from_numpy(array)  # zero-copy: shares array's memory
    print(f"numpy {array.shape} {array.dtype} -> {buf!r}")
    assert buf.dtype is DType.float32 and buf.shape == (3, 4)

    t = torch.from_dlpack(buf)  # zero-copy into torch
    t[0, 0] = 100.0
    assert array[0, 0] == 100.0
    print("torch.from_dlpack(buf): a write through torch is visible in numpy -> shared")

    back = driver.Buffer.from_dlpack(t)
    back[2, 3] = -1.0
    assert array[2, 3] == -1.0 and buf.to_numpy()[2, 3] == -1.0
    print("Buffer.from_dlpack(torch tensor): writes reach the original numpy array -> shared")

    view = buf[1:, ::-2]  # a strided view with a negative step
    print(f"slice buf[1:, ::-2] -> shape {view.shape}, is_contiguous={view.is_contiguous}")
    assert np.array_equal(view.to_numpy(), array[1:, ::-2])
    view[0, 0] = 42.0
    assert array[1, 3] == 42.0
    print("writing view[0, 0] changed array[1, 3] -> the slice is a view")

    device = driver.CPU() if driver.accelerator_count() == 0 else driver.Accelerator()
    moved = buf.to(device)
    print(f"buf.to({device}) -> {'the same buffer' if moved is buf else 'a copy on ' + str(moved.device)}")
    assert np.array_equal(moved.to_numpy(), array)
    print("round trip OK")


if __name__ == "__main__":
    main()
