"""Gemma 4's attention, scaled decoder layer and pipeline model (see the package docstring).

Global and sliding-window layers may differ in head size and KV heads; the paged cache holds the
largest of each.  A layer with smaller heads writes its q/k/v zero-padded to the cache's head size
(zeros change no dot product and give zero output dims, which are dropped), and a layer with fewer KV
heads writes each head repeated (query head ``h`` still reads its own group's keys).
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kernels_decoder import ragged_rope, ragged_rope_tables, ragged_write_plan
from max.nn.kv_cache import KVCacheParams
from max.nn.layer import Module
from max.nn.norm import RMSNorm
from max.nn.rotary_embedding import rope_from_hf
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.layers import DecoderLayer, build_decoder
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.common.weights import WeightFactory, standard_adapters
from max.pipelines.architectures.gemma4.config import config_from_hf


class Gemma4Attention(Module):
    """One layer's attention: q/k/v projections of the layer's head size, per-head RMSNorm of q and k and
    a weightless one of v, RoPE of the layer's kind, softmax scale 1, the layer's window (sliding
    layers); global layers with ``attention_k_eq_v`` take the keys' projection as values."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: KVCacheParams,
                 max_seq_len: int) -> None:
        super().__init__()
        e = cfg.extra
        kind = cfg.layer_types[layer]
        H, d, hkv, hidden = cfg.num_attention_heads, e["head_dims"][layer], e["kv_heads"][layer], cfg.hidden_size
        self.H, self.d, self.hkv, self.layer, self.kv_params = H, d, hkv, layer, kv_params
        self.window = cfg.layer_window(layer)
        self.eps = cfg.rms_norm_eps
        p = f"layers.{layer}.self_attn"
        bias = cfg.attention_bias
        self.q_proj = factory.linear(f"{p}.q_proj", hidden, H * d, bias)
        self.k_proj = factory.linear(f"{p}.k_proj", hidden, hkv * d, bias)
        self.k_eq_v = bool(e["k_eq_v"]) and kind == "full_attention"
        if not self.k_eq_v:
            self.v_proj = factory.linear(f"{p}.v_proj", hidden, hkv * d, bias)
        self.o_proj = factory.linear(f"{p}.o_proj", H * d, hidden, cfg.o_proj_bias)
        self.q_norm = RMSNorm(d, factory.dtype, cfg.rms_norm_eps, multiply_before_cast=True)
        self.k_norm = RMSNorm(d, factory.dtype, cfg.rms_norm_eps, multiply_before_cast=True)
        rp = dict(e["rope_parameters"][kind])
        theta = float(rp.get("rope_theta") or (1e6 if kind == "full_attention" else 1e4))
        try:
            self.rope = rope_from_hf(rp, max_position_embeddings=cfg.max_position_embeddings, dim=H * d, n_heads=H,
                                     theta=theta, max_seq_len=max_seq_len, device=factory.device, head_dim=d,
                                     interleaved=False)
        except NotImplementedError as err:
            raise NotImplementedError(f"{cfg.architecture}: {err}") from None

    def _v_norm(self, v: TensorValue) -> TensorValue:
        vf = v.cast(DType.float32)
        return (vf * ops.rsqrt(ops.mean(vf * vf, axis=-1) + self.eps)).cast(v.dtype)

    def _to_cache(self, x: TensorValue, heads: int) -> TensorValue:
        """``[T, n, d]`` -> ``[T, heads * D]``: heads repeated to ``heads``, dims zero-padded to the cache's."""
        T, n, D = x.shape[0], int(x.shape[1]), self.kv_params.head_dim
        if heads != n:
            r = heads // n
            x = ops.reshape(ops.broadcast_to(ops.unsqueeze(x, 2), [T, n, r, self.d]), [T, heads, self.d])
        if D != self.d:
            zeros = ops.broadcast_to(ops.constant(0.0, x.dtype, x.device), [T, heads, D - self.d])
            x = ops.concat([x, zeros], axis=-1)
        return ops.reshape(x, [T, heads * D])

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        H, d, hkv = self.H, self.d, self.hkv
        T = x.shape[0]
        q = self.q_norm(ops.reshape(self.q_proj(x), [T, H, d]))
        k_raw = ops.reshape(self.k_proj(x), [T, hkv, d])
        v = self._v_norm(k_raw if self.k_eq_v else ops.reshape(self.v_proj(x), [T, hkv, d]))
        k = self.k_norm(k_raw)
        positions, _, _ = ragged_write_plan(input_row_offsets, kv_collection)
        cos, sin = ragged_rope_tables(self.rope.freqs_cis, positions)
        q, k = ragged_rope(q, cos, sin, False), ragged_rope(k, cos, sin, False)
        heads = self.kv_params.n_kv_heads
        qkv = ops.concat([self._to_cache(q, H), self._to_cache(k, heads), self._to_cache(v, heads)], axis=-1)
        qs = kernels.ragged_qkv_store(self.kv_params, qkv, input_row_offsets, kv_collection, self.layer, H)
        variant = MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK if self.window else MHAMaskVariant.CAUSAL_MASK
        o = kernels.flash_attention_ragged(self.kv_params, qs, input_row_offsets, kv_collection, layer_idx, variant,
                                           1.0, local_window_size=self.window or -1)
        return self.o_proj(ops.reshape(o[:, :, :d], [T, H * d]))


class Gemma4Layer(DecoderLayer):
    """The decoder layer (Gemma 3's four norms) with its output multiplied by ``layer_scalar``."""

    def __init__(self, cfg: DecoderConfig, attention: Module, mlp: Module, dtype: DType, device: DeviceRef) -> None:
        super().__init__(cfg, attention, mlp, dtype)
        self.layer_scalar = Weight("layer_scalar", dtype, [1], device)

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        return super().__call__(layer_idx, x, kv_collection, freqs_cis, input_row_offsets) * self.layer_scalar


class Gemma4Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = standard_adapters()

    @classmethod
    def unsupported_reason(cls, hf: dict) -> str | None:
        """Why this config is not run natively (see the package docstring; the registry then uses the
        transformers fallback when allowed), else None."""
        try:
            config_from_hf(hf)
        except NotImplementedError as e:
            return str(e)
        return None

    @classmethod
    def kv_cache_shape(cls, cfg: DecoderConfig) -> tuple[int, int]:
        """The most KV heads and the largest head size of any layer."""
        return max(cfg.extra["kv_heads"]), max(cfg.extra["head_dims"])

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams,
                     max_seq_len: int) -> Any:
        return build_decoder(cfg, factory, kv_params, max_seq_len,
                             make_attention=lambda c, i, f, kvp, n: Gemma4Attention(c, i, f, kvp, n),
                             make_layer=lambda c, i, a, m, dt: Gemma4Layer(c, a, m, dt, factory.device))
