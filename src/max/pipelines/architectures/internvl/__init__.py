"""InternVL (``InternVLForConditionalGeneration``): the InternViT vision encoder over dynamic image tiles, a
pixel-shuffle MLP projector, and a Qwen2 / Llama / Qwen3 text decoder."""

from max.pipelines.architectures.internvl.arch import internvl_arch

ARCHITECTURES = [internvl_arch]
