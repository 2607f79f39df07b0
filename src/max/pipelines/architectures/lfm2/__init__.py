"""LFM2 (``Lfm2ForCausalLM``): gated short-convolution layers between grouped-query attention layers
(per-head q/k norms), SwiGLU feed-forward in every layer, the final norm named ``embedding_norm``."""

from max.pipelines.architectures.lfm2.arch import lfm2_arch

ARCHITECTURES = [lfm2_arch]
