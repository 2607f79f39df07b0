"""OLMo 2 (``Olmo2ForCausalLM``): norms after attention and MLP (none before), RMSNorm of the whole q
and k projections."""

from max.pipelines.architectures.olmo2.arch import olmo2_arch

ARCHITECTURES = [olmo2_arch]
