"""Qwen3-VL-MoE (``Qwen3VLMoeForConditionalGeneration``): Qwen3-VL with a mixture-of-experts text decoder."""

from max.pipelines.architectures.qwen3vl_moe.arch import qwen3vl_moe_arch

ARCHITECTURES = [qwen3vl_moe_arch]
