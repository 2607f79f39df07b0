"""GLM-4 configuration from a Hugging Face ``config.json``."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig, NormPlan, hf_common

NORMS = NormPlan(pre_attention="input_layernorm", post_attention="post_self_attn_layernorm",
                 pre_mlp="post_attention_layernorm", post_mlp="post_mlp_layernorm")


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Glm4ForCausalLM")
    c.update(norms=NORMS, fused_gate_up=True, interleaved_rope=True, o_proj_bias=False, mlp_bias=False)
    return DecoderConfig(**c)
