"""Mixtral configuration from a Hugging Face ``config.json`` or GGUF metadata (llama.cpp writes Mixtral
as ``general.architecture = llama`` with ``llama.expert_count``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common
from max.pipelines.architectures.common.moe import MoESpec


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "MixtralForCausalLM")
    c["moe"] = MoESpec(num_experts=int(hf["num_local_experts"]), top_k=int(hf["num_experts_per_tok"]),
                       moe_dim=c["intermediate_size"], routing="softmax_topk", renormalize=True,
                       activation=c["hidden_act"])
    return DecoderConfig(**c)


def config_from_gguf(meta: Any) -> dict | None:
    g = meta.arch_get
    if not g("expert_count"):
        return None
    d = gguf_hf_config(meta, "mixtral", "MixtralForCausalLM")
    d.update(num_local_experts=int(g("expert_count")), num_experts_per_tok=int(g("expert_used_count")))
    if g("expert_feed_forward_length"):
        d["intermediate_size"] = int(g("expert_feed_forward_length"))
    return d
