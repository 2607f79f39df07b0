"""DeepSeek-V3's router and pipeline model (attention: ``deepseek_v2``'s MLA)."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import TensorValue, Weight, ops
from max.nn.kv_cache import KVCacheParams
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.layers import build_decoder, default_mlp
from max.pipelines.architectures.common.moe import DecoderMoE
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.deepseek_v2.model import DeepseekV2Model, MLAttention
from max.pipelines.architectures.deepseek_v3.config import config_from_hf
from max.pipelines.architectures.deepseek_v3.weight_adapters import WEIGHT_ADAPTERS


class DeepseekV3MoE(DecoderMoE):
    """Routed and shared experts with V3's routing: ``s = sigmoid(logits)``; the experts are the top-k of
    ``s + e_score_correction_bias`` within the ``topk_group`` groups whose two best biased scores sum
    highest; their weights are ``s`` (renormalised when ``norm_topk_prob``) times
    ``routed_scaling_factor``."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory) -> None:
        super().__init__(cfg, layer, factory)
        self.e_score_correction_bias = Weight("e_score_correction_bias", DType.float32, [self.num_experts],
                                              factory.device)

    def route(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        s = self.spec
        E, G = self.num_experts, s.n_group
        scores = ops.sigmoid(self.gate(x).cast(DType.float32))
        choice = scores + self.e_score_correction_bias
        if G > 1:
            grouped = ops.reshape(choice, [-1, G, E // G])
            best2 = ops.top_k(grouped, 2, axis=-1)[0]
            group_score = ops.reshape(ops.sum(best2, axis=-1), [-1, G])
            kth = ops.top_k(group_score, s.topk_group, axis=-1)[0][:, s.topk_group - 1:]
            keep = ops.greater_equal(group_score, kth)  # [T, G]: the topk_group best groups
            keep = ops.reshape(ops.broadcast_to(ops.unsqueeze(keep, -1), [grouped.shape[0], G, E // G]), [-1, E])
            ninf = ops.broadcast_to(ops.constant(float("-inf"), DType.float32, choice.device), choice.shape)
            choice = ops.where(keep, choice, ninf)
        ids = ops.top_k(choice, s.top_k, axis=-1)[1]
        weights = ops.gather_nd(scores, ops.unsqueeze(ids, -1), batch_dims=1)
        if s.renormalize:
            weights = weights / (ops.sum(weights, axis=-1) + 1e-20)
        return ids.cast(DType.int64), weights * s.scaling


def _mlp(cfg: DecoderConfig, layer: int, factory: WeightFactory) -> Module:
    if layer in cfg.moe.dense_layers:
        return default_mlp(cfg, layer, factory)
    return DeepseekV3MoE(cfg, layer, factory)


class DeepseekV3Model(DeepseekV2Model):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams,
                     max_seq_len: int) -> Any:
        return build_decoder(cfg, factory, kv_params, max_seq_len, make_mlp=_mlp,
                             make_attention=lambda c, i, f, kvp, n: MLAttention(c, i, f, kvp, n))
