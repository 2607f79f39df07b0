"""``AttentionWithRope`` / ``RaggedAttention``: attention over ragged batches and the paged KV cache.

Weights follow Hugging Face names: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``
(``{name}.weight`` / ``.bias``), or one stacked ``qkv_proj.weight`` when
``stacked_qkv=True``.  Per layer: QKV projection (K and V written to the
cache), RoPE on Q and this step's K, flash attention over each request's
cached positions, output projection.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kv_cache.cache_params import KVCacheParams
from max.nn.layer import Module
from max.nn.linear import Linear
from max.nn.norm import RMSNorm

__all__ = ["AttentionWithRope", "AttentionWithRopeNoOpaque", "AttentionWithRopeQKV", "AttentionWithRopeV1",
           "DistributedAttentionWithRope", "GGUFQAttentionWithRope", "GPTQAttentionWithRope", "RaggedAttention",
           "distribute_value"]


class _RaggedAttentionBase(Module):
    def __init__(self, *, num_attention_heads: int, num_key_value_heads: int, hidden_size: int,
                 kv_params: KVCacheParams, devices: Sequence[DeviceRef] | None = None, dtype: DType = DType.float32,
                 linear_cls: Callable[..., Linear] = Linear, stacked_qkv: bool = False, scale: float | None = None,
                 has_bias: bool = False, clip_qkv: float | None = None, head_dim: int | None = None,
                 qk_norm_eps: float | None = None) -> None:
        super().__init__()
        name = type(self).__name__
        if num_attention_heads % num_key_value_heads:
            raise ValueError(f"{name}: num_attention_heads ({num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_key_value_heads})")
        self.n_heads = num_attention_heads
        self.n_kv_heads = num_key_value_heads
        self.hidden_size = hidden_size
        self.kv_params = kv_params
        self.head_dim = head_dim or kv_params.head_dim
        if self.head_dim != kv_params.head_dim:
            raise ValueError(f"{name}: head_dim {self.head_dim} != kv_params.head_dim {kv_params.head_dim}")
        self.devices = list(devices) if devices else [DeviceRef.CPU()]
        dev = self.devices[0]
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.stacked_qkv = stacked_qkv
        self.clip_qkv = clip_qkv
        self.has_bias = has_bias
        qd, kd = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        if stacked_qkv:
            self.qkv_proj = Weight("qkv_proj.weight", dtype, [qd + 2 * kd, hidden_size], dev)
        else:
            self.q_proj = linear_cls(hidden_size, qd, dtype, dev, has_bias=has_bias)
            self.k_proj = linear_cls(hidden_size, kd, dtype, dev, has_bias=has_bias)
            self.v_proj = linear_cls(hidden_size, kd, dtype, dev, has_bias=has_bias)
        self.o_proj = linear_cls(qd, hidden_size, dtype, dev)
        self.qk_norm = qk_norm_eps is not None
        if self.qk_norm:  # Qwen3: per-head RMSNorm of q and k before RoPE
            self.q_norm = RMSNorm(self.head_dim, dtype, qk_norm_eps, multiply_before_cast=False)
            self.k_norm = RMSNorm(self.head_dim, dtype, qk_norm_eps, multiply_before_cast=False)

    @property
    def wqkv(self) -> TensorValue:
        """The concatenation of the q, k and v weights ``[(H + 2 Hkv) * D, hidden]``."""
        if self.stacked_qkv:
            w = self.qkv_proj
        else:
            w = ops.concat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], axis=0)
        if self.clip_qkv is not None:
            c = float(self.clip_qkv)
            w = ops.min(ops.max(w, -c), c)
        return w

    @property
    def wqkv_bias(self) -> TensorValue | None:
        if not self.has_bias or self.stacked_qkv:
            return None
        return ops.concat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], axis=0)

    def _norm_gamma(self, norm: RMSNorm) -> TensorValue:
        w: TensorValue = norm.weight
        return w + norm.weight_offset if norm.weight_offset else w

    def _qkv_store(self, layer_idx: Any, x: TensorValue, kv_collection: Any, input_row_offsets: Any,
                   freqs_cis: Any, interleaved: bool) -> TensorValue:
        """Project q/k/v (each projection its own Linear: quantised, biased, per-weight encodings), then
        one ragged_qkv_store: QK-norm, RoPE, K/V into the cache; returns Q [T, H, D]."""
        if self.stacked_qkv:
            qkv = x @ ops.transpose(self.qkv_proj, 0, 1)
        else:
            qkv = ops.concat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=-1)
        q_norm = k_norm = None
        eps = 1e-6
        if self.qk_norm:
            q_norm, k_norm, eps = self._norm_gamma(self.q_norm), self._norm_gamma(self.k_norm), self.q_norm.eps
        return kernels.ragged_qkv_store(self.kv_params, qkv, input_row_offsets, kv_collection, layer_idx, self.n_heads,
                                        freqs_cis=freqs_cis, interleaved=interleaved, q_norm=q_norm, k_norm=k_norm,
                                        norm_eps=eps)

    def _qkv(self, layer_idx: Any, x: TensorValue, kv_collection: Any, input_row_offsets: Any) -> TensorValue:
        q = kernels.fused_qkv_ragged_matmul(self.kv_params, x, input_row_offsets, self.wqkv, kv_collection,
                                            layer_idx, self.n_heads, bias=self.wqkv_bias)
        q = ops.reshape(q, [-1, self.n_heads, self.head_dim])
        if self.qk_norm:
            q = self.q_norm(q)
            kernels.rms_norm_key_cache(self.kv_params, kv_collection, self.k_norm.weight, self.k_norm.eps, layer_idx,
                                       x.shape[0], input_row_offsets, multiply_before_cast=False)
        return q

    def _attend(self, layer_idx: Any, x: TensorValue, q: TensorValue, kv_collection: Any, input_row_offsets: Any,
                mask_variant: MHAMaskVariant, window: int = -1) -> TensorValue:
        attn = kernels.flash_attention_ragged(self.kv_params, q, input_row_offsets, kv_collection, layer_idx,
                                              mask_variant, self.scale, local_window_size=window)
        return self.o_proj(ops.reshape(attn, [x.shape[0], self.n_heads * self.head_dim]))


class AttentionWithRope(_RaggedAttentionBase):
    """Attention with rotary position embeddings over the paged KV cache."""

    def __init__(self, *, rope: Any, num_attention_heads: int, num_key_value_heads: int, hidden_size: int,
                 kv_params: KVCacheParams, devices: Sequence[DeviceRef] | None = None, dtype: DType = DType.float32,
                 linear_cls: Callable[..., Linear] = Linear, stacked_qkv: bool = False, scale: float | None = None,
                 has_bias: bool = False, float8_config: Any = None, clip_qkv: float | None = None,
                 head_dim: int | None = None, qk_norm_eps: float | None = None,
                 sliding_window: int | None = None) -> None:
        if float8_config is not None:
            raise NotImplementedError("AttentionWithRope: float8_config is not supported yet")
        super().__init__(num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                         hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=dtype,
                         linear_cls=linear_cls, stacked_qkv=stacked_qkv, scale=scale, has_bias=has_bias,
                         clip_qkv=clip_qkv, head_dim=head_dim, qk_norm_eps=qk_norm_eps)
        self.rope = rope
        self.sliding_window = sliding_window

    @property
    def qkv_input_scale(self) -> None:
        return None

    @property
    def qkv_weight_scale(self) -> None:
        return None

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: TensorValue,
                 input_row_offsets: TensorValue) -> TensorValue:
        if self.clip_qkv is None:
            q = self._qkv_store(layer_idx, x, kv_collection, input_row_offsets, freqs_cis, self.rope.interleaved)
        else:
            q = self._qkv(layer_idx, x, kv_collection, input_row_offsets)
            q = kernels.fused_qk_ragged_rope(self.kv_params, q, input_row_offsets, kv_collection, freqs_cis,
                                             layer_idx, interleaved=self.rope.interleaved)
        variant = MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK if self.sliding_window else MHAMaskVariant.CAUSAL_MASK
        return self._attend(layer_idx, x, q, kv_collection, input_row_offsets, variant, self.sliding_window or -1)


AttentionWithRopeNoOpaque = AttentionWithRope


class DistributedAttentionWithRope(AttentionWithRope):
    """:class:`AttentionWithRope` split over ``devices`` (at least 2) by heads: each device projects
    its ``num_attention_heads / n`` query heads and ``num_key_value_heads / n`` KV heads (rows of
    q/k/v_proj), keeps those KV heads in its own page pool (``kv_params.n_devices == n``), attends,
    and applies its columns of ``o_proj``; the partial outputs are all-reduced.  Weights keep the
    names and full shapes of :class:`AttentionWithRope` (one checkpoint loads either).

    Called as ``attn(layer_idx, xs, signal_buffers, kv_collections, freqs_cis, input_row_offsets)``
    with one hidden state, KV collection (and optionally layer index, RoPE table and row offsets) per
    device; returns the attention output on every device.
    """

    def __init__(self, *, devices: Sequence[DeviceRef] | None = None, **kwargs: Any) -> None:
        devs = list(devices or [])
        if len(devs) < 2:
            raise ValueError(f"DistributedAttentionWithRope: needs at least 2 devices, got {len(devs)}")
        n = len(devs)
        for what in ("num_attention_heads", "num_key_value_heads"):
            if kwargs.get(what, 0) % n:
                raise ValueError(f"DistributedAttentionWithRope: {what} = {kwargs.get(what)} does not split evenly "
                                 f"across {n} devices")
        if kwargs.get("stacked_qkv") or kwargs.get("clip_qkv") is not None:
            raise NotImplementedError("DistributedAttentionWithRope: stacked_qkv and clip_qkv are not supported")
        kvp = kwargs.get("kv_params")
        if kvp is not None and kvp.n_devices != n:
            raise ValueError(f"DistributedAttentionWithRope: kv_params.n_devices is {kvp.n_devices}, expected {n} "
                             "(each device caches its share of the KV heads)")
        super().__init__(devices=devs, **kwargs)

    def shard(self, devices: Sequence[DeviceRef]) -> list[AttentionWithRope]:
        """One :class:`AttentionWithRope` per device over its heads (outputs sum to the full output)."""
        from max.graph.weight import ShardingStrategy

        devs = list(devices)
        key = tuple(devs)
        cache = self.__dict__.setdefault("_max_nn_tp_shards", {})
        if key in cache:
            return cache[key]
        n = len(devs)
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            lin.sharding_strategy = ShardingStrategy.rowwise(n)
        self.o_proj.sharding_strategy = ShardingStrategy.columnwise(n)
        qs, ks, vs, os_ = (lin.shard(devs) for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj))
        norms: list[Any] = [(None, None)] * n
        if self.qk_norm:
            from max.nn.transformer.distributed_transformer import replicate_on

            norms = list(zip(replicate_on(self.q_norm, devs), replicate_on(self.k_norm, devs)))
        out = []
        for i, dev in enumerate(devs):
            sh = AttentionWithRope.__new__(AttentionWithRope)
            Module.__init__(sh)
            sh.n_heads, sh.n_kv_heads = self.n_heads // n, self.n_kv_heads // n
            sh.hidden_size, sh.kv_params, sh.head_dim = self.hidden_size, self.kv_params, self.head_dim
            sh.devices, sh.scale, sh.stacked_qkv, sh.clip_qkv = [dev], self.scale, False, None
            sh.has_bias, sh.rope, sh.sliding_window, sh.qk_norm = self.has_bias, self.rope, self.sliding_window, \
                self.qk_norm
            sh.q_proj, sh.k_proj, sh.v_proj, sh.o_proj = qs[i], ks[i], vs[i], os_[i]
            if self.qk_norm:
                sh.q_norm, sh.k_norm = norms[i]
            out.append(sh)
        cache[key] = out
        return out

    def __call__(self, layer_idx: Any, xs: Any, signal_buffers: Any, kv_collections: Any,  # type: ignore[override]
                 freqs_cis: Any, input_row_offsets: Any) -> list[TensorValue]:
        from max.nn.layer import on_device
        from max.nn.linear import allreduce_parts

        devs = self.devices
        n = len(devs)

        def per_device(v: Any, what: str) -> list[Any]:
            if isinstance(v, (list, tuple)):
                if len(v) != n:
                    raise ValueError(f"{self._layer_name}: got {len(v)} {what} for {n} devices")
                return list(v)
            return [on_device(v, d) if v is not None else None for d in devs]

        xs = per_device(xs, "hidden states")
        kvs = per_device(kv_collections, "KV collections") if isinstance(kv_collections, (list, tuple)) else None
        if kvs is None:
            raise ValueError(f"{self._layer_name}: kv_collections must hold one KV collection per device")
        parts = [sh(li, x, kv, f, o) for sh, li, x, kv, f, o in
                 zip(self.shard(devs), per_device(layer_idx, "layer indices"), xs, kvs,
                     per_device(freqs_cis, "RoPE tables"), per_device(input_row_offsets, "row offsets"))]
        return allreduce_parts(parts, devs, signal_buffers)


class RaggedAttention(_RaggedAttentionBase):
    """Attention without positional rotation; the mask variant is fixed at construction."""

    def __init__(self, *, mask_variant: MHAMaskVariant, num_attention_heads: int, num_key_value_heads: int,
                 hidden_size: int, kv_params: KVCacheParams, devices: Sequence[DeviceRef] | None = None,
                 dtype: DType = DType.float32, linear_cls: Callable[..., Linear] = Linear, stacked_qkv: bool = False,
                 scale: float | None = None, has_bias: bool = False, clip_qkv: float | None = None) -> None:
        super().__init__(num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                         hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=dtype,
                         linear_cls=linear_cls, stacked_qkv=stacked_qkv, scale=scale, has_bias=has_bias,
                         clip_qkv=clip_qkv)
        self.mask_variant = MHAMaskVariant(mask_variant)

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, input_row_offsets: TensorValue,
                 **kwargs: Any) -> TensorValue:
        if self.clip_qkv is None:
            q = self._qkv_store(layer_idx, x, kv_collection, input_row_offsets, None, False)
        else:
            q = self._qkv(layer_idx, x, kv_collection, input_row_offsets)
        return self._attend(layer_idx, x, q, kv_collection, input_row_offsets, self.mask_variant)


# ----------------------------------------------------------------- deprecated dataclass-style layers and the
# quantised variants
from dataclasses import dataclass  # noqa: E402
from functools import partial  # noqa: E402

from max.graph.ops._common import as_tensor  # noqa: E402
from max.graph.quantization import QuantizationConfig, QuantizationEncoding  # noqa: E402
from max.nn.attention.interfaces import AttentionImpl, AttentionImplQKV, required_kwargs  # noqa: E402
from max.nn.linear import GPTQLinear  # noqa: E402
from max.nn.transformer.distributed_transformer import distribute_value  # noqa: E402,F401


def _rope_attention(kv_params: KVCacheParams, n_heads: int, scale: float, rope: Any, q: TensorValue, x: TensorValue,
                    kv_collection: Any, kwargs: dict[str, Any], layer_idx: Any, input_row_offsets: Any,
                    wo: Any) -> TensorValue:
    """RoPE on ``q`` ``[T, n_heads * head_dim]`` and this step's cached K, causal attention, ``wo``."""
    D = kv_params.head_dim
    freqs = kwargs.get("freqs_cis")
    freqs = rope.freqs_cis if freqs is None else freqs
    q = ops.reshape(q, [-1, n_heads, D])
    q = kernels.fused_qk_ragged_rope(kv_params, q, input_row_offsets, kv_collection, freqs, layer_idx,
                                     interleaved=getattr(rope, "interleaved", True))
    attn = kernels.flash_attention_ragged(kv_params, q, input_row_offsets, kv_collection, layer_idx,
                                          MHAMaskVariant.CAUSAL_MASK, scale)
    return wo(ops.reshape(attn, [x.shape[0], n_heads * D]))


@dataclass(eq=False)
class AttentionWithRopeV1(AttentionImpl):
    """Deprecated (use :class:`AttentionWithRope`): attention with RoPE from graph values -- a stacked
    ``wqkv`` ``[(n_heads + 2 n_kv_heads) * head_dim, hidden]`` (GPTQ-quantised when
    ``quantization_config`` is set, with ``perm_idx`` for act-order), optional ``bias``, ``wo``.

    Called as ``attn(x, kv_collection, input_row_offsets=..., layer_idx=...)`` (``freqs_cis`` defaults
    to ``rope.freqs_cis``); ValueError when a keyword is missing."""

    rope: Any = None
    bias: Any = None
    perm_idx: Any = None
    quantization_config: QuantizationConfig | None = None

    def __call__(self, x: Any, kv_collection: Any, **kwargs: Any) -> TensorValue:
        input_row_offsets, layer_idx = required_kwargs(self, kwargs, "input_row_offsets", "layer_idx")
        if self.rope is None:
            raise ValueError("AttentionWithRopeV1: rope is required")
        xv = as_tensor(x, op="AttentionWithRopeV1", arg="x")
        if self.quantization_config is not None:
            q = kernels.fused_qkv_ragged_matmul_quantized(self.kv_params, xv, input_row_offsets, self.wqkv,
                                                          kv_collection, layer_idx, self.n_heads,
                                                          self.quantization_config, perm_idx=self.perm_idx,
                                                          bias=self.bias)
        else:
            q = kernels.fused_qkv_ragged_matmul(self.kv_params, xv, input_row_offsets, self.wqkv, kv_collection,
                                                layer_idx, self.n_heads, bias=self.bias)
        return _rope_attention(self.kv_params, self.n_heads, self.scale, self.rope, q, xv, kv_collection, kwargs,
                               layer_idx, input_row_offsets, self.wo)


@dataclass(eq=False)
class AttentionWithRopeQKV(AttentionImplQKV):
    """:class:`AttentionWithRopeV1` with separate ``wq``, ``wk``, ``wv`` weights (stacked at call time)."""

    rope: Any = None

    def __call__(self, x: Any, kv_collection: Any, **kwargs: Any) -> TensorValue:
        input_row_offsets, layer_idx = required_kwargs(self, kwargs, "input_row_offsets", "layer_idx")
        if self.rope is None:
            raise ValueError("AttentionWithRopeQKV: rope is required")
        xv = as_tensor(x, op="AttentionWithRopeQKV", arg="x")
        wqkv = ops.concat([as_tensor(w, op="AttentionWithRopeQKV", arg=n)
                           for w, n in ((self.wq, "wq"), (self.wk, "wk"), (self.wv, "wv"))], axis=0)
        q = kernels.fused_qkv_ragged_matmul(self.kv_params, xv, input_row_offsets, wqkv, kv_collection, layer_idx,
                                            self.n_heads)
        return _rope_attention(self.kv_params, self.n_heads, self.scale, self.rope, q, xv, kv_collection, kwargs,
                               layer_idx, input_row_offsets, self.wo)


class GGUFQAttentionWithRope(AttentionWithRope):
    """:class:`AttentionWithRope` whose q/k/v/o projections hold GGML-block-quantised weights (uint8
    ``[rows, bytes]``, ``quantization_encoding``); activations are float32.  Without bias or clipping the
    QKV projection runs ``max.nn.kernels.unfused_qkv_ragged_matmul_gguf_quantized``."""

    def __init__(self, *, rope: Any, num_attention_heads: int, num_key_value_heads: int, hidden_size: int,
                 kv_params: KVCacheParams, dtype: DType, quantization_encoding: QuantizationEncoding,
                 devices: Sequence[DeviceRef] | None = None, linear_cls: Callable[..., Linear] = Linear,
                 scale: float | None = None, has_bias: bool = False, clip_qkv: float | None = None) -> None:
        if not isinstance(quantization_encoding, QuantizationEncoding) or \
                quantization_encoding is QuantizationEncoding.GPTQ:
            raise ValueError(f"GGUFQAttentionWithRope: quantization_encoding must be a GGML block encoding, got "
                             f"{quantization_encoding!r}")
        if dtype != DType.uint8:
            raise ValueError(f"GGUFQAttentionWithRope: dtype must be uint8 (the quantised storage), got {dtype}")
        if clip_qkv is not None:
            raise NotImplementedError("GGUFQAttentionWithRope: clip_qkv cannot clamp quantised weights")
        self.quantization_encoding = quantization_encoding
        super().__init__(rope=rope, num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                         hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=DType.float32,
                         linear_cls=partial(linear_cls, quantization_encoding=quantization_encoding), scale=scale,
                         has_bias=has_bias)

    @property
    def wqkv(self) -> TensorValue:
        """The q, k and v weights' quantised rows, stacked ``[(H + 2 Hkv) * D, bytes]``."""
        return ops.concat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], axis=0)

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: TensorValue,
                 input_row_offsets: TensorValue) -> TensorValue:
        if self.has_bias:  # the biased projections: each Linear applies its bias
            return super().__call__(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)
        enc = self.quantization_encoding
        q = kernels.unfused_qkv_ragged_matmul_gguf_quantized(
            self.kv_params, x, input_row_offsets, self.n_heads, self.q_proj.weight, self.k_proj.weight,
            self.v_proj.weight, enc, enc, enc, kv_collection, layer_idx)
        return _rope_attention(self.kv_params, self.n_heads, self.scale, self.rope, q, x, kv_collection,
                               {"freqs_cis": freqs_cis}, layer_idx, input_row_offsets, self.o_proj)


class GPTQAttentionWithRope(AttentionWithRope):
    """:class:`AttentionWithRope` whose q/k/v projections are :class:`~max.nn.linear.GPTQLinear` layers
    (GPTQ-packed weights with ``quantization_config``; ``perm_idx`` when ``desc_act``); the output
    projection is ``linear_cls`` in ``dtype``."""

    def __init__(self, quantization_config: QuantizationConfig, rope: Any, num_attention_heads: int,
                 num_key_value_heads: int, hidden_size: int, kv_params: KVCacheParams,
                 devices: Sequence[DeviceRef] | None = None, dtype: DType = DType.float32, scale: float | None = None,
                 linear_cls: Callable[..., Linear] = Linear) -> None:
        if quantization_config is None:
            raise ValueError("GPTQAttentionWithRope: quantization_config is required")
        self.quantization_config = quantization_config
        super().__init__(rope=rope, num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                         hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=dtype,
                         linear_cls=linear_cls, scale=scale)
        dev = self.devices[0]
        qd, kd = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        gptq = partial(GPTQLinear, dtype=dtype, device=dev, quantization_encoding=QuantizationEncoding.GPTQ,
                       quantization_config=quantization_config)
        self.q_proj = gptq(hidden_size, qd)
        self.k_proj = gptq(hidden_size, kd)
        self.v_proj = gptq(hidden_size, kd)

    @property
    def wqkv(self) -> TensorValue:
        """The q, k and v projections' packed GPTQ weights, stacked along the output features."""
        ws = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        return ops.concat(ws, axis=0)
