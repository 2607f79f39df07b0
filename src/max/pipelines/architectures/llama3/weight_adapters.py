"""Llama checkpoints: Hugging Face names minus ``model.``; GGUF names are llama.cpp's standard ones
(``common.weights.GGUF_LAYER_NAMES``), with q/k rows permuted for interleaved RoPE."""

from __future__ import annotations

from max.pipelines.architectures.common.weights import standard_adapters

WEIGHT_ADAPTERS = standard_adapters()

GGUF_INTERLEAVED_ROPE = True
"""llama.cpp permutes Llama q/k rows for its interleaved (``NORM``) RoPE."""
