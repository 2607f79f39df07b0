"""``ConvTranspose1d``: transposed 1-D convolution over channels-last ``(batch, length, in_channels)`` input."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, FilterLayout, TensorValue, Weight, ops
from max.nn.layer import Module, check_input, on_device

__all__ = ["ConvTranspose1d"]


def _nonneg(v: Any, what: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"ConvTranspose1d: {what} must be an int >= {minimum}, got {v!r}")
    return v


class ConvTranspose1d(Module):
    """Transposed 1-D convolution (the input-gradient of ``Conv1D``): input ``(batch, length, in_channels)``,
    output ``(batch, (length - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + output_padding + 1,
    out_channels)``.

    The filter is stored as ``(kernel_size, out_channels, in_channels)`` (MAX's RSCF order for transposed
    convolutions), or with ``permute=True`` in PyTorch's ``ConvTranspose1d`` order
    ``(in_channels, out_channels, kernel_size)``.  Weights are named ``{name}.weight`` / ``{name}.bias``.
    """

    def __init__(self, length: int, in_channels: int, out_channels: int, dtype: DType, stride: int = 1,
                 padding: int = 0, dilation: int = 1, output_padding: int = 0, device: DeviceRef | None = None,
                 has_bias: bool = False, permute: bool = False, name: str | None = None) -> None:
        super().__init__()
        self.length = _nonneg(length, "length (the kernel size)", 1)
        self.in_channels = _nonneg(in_channels, "in_channels", 1)
        self.out_channels = _nonneg(out_channels, "out_channels", 1)
        if not isinstance(dtype, DType):
            raise TypeError(f"ConvTranspose1d: dtype must be a DType, got {dtype!r}")
        self.dtype = dtype
        self.stride = _nonneg(stride, "stride", 1)
        self.padding = _nonneg(padding, "padding")
        self.dilation = _nonneg(dilation, "dilation", 1)
        self.output_padding = _nonneg(output_padding, "output_padding")
        if self.output_padding >= max(self.stride, self.dilation):
            raise ValueError(f"ConvTranspose1d: output_padding ({output_padding}) must be smaller than stride "
                             f"({stride}) or dilation ({dilation})")
        self.device = device
        self.permute = permute
        prefix = f"{name}." if name else ""
        shape = [in_channels, out_channels, length] if permute else [length, out_channels, in_channels]
        self.weight = Weight(f"{prefix}weight", dtype, shape, DeviceRef.CPU())
        self.bias: Weight | None = (Weight(f"{prefix}bias", dtype, [out_channels], DeviceRef.CPU())
                                    if has_bias else None)

    def __call__(self, x: Any) -> TensorValue:
        v = check_input(self, x, rank=3, dtype=self.dtype, last_dim=self.in_channels)
        dev = self.device if self.device is not None else v.device
        v = on_device(v, dev)
        w = on_device(self.weight, dev)
        b = on_device(self.bias, dev) if self.bias is not None else None
        if self.permute:  # (in, out, k) -> (k, out, in)
            w = ops.permute(w, [2, 1, 0])
        w4 = ops.unsqueeze(w, 0)  # (1, k, out, in): RSCF with a unit height
        y = ops.conv2d_transpose(ops.unsqueeze(v, 1), w4, (1, self.stride), (1, self.dilation),
                                 (0, 0, self.padding, self.padding), (0, self.output_padding), b,
                                 filter_layout=FilterLayout.RSCF)
        return ops.squeeze(y, 1)
