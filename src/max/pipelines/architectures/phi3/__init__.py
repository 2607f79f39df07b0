"""Phi-3 / Phi-3.5 / Phi-4-mini (``Phi3ForCausalLM``): fused qkv and gate_up projections, partial
rotary embeddings, LongRoPE."""

from max.pipelines.architectures.phi3.arch import phi3_arch

ARCHITECTURES = [phi3_arch]
