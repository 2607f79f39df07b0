"""Qwen3.5 text (``Qwen3_5ForCausalLM``): gated DeltaNet layers (separate q|k|v, z, b, a projections)
between gated-output attention layers (every ``full_attention_interval``-th), dense SwiGLU MLPs."""

from max.pipelines.architectures.qwen3_5.arch import qwen3_5_arch

ARCHITECTURES = [qwen3_5_arch]
