"""Granite MoE (``GraniteMoeForCausalLM``): Granite's multipliers with a mixture of SwiGLU experts (top-k of
the router logits, softmax over them)."""

from max.pipelines.architectures.granitemoe.arch import granitemoe_arch

ARCHITECTURES = [granitemoe_arch]
