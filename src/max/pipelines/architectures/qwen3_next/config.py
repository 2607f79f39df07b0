"""Qwen3-Next configuration from a Hugging Face ``config.json`` (``transformers.Qwen3NextConfig``)."""

from __future__ import annotations

from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.deltanet import qwen_hybrid_config
from max.pipelines.architectures.common.moe import MoESpec


def config_from_hf(hf: dict) -> DecoderConfig:
    n = int(hf["num_hidden_layers"])
    e = int(hf.get("num_experts") or 0)
    step = int(hf.get("decoder_sparse_step") or 1)
    only = set(hf.get("mlp_only_layers") or [])
    dense = {i for i in range(n) if i in only or not (e > 0 and (i + 1) % step == 0)}
    moe = None
    if len(dense) < n:
        moe = MoESpec(num_experts=e, top_k=int(hf["num_experts_per_tok"]), moe_dim=int(hf["moe_intermediate_size"]),
                      routing="softmax_topk", renormalize=bool(hf.get("norm_topk_prob", True)),
                      activation=str(hf.get("hidden_act") or "silu"), dense_layers=dense)
    cfg = qwen_hybrid_config(hf, "Qwen3NextForCausalLM", moe=moe)
    cfg.extra["shared_expert_dim"] = int(hf.get("shared_expert_intermediate_size") or 0)
    return cfg
