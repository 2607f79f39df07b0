"""Mistral configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults
from max.pipelines.architectures.common.config import LLAMA_HF_DEFAULTS, derive_defaults

HF_DEFAULTS: dict[str, Any] = derive_defaults(
    LLAMA_HF_DEFAULTS, drop=("attention_bias", "mlp_bias"), intermediate_size=14336, num_key_value_heads=8,
    max_position_embeddings=4096 * 32, sliding_window=4096)
"""``transformers.MistralConfig``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**hf_common(hf, "MistralForCausalLM"))


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``MistralConfig`` dict of a ``mistral`` GGUF file (``defaults=False``: only the keys it has)."""
    d = gguf_hf_config(meta, "mistral", "MistralForCausalLM")
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
