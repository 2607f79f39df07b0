"""SmolLM3 (``SmolLM3ForCausalLM``): the Llama-shaped decoder whose NoPE layers (``no_rope_layers[i] == 0``)
attend without rotary embeddings."""

from max.pipelines.architectures.smollm3.arch import smollm3_arch

ARCHITECTURES = [smollm3_arch]
