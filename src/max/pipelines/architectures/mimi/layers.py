"""Mimi's graph building blocks on channels-last activations ``[batch, time, channels]``.

Every block of the decoder runs in *streaming* form: it takes the state the previous chunk left and returns the
state for the next one, so the causal network gives the same samples whatever the chunking (a fresh, all-zero
state is the start of a stream).

- :class:`CausalConv1d`: a causal convolution; its state is the last ``(kernel - 1) * dilation`` input frames
  (zeros at the start: the left padding of the non-streaming form).  For the encoder (strided convolutions,
  whole input at once) the right end gets the extra padding that makes the last window complete, as
  transformers' ``MimiConv1d`` does.
- :class:`CausalConvTranspose1d`: a transposed convolution as one matmul per input frame
  (``[in] -> [kernel, out]``) and an overlap-add of the frames' ``kernel / stride`` blocks; its state is the
  overhang of the last frames into samples not yet complete (trimmed from the right end when not streaming).
- :class:`TransformerLayer`: pre-LayerNorm attention with RoPE, causal attention over a sliding window (keys
  ``j`` with ``i - window < j <= i``), layer scales and a GELU MLP; its state is the rotated keys and values of
  the last ``window`` positions (positions before 0 are masked out).
"""

from __future__ import annotations

import math

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, FilterLayout, TensorValue, Weight, ops
from max.graph.rope import rope_inv_freq as _inv_freq
from max.nn import LayerNorm, Linear, Module
from max.pipelines.architectures.common.layers import activation
from max.pipelines.architectures.mimi.config import WHO, MimiSettings

__all__ = ["CausalConv1d", "CausalConvTranspose1d", "Elu", "TransformerLayer", "rope_inv_freq"]

F32 = DType.float32
CPU = DeviceRef.CPU()


class Elu(Module):
    """ELU (alpha 1); holds no weights (it keeps the checkpoint's layer numbering).

    ``max(x, exp(min(x, 0)) - 1)``: ``x`` above 0 (where the second term is 0), ``exp(x) - 1`` below
    (``exp(x) - 1 >= x`` everywhere)."""

    def __call__(self, x: TensorValue) -> TensorValue:
        return ops.max(x, ops.exp(ops.min(x, 0.0)) - 1.0)


class CausalConv1d(Module):
    """``conv``: ``weight`` ``[out, in, kernel]`` (+ ``bias``), as the checkpoint names them."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = Module()
        self.conv.weight = Weight("weight", F32, [out_ch, in_ch, kernel], CPU)
        self.conv.bias = Weight("bias", F32, [out_ch], CPU) if bias else None
        self.in_ch, self.out_ch, self.stride, self.dilation = in_ch, out_ch, stride, dilation
        self.kernel = (kernel - 1) * dilation + 1  # effective
        self.pad_mode = pad_mode

    @property
    def state_len(self) -> int:
        return self.kernel - self.stride

    def _apply(self, x: TensorValue) -> TensorValue:
        w = ops.unsqueeze(self.conv.weight, 2)  # [out, in, 1, k]
        y = ops.conv2d(ops.unsqueeze(x, 1), w, (1, self.stride), (1, self.dilation), (0, 0, 0, 0), 1,
                       self.conv.bias, filter_layout=FilterLayout.FCRS)
        return ops.squeeze(y, 1)

    def step(self, x: TensorValue, state: TensorValue | None) -> tuple[TensorValue, TensorValue | None]:
        """Streaming form (stride 1): ``state`` ``[batch, state_len, in]`` (None when ``state_len`` is 0)."""
        if state is None:
            return self._apply(x), None
        xc = ops.concat([state, x], axis=1)
        return self._apply(xc), xc[:, -self.state_len:, :]

    def whole(self, x: TensorValue, extra: TensorValue | None) -> TensorValue:
        """Whole-input form: left padding ``state_len`` frames, right padding ``extra`` (a zero tensor
        ``[batch, n, in]`` whose length the caller computes) so the last window is complete."""
        mode = "edge" if self.pad_mode == "replicate" else "constant"
        if self.state_len:
            x = ops.pad(x, [0, 0, self.state_len, 0, 0, 0], mode=mode)
        if extra is not None:
            right = extra + x[:, -1:, :] if self.pad_mode == "replicate" else extra
            x = ops.concat([x, right], axis=1)
        return self._apply(x)


def extra_padding(length: int, kernel: int, stride: int) -> int:
    """Frames of right padding a causal convolution adds so its last window is complete."""
    padding_total = kernel - stride
    n_frames = math.ceil((length - kernel + padding_total) / stride + 1) - 1
    return n_frames * stride + kernel - padding_total - length


class CausalConvTranspose1d(Module):
    """``conv``: ``weight`` ``[in, out, kernel]`` (a grouped checkpoint weight is expanded to this dense form on
    load) (+ ``bias``); right-trimmed by ``kernel - stride`` samples (``trim_right_ratio`` 1)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, bias: bool = True) -> None:
        super().__init__()
        self.conv = Module()
        self.conv.weight = Weight("weight", F32, [in_ch, out_ch, kernel], CPU)
        self.conv.bias = Weight("bias", F32, [out_ch], CPU) if bias else None
        self.in_ch, self.out_ch, self.kernel, self.stride = in_ch, out_ch, kernel, stride
        self.blocks = -(-kernel // stride)  # frames one input frame reaches

    @property
    def state_len(self) -> int:
        """Overhang blocks (each ``stride`` samples) carried to the next chunk."""
        return self.blocks - 1

    def step(self, x: TensorValue, state: TensorValue | None) -> tuple[TensorValue, TensorValue | None]:
        """``x`` ``[batch, t, in]``, ``state`` ``[batch, state_len, stride, out]`` -> ``[batch, t * stride, out]``."""
        b, t = x.shape[0], x.shape[1]
        m, s, o = self.blocks, self.stride, self.out_ch
        w = ops.permute(self.conv.weight, [0, 2, 1])  # [in, k, out]
        if m * s != self.kernel:
            w = ops.pad(w, [0, 0, 0, m * s - self.kernel, 0, 0])
        z = ops.reshape(x @ ops.reshape(w, [self.in_ch, m * s * o]), [b, t, m, s, o])
        if m == 2 and state is not None:  # SEANet's kernel = 2 * stride: frame u's second block lands on u + 1
            prev = ops.concat([state, z[:, :, 1]], axis=1)  # [b, t + 1, s, o]
            out = ops.reshape(z[:, :, 0] + prev[:, :t], [b, t * s, o])
            if self.conv.bias is not None:
                out = out + self.conv.bias
            return out, prev[:, t:]
        total = None
        for j in range(m):  # block j of frame u lands on output frame u + j
            part = ops.pad(z[:, :, j], [0, 0, j, m - 1 - j, 0, 0, 0, 0])
            total = part if total is None else total + part
        if state is not None:
            total = ops.concat([total[:, :m - 1] + state, total[:, m - 1:]], axis=1)
        out = ops.reshape(total[:, :t], [b, t * s, o])
        if self.conv.bias is not None:
            out = out + self.conv.bias
        return out, (total[:, t:] if m > 1 else None)


def rope_inv_freq(s: MimiSettings) -> np.ndarray:
    """RoPE inverse frequencies (float32, computed the way the checkpoint's model computes them)."""
    return _inv_freq(s.rope_theta, s.head_dim, np.float32)


class _Attention(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        d, h, kv, hd, bias = s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim, s.attention_bias
        self.q_proj = Linear(d, h * hd, F32, CPU, has_bias=bias)
        self.k_proj = Linear(d, kv * hd, F32, CPU, has_bias=bias)
        self.v_proj = Linear(d, kv * hd, F32, CPU, has_bias=bias)
        self.o_proj = Linear(h * hd, d, F32, CPU, has_bias=bias)


class _Mlp(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        self.fc1 = Linear(s.hidden_size, s.intermediate_size, F32, CPU)
        self.fc2 = Linear(s.intermediate_size, s.hidden_size, F32, CPU)


class _Scale(Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = Weight("scale", F32, [d], CPU)


def _rotate(x: TensorValue, cos: TensorValue, sin: TensorValue) -> TensorValue:
    half = x.shape[-1] // 2
    rot = ops.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


class TransformerLayer(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        self.s = s
        self.window = int(s.sliding_window)
        self.self_attn = _Attention(s)
        self.mlp = _Mlp(s)
        self.input_layernorm = LayerNorm(s.hidden_size, CPU, F32, eps=s.norm_eps)
        self.post_attention_layernorm = LayerNorm(s.hidden_size, CPU, F32, eps=s.norm_eps)
        self.self_attn_layer_scale = _Scale(s.hidden_size)
        self.mlp_layer_scale = _Scale(s.hidden_size)
        object.__setattr__(self, "_act", activation(s.hidden_act, WHO))

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, mask: TensorValue,
                 cache: tuple[TensorValue, TensorValue] | None) -> tuple[TensorValue, tuple | None]:
        """``x`` ``[b, t, d]``; ``cos``/``sin`` ``[b, 1, t, head_dim]``; ``mask`` bool ``[b, 1, t, keys]`` (keys:
        the cached ``window`` then the ``t`` new ones, or only the new ones without ``cache``); ``cache`` keys/values
        ``[b, kv_heads, window, head_dim]``.  Returns the output and the new cache."""
        s = self.s
        b, t = x.shape[0], x.shape[1]
        h, kvh, hd = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        a = self.self_attn
        y = self.input_layernorm(x)

        def heads(v: TensorValue, n: int) -> TensorValue:
            return ops.transpose(ops.reshape(v, [b, t, n, hd]), 1, 2)

        q = _rotate(heads(a.q_proj(y), h), cos, sin)
        k = _rotate(heads(a.k_proj(y), kvh), cos, sin)
        v = heads(a.v_proj(y), kvh)
        new_cache = None
        if cache is not None:
            k = ops.concat([cache[0], k], axis=2)
            v = ops.concat([cache[1], v], axis=2)
            new_cache = (k[:, :, -self.window:, :], v[:, :, -self.window:, :])
        if h != kvh:
            k = ops.repeat_interleave(k, h // kvh, axis=1)
            v = ops.repeat_interleave(v, h // kvh, axis=1)
        scores = (q @ ops.transpose(k, -1, -2)) * (1.0 / math.sqrt(hd))
        scores = ops.where(mask, scores, float("-inf"))
        ctx = ops.softmax(scores) @ v  # [b, h, t, hd]
        ctx = ops.reshape(ops.transpose(ctx, 1, 2), [b, t, h * hd])
        x = x + a.o_proj(ctx) * self.self_attn_layer_scale.scale
        m = self.mlp
        x = x + m.fc2(self._act(m.fc1(self.post_attention_layernorm(x)))) * self.mlp_layer_scale.scale
        return x, new_cache


def rope_and_mask(inv_freq: np.ndarray, offsets: TensorValue, t: object, window: int, cached: bool,
                  device: DeviceRef = CPU) -> tuple[TensorValue, TensorValue, TensorValue]:
    """cos/sin ``[b, 1, t, head_dim]`` of each row's positions ``offsets[row] + [0, t)`` (``offsets`` int64 ``[b]``)
    and the sliding-window causal mask ``[b, 1, t, keys]`` (keys: ``window`` cached positions
    ``offset - window + j`` when ``cached``, then the new ones)."""
    off = ops.unsqueeze(offsets, 1)  # [b, 1]
    qpos = ops.unsqueeze(ops.range(0, t, 1, out_dim=t, dtype=DType.int64, device=device), 0) + off  # [b, t]
    freqs = ops.unsqueeze(ops.cast(qpos, F32), 2) * ops.constant(inv_freq, F32, device)
    emb = ops.unsqueeze(ops.concat([freqs, freqs], axis=-1), 1)
    kpos = qpos
    if cached:
        past = ops.unsqueeze(ops.range(-window, 0, 1, out_dim=window, dtype=DType.int64, device=device), 0) + off
        kpos = ops.concat([past, qpos], axis=1)
    qp, kp = ops.unsqueeze(qpos, 2), ops.unsqueeze(kpos, 1)  # [b, t, 1], [b, 1, keys]
    mask = ops.logical_and(ops.logical_and(kp <= qp, kp > qp - window), kp >= 0)
    return ops.cos(emb), ops.sin(emb), ops.unsqueeze(mask, 1)
