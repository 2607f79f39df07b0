"""OLMo (``OlmoForCausalLM``): the Llama-shaped decoder with weightless LayerNorms and q/k/v clamped
to ``clip_qkv``."""

from max.pipelines.architectures.olmo.arch import olmo_arch

ARCHITECTURES = [olmo_arch]
