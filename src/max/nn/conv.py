"""Convolution layers over channels-last input: ``Conv1D``, ``Conv2d``, ``Conv3D`` and the V1 forms.

Inputs are NWC / NHWC / NDHWC.  Filters are stored in MAX order
``(k..., in_channels / num_groups, out_channels)``; with ``permute=True`` they
are stored in PyTorch order ``(out_channels, in_channels / num_groups, k...)``
and the convolution reads them in that layout.  Weights are named
``{name}.weight`` / ``{name}.bias`` (``weight`` / ``bias`` without a name);
the ``filter`` attribute is the same Weight as ``weight``.

``Conv1D(filter=..., bias=..., stride=..., padding=...)`` (the V1 keyword
form used by the reference's module example) builds a :class:`Conv1DV1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from max.dtype import DType
from max.graph import DeviceRef, FilterLayout, TensorValue, Weight, ops
from max.graph.weight import ShardingStrategy
from max.nn.layer import Layer, Module, check_input, on_device

__all__ = ["Conv1D", "Conv1DV1", "Conv2d", "Conv2dV1", "Conv3D", "Conv3DV1"]


def _tuple(v: Any, n: int, what: str, who: str) -> tuple[int, ...]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,) * n
    t = tuple(v)
    if len(t) != n or not all(isinstance(i, int) for i in t):
        raise ValueError(f"{who}: {what} must be an int or a tuple of {n} ints, got {v!r}")
    return t


def _padding(v: Any, nd: int, who: str) -> tuple[int, ...]:
    """Per-dim (before, after) padding: an int, ``nd`` ints (symmetric) or ``2*nd`` ints."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,) * (2 * nd)
    t = tuple(v)
    if len(t) == nd and nd > 1:
        return tuple(x for p in t for x in (p, p))
    if len(t) == 2 * nd:
        return t
    raise ValueError(f"{who}: padding must be an int, {nd} ints or {2 * nd} ints, got {v!r}")


def _tv(v: Any, who: str, arg: str) -> TensorValue:
    from max.graph.ops._common import as_tensor

    return as_tensor(v, op=who, arg=arg)


def _conv_op(nd: int) -> Any:
    name = "conv3d" if nd == 3 else "conv2d"
    fn = getattr(ops, name, None)
    if fn is None:  # pragma: no cover - conv ops are part of max.graph.ops
        raise NotImplementedError(f"convolution layers need ops.{name}, which this libremax build lacks")
    return fn


class _ConvNd(Module):
    _nd = 2
    _kind = "Conv"

    def _setup(self, kernel: tuple[int, ...], in_channels: int, out_channels: int, dtype: DType, stride: Any,
               padding: Any, dilation: Any, num_groups: int, device: DeviceRef | None, has_bias: bool,
               permute: bool, name: str | None) -> None:
        who = type(self).__name__
        if in_channels % num_groups or out_channels % num_groups:
            raise ValueError(
                f"{who}: in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by "
                f"num_groups ({num_groups})"
            )
        self.kernel_size = kernel if len(kernel) > 1 else kernel[0]
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.dtype = dtype
        self.num_groups = num_groups
        self.device = device
        self.permute = permute
        prefix = f"{name}." if name else ""
        cpg = in_channels // num_groups
        shape = [out_channels, cpg, *kernel] if permute else [*kernel, cpg, out_channels]
        self.weight = Weight(f"{prefix}weight", dtype, shape, DeviceRef.CPU())
        self.bias: Weight | None = Weight(f"{prefix}bias", dtype, [out_channels], DeviceRef.CPU()) if has_bias else None
        self._max_nn_kernel = kernel

    @property
    def filter(self) -> Weight:
        """The filter Weight (same object as ``weight``)."""
        return self.weight

    def _conv(self, x: TensorValue, stride: tuple, dilation: tuple, padding: tuple) -> TensorValue:
        dev = self.device if self.device is not None else x.device
        x = on_device(x, dev)
        w = on_device(self.weight, dev)
        b = on_device(self.bias, dev) if self.bias is not None else None
        nd = self._nd
        if nd == 1:
            x4 = ops.unsqueeze(x, 1)
            if self.permute:
                w4 = ops.unsqueeze(w, 2)  # (F, C, 1, k): FCRS
                layout = FilterLayout.FCRS
            else:
                w4 = ops.unsqueeze(w, 0)  # (1, k, C, F): RSCF
                layout = FilterLayout.RSCF
            y = ops.conv2d(x4, w4, (1, stride[0]), (1, dilation[0]), (0, 0) + tuple(padding), self.num_groups, b,
                           filter_layout=layout)
            return ops.squeeze(y, 1)
        layout = (FilterLayout.FCQRS if nd == 3 else FilterLayout.FCRS) if self.permute else (
            FilterLayout.QRSCF if nd == 3 else FilterLayout.RSCF)
        return _conv_op(nd)(x, w, stride, dilation, padding, self.num_groups, b, filter_layout=layout)

    def __call__(self, x: Any) -> TensorValue:
        v = check_input(self, x, rank=self._nd + 2, dtype=self.dtype, last_dim=self.in_channels)
        return self._conv(v, self.stride_t, self.dilation_t, self.padding_t)


class Conv1D(_ConvNd):
    """1-D convolution over ``(batch, length, in_channels)`` input."""

    _nd = 1

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if "filter" in kwargs or (args and isinstance(args[0], (TensorValue, Weight))):
            return Conv1DV1(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, kernel_size: int, in_channels: int, out_channels: int, dtype: DType, stride: int = 1,
                 padding: int = 0, dilation: int = 1, num_groups: int = 1, device: DeviceRef | None = None,
                 has_bias: bool = False, permute: bool = False, name: str | None = None) -> None:
        super().__init__()
        self._setup((int(kernel_size),), in_channels, out_channels, dtype, stride, padding, dilation, num_groups,
                    device, has_bias, permute, name)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.stride_t = _tuple(stride, 1, "stride", "Conv1D")
        self.dilation_t = _tuple(dilation, 1, "dilation", "Conv1D")
        self.padding_t = _padding(padding, 1, "Conv1D")


class Conv2d(_ConvNd):
    """2-D convolution over NHWC input; ``padding`` is an int, ``(h, w)`` or ``(top, bottom, left, right)``."""

    _nd = 2

    def __init__(self, kernel_size: int | tuple[int, int], in_channels: int, out_channels: int, dtype: DType,
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, ...] = 0,
                 dilation: int | tuple[int, int] = 1, num_groups: int = 1, device: DeviceRef | None = None,
                 has_bias: bool = False, permute: bool = False, name: str | None = None) -> None:
        super().__init__()
        self._setup(_tuple(kernel_size, 2, "kernel_size", "Conv2d"), in_channels, out_channels, dtype, stride,
                    padding, dilation, num_groups, device, has_bias, permute, name)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.stride_t = _tuple(stride, 2, "stride", "Conv2d")
        self.dilation_t = _tuple(dilation, 2, "dilation", "Conv2d")
        self.padding_t = _padding(padding, 2, "Conv2d")

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not strategy.is_replicate:
            raise ValueError(f"{self._layer_name}: Conv2d supports only replicated sharding, got {strategy}")
        self.weight.sharding_strategy = strategy
        if self.bias is not None:
            self.bias.sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list["Conv2d"]:
        """One Conv2d per device, each with a replica of the filter and bias."""
        devs = list(devices)
        if self.weight.sharding_strategy is None:
            self.sharding_strategy = ShardingStrategy.replicate(len(devs))
        ws = self.weight.shard(devs)
        bs = self.bias.shard(devs) if self.bias is not None else [None] * len(devs)
        out = []
        for dev, w, b in zip(devs, ws, bs):
            c = Conv2d.__new__(Conv2d)
            Module.__init__(c)
            for k in ("kernel_size", "in_channels", "out_channels", "dtype", "num_groups", "permute", "stride",
                      "padding", "dilation", "stride_t", "dilation_t", "padding_t", "_max_nn_kernel"):
                setattr(c, k, getattr(self, k))
            c.device = dev
            c.weight = w
            c.bias = b
            out.append(c)
        return out


class Conv3D(_ConvNd):
    """3-D convolution over NDHWC input; ``padding`` is an int or ``(front, back, top, bottom, left, right)``."""

    _nd = 3

    def __init__(self, depth: int, height: int, width: int, in_channels: int, out_channels: int, dtype: DType,
                 stride: int | tuple[int, int, int] = 1, padding: int | tuple[int, ...] = 0,
                 dilation: int | tuple[int, int, int] = 1, num_groups: int = 1, device: DeviceRef | None = None,
                 has_bias: bool = False, permute: bool = False, name: str | None = None) -> None:
        super().__init__()
        self._setup((depth, height, width), in_channels, out_channels, dtype, stride, padding, dilation,
                    num_groups, device, has_bias, permute, name)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.stride_t = _tuple(stride, 3, "stride", "Conv3D")
        self.dilation_t = _tuple(dilation, 3, "dilation", "Conv3D")
        self.padding_t = _padding(padding, 3, "Conv3D")


# --------------------------------------------------------------------- V1 (deprecated)
def _v1_call(layer: Any, nd: int, x: Any) -> TensorValue:
    who = type(layer).__name__
    w = _tv(layer.filter, who, "filter")
    v = check_input(layer, x, rank=nd + 2, dtype=w.dtype, last_dim=w.shape[-2] * layer.groups)
    b = _tv(layer.bias, who, "bias") if layer.bias is not None else None
    stride = _tuple(layer.stride, nd, "stride", who)
    dilation = _tuple(layer.dilation, nd, "dilation", who)
    padding = _padding(layer.padding, nd, who)
    if nd == 1:
        y = ops.conv2d(ops.unsqueeze(v, 1), ops.unsqueeze(w, 0), (1, stride[0]), (1, dilation[0]),
                       (0, 0) + padding, layer.groups, b)
        return ops.squeeze(y, 1)
    return _conv_op(nd)(v, w, stride, dilation, padding, layer.groups, b)


@dataclass(eq=False)
class Conv1DV1(Layer):
    """Deprecated 1-D convolution with a given ``filter`` ``(k, in/groups, out)``."""

    filter: Any
    bias: Any = None
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1

    def __call__(self, x: Any) -> TensorValue:
        return _v1_call(self, 1, x)


@dataclass(eq=False)
class Conv2dV1(Layer):
    """Deprecated 2-D convolution with a given RSCF ``filter``."""

    filter: Any
    bias: Any = None
    stride: int | tuple[int, int] = (1, 1)
    padding: int | tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: int | tuple[int, int] = (1, 1)
    groups: int = 1

    def __call__(self, x: Any) -> TensorValue:
        return _v1_call(self, 2, x)


@dataclass(eq=False)
class Conv3DV1(Layer):
    """Deprecated 3-D convolution with a given QRSCF ``filter``."""

    filter: Any
    bias: Any = None
    stride: int | tuple[int, int, int] = (1, 1, 1)
    padding: int | tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
    dilation: int | tuple[int, int, int] = (1, 1, 1)
    groups: int = 1

    def __call__(self, x: Any) -> TensorValue:
        return _v1_call(self, 3, x)
