"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): a ViT with 2-D RoPE and window attention feeding a
Qwen2 decoder with multimodal RoPE."""

from max.pipelines.architectures.qwen2_5vl.arch import qwen2_5vl_arch

ARCHITECTURES = [qwen2_5vl_arch]
