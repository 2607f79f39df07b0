"""Mixtral (``MixtralForCausalLM``): the Llama-shaped decoder with a top-2 mixture of SwiGLU experts."""

from max.pipelines.architectures.mixtral.arch import mixtral_arch

ARCHITECTURES = [mixtral_arch]
