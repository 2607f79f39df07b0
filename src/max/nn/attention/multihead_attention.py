"""``MultiheadAttention``: full (non-causal) multi-head self-attention over ``[batch, seq, hidden]``.

``q/k/v/o`` projections are ``Linear`` layers named ``q_proj``, ``k_proj``, ``v_proj``,
``o_proj`` (``stacked_qkv``: one ``qkv_proj.weight`` of ``[3 * hidden, hidden]``).  With
several ``devices`` the heads split across them (each device computes its heads, the
output projections' partial sums are added), matching the single-device result.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn.layer import Module, check_input, on_device
from max.nn.linear import Linear

__all__ = ["MultiheadAttention"]


class MultiheadAttention(Module):
    """Multi-head self-attention: ``softmax(q k^T * scale) v`` per head, then ``o_proj``."""

    def __init__(self, num_attention_heads: int, hidden_size: int, devices: Sequence[DeviceRef] | None = None,
                 dtype: DType = DType.float32, scale: float | None = None, qkv_has_bias: bool = False,
                 o_proj_has_bias: bool = False, stacked_qkv: bool = False) -> None:
        super().__init__()
        if hidden_size % num_attention_heads:
            raise ValueError(f"MultiheadAttention: hidden_size {hidden_size} is not divisible by "
                             f"num_attention_heads {num_attention_heads}")
        self.num_heads = num_attention_heads
        self.hidden_size = hidden_size
        self.head_dim = hidden_size // num_attention_heads
        self.devices = list(devices) if devices else [DeviceRef.CPU()]
        if num_attention_heads % len(self.devices):
            raise ValueError(f"MultiheadAttention: {num_attention_heads} heads do not split across "
                             f"{len(self.devices)} devices")
        self.dtype = dtype
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.stacked_qkv = stacked_qkv
        self.qkv_has_bias = qkv_has_bias
        dev = self.devices[0]
        if stacked_qkv:
            self.qkv_proj = Weight("qkv_proj.weight", dtype, [3 * hidden_size, hidden_size], dev)
            self.qkv_proj_bias = Weight("qkv_proj.bias", dtype, [3 * hidden_size], dev) if qkv_has_bias else None
        else:
            self.q_proj = Linear(hidden_size, hidden_size, dtype, dev, has_bias=qkv_has_bias)
            self.k_proj = Linear(hidden_size, hidden_size, dtype, dev, has_bias=qkv_has_bias)
            self.v_proj = Linear(hidden_size, hidden_size, dtype, dev, has_bias=qkv_has_bias)
        self.o_proj = Linear(hidden_size, hidden_size, dtype, dev, has_bias=o_proj_has_bias)

    @property
    def wqkv(self) -> TensorValue:
        """The q, k and v projection weights stacked: ``[3 * hidden, hidden]``."""
        if self.stacked_qkv:
            return self.qkv_proj  # type: ignore[return-value]
        return ops.concat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], axis=0)

    @property
    def wqkv_bias(self) -> TensorValue | None:
        """The q, k and v biases stacked, or None without biases."""
        if not self.qkv_has_bias:
            return None
        if self.stacked_qkv:
            return self.qkv_proj_bias  # type: ignore[return-value]
        return ops.concat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], axis=0)

    def _heads(self, x: TensorValue, w: Any, b: Any, dev: DeviceRef, h0: int, h1: int) -> TensorValue:
        d = self.head_dim
        y = x @ ops.transpose(on_device(w, dev), 0, 1)
        if b is not None:
            y = y + on_device(b, dev)
        y = ops.reshape(y, [x.shape[0], x.shape[1], 3, self.num_heads, d])
        return y[:, :, :, h0:h1, :]

    def __call__(self, x: Any, **kwargs: Any) -> TensorValue:
        v = check_input(self, x, rank=3, dtype=self.dtype, last_dim=self.hidden_size)
        n_dev = len(self.devices)
        per = self.num_heads // n_dev
        w, b = self.wqkv, self.wqkv_bias
        partial = []
        for i, dev in enumerate(self.devices):
            xd = on_device(v, dev)
            qkv = self._heads(xd, w, b, dev, i * per, (i + 1) * per)  # [b, s, 3, h, d]
            q, k, val = (ops.permute(qkv[:, :, j], [0, 2, 1, 3]) for j in range(3))  # [b, h, s, d]
            scores = (q @ ops.transpose(k, -1, -2)) * self.scale
            attn = ops.softmax(scores) @ val  # [b, h, s, d]
            merged = ops.reshape(ops.permute(attn, [0, 2, 1, 3]), [v.shape[0], v.shape[1], per * self.head_dim])
            wo = on_device(self.o_proj.weight, dev)[:, i * per * self.head_dim:(i + 1) * per * self.head_dim]
            partial.append(merged @ ops.transpose(wo, 0, 1))
        out = partial[0]
        for p in partial[1:]:
            out = out + on_device(p, self.devices[0])
        if self.o_proj.bias is not None:
            out = out + self.o_proj.bias
        return out
