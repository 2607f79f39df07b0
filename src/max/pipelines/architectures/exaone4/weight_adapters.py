"""EXAONE 4 checkpoints: Hugging Face names minus ``model.``; llama.cpp's GGUF names with the post-norms
(its q/k rows are not permuted: rotate-half RoPE as in transformers)."""

from __future__ import annotations

from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters

WEIGHT_ADAPTERS = standard_adapters({**GGUF_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                                     "post_ffw_norm": "post_feedforward_layernorm"})
