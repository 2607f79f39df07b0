"""Llama checkpoints: Hugging Face names minus ``model.``; GGUF names are llama.cpp's standard ones
(``common.weights.GGUF_LAYER_NAMES``), with q/k rows permuted for interleaved RoPE."""

from __future__ import annotations

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common import rename_gguf, rename_hf

WEIGHT_ADAPTERS = {WeightsFormat.safetensors: rename_hf, WeightsFormat.pytorch: rename_hf,
                   WeightsFormat.gguf: rename_gguf}

GGUF_INTERLEAVED_ROPE = True
"""llama.cpp permutes Llama q/k rows for its interleaved (``NORM``) RoPE."""
