"""Phi-3 checkpoints: Hugging Face names minus ``model.`` (``qkv_proj``, ``gate_up_proj`` are already
fused); in llama.cpp's GGUF the fused gate/up projection is named ``ffn_up``."""

from __future__ import annotations

from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters

WEIGHT_ADAPTERS = standard_adapters({**GGUF_LAYER_NAMES, "ffn_up": "mlp.gate_up_proj"})
