"""Llama 4's attention, router and pipeline model (see the package docstring)."""

from __future__ import annotations

import logging
from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.nn.kernels_decoder import ragged_write_plan
from max.nn.kv_cache import KVCacheParams
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.layers import DecoderAttention, build_decoder, default_mlp, make_rope
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.common.moe import DecoderMoE
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.llama4.config import config_from_hf
from max.pipelines.architectures.llama4.weight_adapters import WEIGHT_ADAPTERS

logger = logging.getLogger("max.pipelines")


class _L2Norm:
    """The weightless per-head norm ``x * rsqrt(mean(x^2) + eps)`` in the form the attention's fused
    per-head norm takes (a weight of ones).  On the whole rotated head it commutes with RoPE (a
    rotation), so normalising before the rotation equals transformers' after."""

    weight_offset = 0.0

    def __init__(self, dim: int, eps: float) -> None:
        self.dim, self.eps = dim, eps

    @property
    def weight(self) -> TensorValue:
        return ops.broadcast_to(ops.constant(1.0, DType.float32, DeviceRef.CPU()), [self.dim])


class Llama4Attention(DecoderAttention):
    """RoPE layers: q/k L2-normalised per head, chunked local attention (``attention_chunk_size``); NoPE
    layers: global causal attention, queries scaled by ``log1p(floor((position + 1) / floor_scale)) *
    attn_scale + 1`` (temperature tuning)."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: KVCacheParams,
                 max_seq_len: int) -> None:
        nope = layer in cfg.no_rope_layers
        rope = None if nope else make_rope(cfg, max_seq_len, factory.device)
        super().__init__(cfg, layer, factory, kv_params, rope)
        e = cfg.extra
        if not nope and e["use_qk_norm"]:
            self.qk_norm = "head"
            object.__setattr__(self, "q_norm", _L2Norm(cfg.head_dim, cfg.rms_norm_eps))
            object.__setattr__(self, "k_norm", _L2Norm(cfg.head_dim, cfg.rms_norm_eps))
        if not nope and e["attention_chunk_size"]:
            self.chunk = int(e["attention_chunk_size"])
        self.temperature = nope and e["attn_temperature_tuning"]
        self.floor_scale, self.attn_scale = e["floor_scale"], e["attn_scale"]

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        qkv = self._qkv(x)
        if self.temperature:
            positions, _, _ = ragged_write_plan(input_row_offsets, kv_collection)
            steps = ops.floor_div(positions + 1, self.floor_scale).cast(DType.float32)
            scale = (ops.log1p(steps) * self.attn_scale + 1.0).cast(qkv.dtype)
            HD = self.n_heads * self.head_dim
            scale = ops.rebind(ops.unsqueeze(scale, 1), [qkv.shape[0], 1])
            qkv = ops.concat([qkv[:, :HD] * scale, qkv[:, HD:]], axis=-1)
        attn = self._attend(layer_idx, x, qkv, kv_collection, input_row_offsets, self.n_heads, self.n_kv_heads,
                            self.sinks, x.device)
        return self.o_proj(ops.reshape(attn, [x.shape[0], self.n_heads * self.head_dim]))


class Llama4MoE(DecoderMoE):
    """Top-1 expert by router logit; its sigmoid scales the expert's input; plus the shared expert."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory) -> None:
        super().__init__(cfg, layer, factory)
        self.apply_router_weight_first = True

    def route(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        vals, ids = ops.top_k(self.router(x).cast(DType.float32), self.spec.top_k, axis=-1)
        return ids.cast(DType.int64), ops.sigmoid(vals)


def _mlp(cfg: DecoderConfig, layer: int, factory: WeightFactory) -> Module:
    if layer in cfg.moe.dense_layers:
        return default_mlp(cfg, layer, factory)
    return Llama4MoE(cfg, layer, factory)


DEFAULT_MAX_LENGTH = 131072
"""``max_length`` when none is given and the model's context is longer (Llama 4 Scout's is 10M tokens, whose
RoPE table alone would take gigabytes): pass ``--max-length`` for more."""


class Llama4Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        """``max_length`` (at most ``max_position_embeddings``); without one, the model's context up to
        :data:`DEFAULT_MAX_LENGTH`."""
        if pipeline_config.max_length is not None:
            return super().calculate_max_seq_len(pipeline_config, huggingface_config)
        cfg = cls.decoder_config(pipeline_config)
        if cfg.max_position_embeddings > DEFAULT_MAX_LENGTH:
            logger.info("Llama4ForCausalLM: max_length defaults to %d of the model's %d positions (pass "
                        "--max-length for more)", DEFAULT_MAX_LENGTH, cfg.max_position_embeddings)
        return min(cfg.max_position_embeddings, DEFAULT_MAX_LENGTH)

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams,
                     max_seq_len: int) -> Any:
        return build_decoder(cfg, factory, kv_params, max_seq_len, make_mlp=_mlp,
                             make_attention=lambda c, i, f, kvp, n: Llama4Attention(c, i, f, kvp, n))
