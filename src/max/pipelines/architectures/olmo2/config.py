"""OLMo 2 configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, NormPlan, gguf_hf_config, hf_common

NORMS = NormPlan(pre_attention=None, post_attention="post_attention_layernorm", pre_mlp=None,
                 post_mlp="post_feedforward_layernorm")


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Olmo2ForCausalLM")
    c.update(o_proj_bias=c["attention_bias"], qk_norm="full", norms=NORMS, norm_multiply_before_cast=True)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any) -> dict:
    return gguf_hf_config(meta, "olmo2", "Olmo2ForCausalLM")
