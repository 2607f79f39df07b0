"""``StackedLinear``: several linear projections of one input computed as one matmul.

``stacked=True`` holds one pre-stacked ``weight`` ``[sum(out_dims), in_dim]`` (the
checkpoint stores the fused tensor, e.g. ``qkv_proj.weight``); ``stacked=False`` holds
one child ``Linear`` per projection, named by ``names``, whose weights are concatenated
when the graph is built.  In the unfused form the module's own attribute name is left
out of its children's weight names, so ``self.qkv_proj = StackedLinear(..., names=["q_proj",
"k_proj", "v_proj"])`` exposes ``q_proj.weight``... as a checkpoint does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn.layer import Module, check_input, on_device
from max.nn.linear import Linear

__all__ = ["StackedLinear"]


class StackedLinear(Module):
    """``concat([x @ W_i.T + b_i for each projection], -1)`` as one matmul."""

    def __init__(self, in_dim: int, out_dims: Sequence[int], names: Sequence[str], dtype: DType,
                 device: DeviceRef, stacked: bool = False, has_bias: bool = False,
                 linear_cls: Callable[..., Linear] = Linear, quant_config: Any = None,
                 clip_weight: float | None = None, _is_sharding: bool = False) -> None:
        super().__init__()
        out_dims, names = list(out_dims), list(names)
        if len(out_dims) != len(names) or not out_dims:
            raise ValueError(f"StackedLinear: out_dims {out_dims} and names {names} must be non-empty and of "
                             "equal length")
        if len(set(names)) != len(names):
            raise ValueError(f"StackedLinear: names must be distinct, got {names}")
        if quant_config is not None:
            raise NotImplementedError("StackedLinear: quant_config is not supported by libremax; "
                                      "load float weights")
        self.in_dim = in_dim
        self.out_dims = out_dims
        self.names = names
        self.stacked = stacked
        self.has_bias = has_bias
        self.clip_weight = clip_weight
        self.device = device if device is not None else DeviceRef.CPU()
        self._max_nn_dtype = dtype
        if stacked:
            self.weight = Weight("weight", dtype, [sum(out_dims), in_dim], self.device)
            self.bias = Weight("bias", dtype, [sum(out_dims)], self.device) if has_bias else None
        else:
            self._max_nn_omit_attr_name = True  # children are named by `names` alone
            for name, out in zip(names, out_dims):
                setattr(self, name, linear_cls(in_dim, out, dtype, self.device, has_bias=has_bias))

    def _weights(self) -> tuple[Any, Any]:
        if self.stacked:
            return self.weight, self.bias
        lins = [getattr(self, n) for n in self.names]
        w = ops.concat([lin.weight for lin in lins], axis=0)
        b = ops.concat([lin.bias for lin in lins], axis=0) if self.has_bias else None
        return w, b

    def __call__(self, x: Any) -> TensorValue:
        v = on_device(check_input(self, x, min_rank=1, dtype=self._max_nn_dtype, last_dim=self.in_dim),
                      self.device)
        w, b = self._weights()
        if self.clip_weight is not None:
            c = float(self.clip_weight)
            w = ops.min(ops.max(w, -c), c)
        y = v @ ops.transpose(w, 0, 1)
        return y + b if b is not None else y
