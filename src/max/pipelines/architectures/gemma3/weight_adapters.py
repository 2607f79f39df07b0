"""Gemma 3 checkpoints: Hugging Face names minus ``model.``; llama.cpp's GGUF names, whose norm weights
were stored as ``1 + weight`` (llama.cpp's plain RMSNorm), so 1 is subtracted back."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import Derived
from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters

GGUF_NAMES = {
    **GGUF_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def _norms_minus_one(out: dict[str, Any]) -> dict[str, Any]:
    return {n: Derived(lambda w: w - 1.0, w) if n.endswith("norm.weight") else w for n, w in out.items()}


WEIGHT_ADAPTERS = standard_adapters(GGUF_NAMES, _norms_minus_one)
