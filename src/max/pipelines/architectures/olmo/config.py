"""OLMo configuration from a Hugging Face ``config.json``."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig, hf_common


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common({"rms_norm_eps": 1e-5, **hf}, "OlmoForCausalLM")
    clip = hf.get("clip_qkv")
    c.update(o_proj_bias=c["attention_bias"], norm_kind="layernorm", clip_qkv=float(clip) if clip is not None else None)
    return DecoderConfig(**c)
