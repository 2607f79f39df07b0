"""``WeightData``: one checkpoint tensor with its name, dtype, shape and encoding."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from max.dtype import DType
from max.graph.quantization import QuantizationEncoding
from max.graph.shape import Shape

__all__ = ["WeightData", "as_torch"]


def as_torch(data: Any) -> torch.Tensor:
    """A torch view of ``data`` (torch tensor, numpy array incl. bfloat16/float8, DLPack array)."""
    if isinstance(data, torch.Tensor):
        return data
    f = getattr(data, "_torch", None)
    if callable(f):
        return f()
    if isinstance(data, np.ndarray):  # shared memory (bfloat16/float8 as bits): the driver's one conversion
        from max.driver.buffer import numpy_to_torch

        return numpy_to_torch(data)
    if hasattr(data, "__dlpack__"):
        return torch.from_dlpack(data)
    raise TypeError(f"WeightData: expected a torch/numpy/DLPack array, got {type(data).__name__}")


class WeightData:
    """Container for weight tensor data with metadata.

    ``data`` is any DLPack-capable array (libremax's loaders give torch tensors
    backed by the memory-mapped file).  For a quantized weight, ``dtype`` is
    ``uint8``, ``shape`` is the stored block shape ``(*rows, bytes_per_row)``
    and ``quantization_encoding`` names the block format.
    """

    __slots__ = ("data", "name", "dtype", "shape", "quantization_encoding")

    def __init__(self, data: Any, name: str, dtype: DType, shape: Any,
                 quantization_encoding: QuantizationEncoding | None = None) -> None:
        self.data = data
        self.name = name
        self.dtype = dtype
        self.shape = shape if isinstance(shape, Shape) else Shape(list(shape))
        self.quantization_encoding = quantization_encoding

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_numpy(cls, arr: np.ndarray, name: str) -> "WeightData":
        """WeightData with dtype and shape taken from ``arr``."""
        arr = np.asarray(arr)
        return cls(arr, name, DType.from_numpy(arr.dtype), Shape(list(arr.shape)))

    # ------------------------------------------------------------ conversions
    def _torch(self) -> torch.Tensor:
        return as_torch(self.data)

    def astype(self, dtype: DType) -> "WeightData":
        """A new WeightData with the values converted to ``dtype``.

        libremax extension: converting a quantized weight to a float dtype
        dequantizes it (GGML formats) and returns the logical shape.
        """
        if not isinstance(dtype, DType):
            raise TypeError(f"WeightData.astype({self.name!r}): dtype must be a DType, got {dtype!r}")
        t = self._torch()
        if self.quantization_encoding is not None:
            if not dtype.is_float():
                raise ValueError(
                    f"WeightData.astype: weight {self.name!r} is quantized as {self.quantization_encoding._name_}; "
                    f"it can only be converted to a float dtype (dequantized), not {dtype}"
                )
            from max.graph.quantization.codec import dequantize

            deq = dequantize(t, self.quantization_encoding).to(dtype.to_torch())
            return WeightData(deq, self.name, dtype, Shape(list(deq.shape)), None)
        if dtype == self.dtype:
            return self
        out = t.to(dtype.to_torch())
        return WeightData(out, self.name, dtype, Shape(list(out.shape)), None)

    def view(self, dtype: DType) -> "WeightData":
        """Reinterpret the bytes as ``dtype`` (the last dim scales by the size ratio)."""
        t = self._torch().contiguous()
        if t.ndim == 0:
            t = t.reshape(1)
        out = t.view(dtype.to_torch())
        return WeightData(out, self.name, dtype, Shape(list(out.shape)), self.quantization_encoding)

    def to_numpy(self) -> np.ndarray:
        """The data as a numpy array (bfloat16/float8 via ml_dtypes); zero-copy on the host."""
        t = self._torch()
        if t.device.type != "cpu":
            t = t.cpu()
        from max.driver.buffer import torch_to_numpy

        return torch_to_numpy(t, DType.from_torch(t.dtype))

    # ------------------------------------------------------------ DLPack
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._torch().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._torch().__dlpack_device__()

    def __repr__(self) -> str:
        enc = f", quantization_encoding={self.quantization_encoding}" if self.quantization_encoding else ""
        return f"WeightData({self.name!r}, {self.dtype}, {self.shape}{enc})"
