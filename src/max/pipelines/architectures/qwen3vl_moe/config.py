"""Qwen3-VL-MoE configuration (``Qwen3VLMoeForConditionalGeneration``): Qwen3-VL (``qwen3vl.config``) whose
text decoder's MLPs are Qwen3-MoE experts (softmax top-k, the top-k weights always renormalised)."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.qwen3_moe.config import moe_spec
from max.pipelines.architectures.qwen3vl.config import config_fields, text_config, with_vision_extras

ARCHITECTURE = "Qwen3VLMoeForConditionalGeneration"


def config_from_hf(hf: dict) -> DecoderConfig:
    c = config_fields(hf, ARCHITECTURE)
    c["moe"] = moe_spec(text_config(hf), c, renormalize=True)
    return with_vision_extras(DecoderConfig(**c), hf)
