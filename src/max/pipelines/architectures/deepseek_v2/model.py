"""DeepSeek-V2's multi-head latent attention and its pipeline model.

Per token the paged cache holds the compressed KV: the normalised ``kv_lora_rank`` latent and the
shared RoPE key (``qk_rope_head_dim``), split in half across the cache's K and V planes (one KV head of
``(kv_lora_rank + qk_rope_head_dim) / 2``), so the cache is exactly the latent's size.  Attention is
always absorbed: each head's query becomes ``[W_uk^T q_nope, q_pe]`` and attends over the latent rows
(values = the latent part), and ``W_uv`` maps the result back to ``v_head_dim`` (``W_uk``, ``W_uv`` are
``kv_b_proj``'s rows).  Prefill uses the same absorbed form.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from max.graph import TensorValue, ops
from max.nn.kernels import MHAMaskVariant, flare_mla_decode_ragged
from max.nn.kernels_decoder import ragged_rope, ragged_write_plan, store_kv_ragged
from max.nn.kv_cache import KVCacheParams
from max.nn.layer import Module
from max.nn.norm import RMSNorm
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.layers import build_decoder, make_rope
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.deepseek_v2.config import config_from_hf
from max.pipelines.architectures.deepseek_v2.weight_adapters import WEIGHT_ADAPTERS

_LATENT_NORM_EPS = 1e-6  # transformers builds the q/kv latent norms with RMSNorm's default epsilon


class MLAttention(Module):
    """Multi-head latent attention of one layer (see the module docstring)."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: KVCacheParams,
                 max_seq_len: int) -> None:
        super().__init__()
        e = cfg.extra
        p = f"layers.{layer}.self_attn"
        H, hidden = cfg.num_attention_heads, cfg.hidden_size
        self.H, self.layer, self.kv_params, self.scale = H, layer, kv_params, cfg.attention_scale
        self.nope, self.rope_dim, self.v_dim = e["qk_nope_head_dim"], e["qk_rope_head_dim"], e["v_head_dim"]
        self.lora = e["kv_lora_rank"]
        qk = self.nope + self.rope_dim
        dt = factory.dtype
        self.q_lora = e["q_lora_rank"]
        if self.q_lora:
            self.q_a_proj = factory.linear(f"{p}.q_a_proj", hidden, self.q_lora, cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(self.q_lora, dt, _LATENT_NORM_EPS, multiply_before_cast=False)
            self.q_b_proj = factory.linear(f"{p}.q_b_proj", self.q_lora, H * qk)
        else:
            self.q_proj = factory.linear(f"{p}.q_proj", hidden, H * qk)
        self.kv_a_proj_with_mqa = factory.linear(f"{p}.kv_a_proj_with_mqa", hidden, self.lora + self.rope_dim,
                                                 cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.lora, dt, _LATENT_NORM_EPS, multiply_before_cast=False)
        self.kv_b_proj = factory.linear(f"{p}.kv_b_proj", self.lora, H * (self.nope + self.v_dim))
        self.o_proj = factory.linear(f"{p}.o_proj", H * self.v_dim, hidden, cfg.o_proj_bias)
        rope_cfg = dataclasses.replace(cfg, head_dim=self.rope_dim, partial_rotary_factor=1.0)
        self.rope = make_rope(rope_cfg, max_seq_len, factory.device)

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        H, nope, rd, L, vd = self.H, self.nope, self.rope_dim, self.lora, self.v_dim
        T = x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        q = ops.reshape(q, [-1, H, nope + rd])
        q_nope, q_pe = q[:, :, :nope], q[:, :, nope:]
        kv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(kv[:, :L])
        k_pe = ops.reshape(kv[:, L:], [-1, 1, rd])
        positions, page, offset = ragged_write_plan(input_row_offsets, kv_collection)
        cos, sin = self.rope.tables(positions)
        q_pe = ragged_rope(q_pe, cos, sin, self.rope.interleaved)
        k_pe = ragged_rope(k_pe, cos, sin, self.rope.interleaved)
        row = ops.concat([latent, ops.reshape(k_pe, [-1, rd])], axis=-1)  # [T, L + rd]
        half = (L + rd) // 2
        store_kv_ragged(self.kv_params, ops.reshape(row[:, :half], [-1, 1, half]),
                        ops.reshape(row[:, half:], [-1, 1, half]), kv_collection, page, offset, self.layer)
        w = self.kv_b_proj.weight  # the absorbed form needs the matrix itself (a quantised one, dequantised)
        if getattr(self.kv_b_proj, "quantization_encoding", None) is not None:
            w = ops.dequantize(self.kv_b_proj.quantization_encoding, w)
        w = ops.reshape(w.cast(x.dtype), [H, nope + vd, L])
        q_lat = ops.transpose(ops.transpose(q_nope, 0, 1) @ w[:, :nope, :], 0, 1)  # [T, H, L]
        query = ops.concat([q_lat, q_pe], axis=-1)
        o_lat = flare_mla_decode_ragged(self.kv_params, query, input_row_offsets, kv_collection, layer_idx,
                                        MHAMaskVariant.CAUSAL_MASK, self.scale, qk_rope_dim=rd)  # [T, H, L]
        o = ops.transpose(ops.transpose(o_lat, 0, 1) @ ops.transpose(w[:, nope:, :], 1, 2), 0, 1)  # [T, H, vd]
        return self.o_proj(ops.reshape(o, [T, H * vd]))


class DeepseekV2Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def kv_cache_shape(cls, cfg: DecoderConfig) -> tuple[int, int]:
        """One KV head of half the latent row: K and V planes hold its two halves."""
        width = cfg.extra["kv_lora_rank"] + cfg.extra["qk_rope_head_dim"]
        if width % 2:
            raise NotImplementedError(f"{cfg.architecture}: kv_lora_rank + qk_rope_head_dim must be even, got {width}")
        return 1, width // 2

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams,
                     max_seq_len: int) -> Module:
        return build_decoder(cfg, factory, kv_params, max_seq_len,
                             make_attention=lambda c, i, f, kvp, n: MLAttention(c, i, f, kvp, n))
