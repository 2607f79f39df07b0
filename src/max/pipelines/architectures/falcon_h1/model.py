"""The Falcon-H1 pipeline model: per layer ``input_layernorm`` -> Mamba-2 ``mamba`` + attention ``self_attn``
(summed; multipliers folded into the weights) -> residual, ``pre_ff_layernorm`` -> SwiGLU ``feed_forward`` ->
residual; final ``final_layernorm``; embedding and lm-head multipliers."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import TensorValue, ops
from max.nn.kv_cache import KVCacheParams, StateSpec
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.hybrid import (
    AttentionMixer,
    HybridCollection,
    HybridLayer,
    HybridPipelineModel,
    Mamba2Mixer,
    build_hybrid,
    mamba2_state_specs,
)
from max.pipelines.architectures.common.layers import DecoderAttention, GatedMLP, make_rope, rms_norm
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.falcon_h1.config import config_from_hf
from max.pipelines.architectures.falcon_h1.weight_adapters import WEIGHT_ADAPTERS


class _Parallel:
    """The sum of a Mamba-2 mixer and attention on the same input (not a module: the layer owns both)."""

    def __init__(self, mamba: Mamba2Mixer, attn: AttentionMixer) -> None:
        self.mamba, self.attn = mamba, attn

    def __call__(self, x: TensorValue, coll: HybridCollection, offsets: TensorValue) -> TensorValue:
        a = self.attn.attn
        if getattr(a, "clip_qkv", None) is not None or not hasattr(a, "q_proj"):
            return self.mamba(x, coll, offsets) + self.attn(x, coll, offsets)
        # in_proj and q/k/v of the same x as one concat: the compiler runs them (and the norm) as one matmul
        n = self.mamba.m.inner + self.mamba.conv_dim + self.mamba.m.heads
        y = ops.concat([self.mamba.in_proj(x), a.q_proj(x), a.k_proj(x), a.v_proj(x)], axis=-1)
        idx = ops.constant(self.attn.kv_layer, DType.uint32, x.device)
        att = a._attend(idx, x, y[:, n:], coll.paged, offsets, a.n_heads, a.n_kv_heads, a.sinks, x.device)
        return (self.mamba.mix(y[:, :n], coll, offsets)
                + a.o_proj(ops.reshape(att, [x.shape[0], a.n_heads * a.head_dim])))


class FalconH1Layer(HybridLayer):
    """:class:`HybridLayer` whose mixer is Mamba-2 (``mamba``) plus attention (``self_attn``)."""

    def __init__(self, cfg: DecoderConfig, i: int, factory: WeightFactory, kv_params: KVCacheParams,
                 rope: Any) -> None:
        mamba = Mamba2Mixer(f"layers.{i}.mamba", i, cfg.hidden_size, factory, cfg.extra["mamba"])
        attn = AttentionMixer(DecoderAttention(cfg, i, factory, kv_params, rope), i)
        mlp = GatedMLP(f"layers.{i}.feed_forward", factory, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                       has_bias=cfg.mlp_bias, who=cfg.architecture)
        super().__init__(("input_layernorm", "mamba", "pre_ff_layernorm", "feed_forward"),
                         rms_norm(cfg, cfg.hidden_size, factory.dtype), mamba,
                         rms_norm(cfg, cfg.hidden_size, factory.dtype), mlp)
        self.self_attn = attn.attn
        object.__setattr__(self, "_mixer", _Parallel(mamba, attn))


class FalconH1Model(HybridPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def attention_layers(cls, cfg: DecoderConfig) -> list[int]:
        return list(range(cfg.num_hidden_layers))

    @classmethod
    def state_specs(cls, cfg: DecoderConfig) -> list[StateSpec]:
        return mamba2_state_specs(range(cfg.num_hidden_layers), cfg.extra["mamba"])

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                     devices: Any = None) -> Module:
        rope = make_rope(cfg, max_seq_len, factory.device)
        layers = [FalconH1Layer(cfg, i, factory, kv_params, rope) for i in range(cfg.num_hidden_layers)]
        return build_hybrid(cfg, factory, kv_params, layers, cfg.num_hidden_layers, cls.state_specs(cfg),
                            norm_name="final_layernorm")
