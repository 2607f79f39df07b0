"""Granite 3 (``GraniteForCausalLM``): the Llama-shaped decoder with embedding, residual, attention and
logit multipliers."""

from max.pipelines.architectures.granite.arch import granite_arch

ARCHITECTURES = [granite_arch]
