"""Granite 4 hybrid (``GraniteMoeHybridForCausalLM``): Mamba-2 layers and attention layers (RoPE or none),
each followed by routed experts plus a shared MLP (or the shared MLP alone), Granite's embedding,
residual, attention and logit multipliers."""

from max.pipelines.architectures.granitemoehybrid.arch import granitemoehybrid_arch

ARCHITECTURES = [granitemoehybrid_arch]
