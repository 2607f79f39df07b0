"""GPT-OSS configuration from a Hugging Face ``config.json``."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.common.moe import MoESpec


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "GptOssForCausalLM")
    c.update(o_proj_bias=c["attention_bias"], attention_sinks=True,
             moe=MoESpec(num_experts=int(hf.get("num_local_experts") or hf["num_experts"]),
                         top_k=int(hf["num_experts_per_tok"]), moe_dim=c["intermediate_size"],
                         routing="topk_softmax", router_name="router", router_bias=True, expert_bias=True,
                         activation="swigluoai", swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
                         swiglu_limit=float(hf.get("swiglu_limit", 7.0))))
    return DecoderConfig(**c)
