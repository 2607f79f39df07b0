"""Qwen3-VL (``Qwen3VLForConditionalGeneration``): a ViT with learned position embeddings and DeepStack
mergers feeding a Qwen3 decoder with interleaved multimodal RoPE; images and video."""

from max.pipelines.architectures.qwen3vl.arch import qwen3vl_arch

ARCHITECTURES = [qwen3vl_arch]
