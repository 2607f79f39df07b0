"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3 attention (q/k norms) with a mixture of SwiGLU experts."""

from max.pipelines.architectures.qwen3_moe.arch import qwen3_moe_arch

ARCHITECTURES = [qwen3_moe_arch]
