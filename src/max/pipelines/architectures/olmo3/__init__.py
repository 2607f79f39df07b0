"""OLMo 3 (``Olmo3ForCausalLM``): OLMo 2's decoder (post-norms, q/k norms over the whole projections)
with sliding-window layers, which use an unscaled RoPE of their own base."""

from max.pipelines.architectures.olmo3.arch import olmo3_arch

ARCHITECTURES = [olmo3_arch]
