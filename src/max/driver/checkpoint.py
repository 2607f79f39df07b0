"""MAX buffer checkpoints (``.max`` files): written by ``ops.print`` under
``PrintStyle.BINARY_MAX_CHECKPOINT``, read back with :func:`load_max_buffer`.

Layout (little-endian): the 8-byte magic ``b"MAXBUF\\x00\\x01"``, a uint32 length and the UTF-8
name of the ``DType``, a uint32 rank, ``rank`` int64 dims, then the elements in row-major order.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from max.dtype import DType

__all__ = ["load_max_buffer"]

MAGIC = b"MAXBUF\x00\x01"


def write_max_buffer(path: Any, array: np.ndarray, dtype: DType) -> None:
    """Write ``array`` (numpy, holding ``dtype``'s values) as a ``.max`` checkpoint at ``path``."""
    arr = np.ascontiguousarray(array)
    name = dtype.name.encode()
    with open(os.fspath(path), "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<I", len(name)))
        f.write(name)
        f.write(struct.pack("<I", arr.ndim))
        f.write(struct.pack(f"<{arr.ndim}q", *arr.shape))
        f.write(arr.tobytes())


def load_max_buffer(path: Any) -> Any:
    """The ``Buffer`` stored in a ``.max`` checkpoint (shape and dtype read from the file).

    ValueError when the file is not in the MAX checkpoint format.
    """
    from max.driver.buffer import Buffer

    p = os.fspath(path)
    with open(p, "rb") as f:
        data = f.read()
    bad = ValueError(f"load_max_buffer: {p!r} is not a MAX checkpoint (.max) file")
    if not data.startswith(MAGIC):
        raise bad
    try:
        off = len(MAGIC)
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        dtype = DType[data[off:off + n].decode()]
        off += n
        (rank,) = struct.unpack_from("<I", data, off)
        off += 4
        shape = struct.unpack_from(f"<{rank}q", data, off)
        off += 8 * rank
    except (struct.error, KeyError, UnicodeDecodeError):
        raise bad from None
    np_dtype = dtype.to_numpy()
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) - off != count * np.dtype(np_dtype).itemsize:
        raise bad
    arr = np.frombuffer(data, dtype=np_dtype, count=count, offset=off).reshape(shape).copy()
    return Buffer.from_numpy(arr)
