"""Mistral configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import (
    DecoderConfig,
    gguf_hf_config,
    hf_common,
    rope_defaults,
    whole_head_dim,
    with_defaults,
)

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=whole_head_dim, hidden_act="silu", max_position_embeddings=4096 * 32,
    rms_norm_eps=1e-6, pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    sliding_window=4096)
"""``transformers.MistralConfig``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**hf_common(hf, "MistralForCausalLM"))


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``MistralConfig`` dict of a ``mistral`` GGUF file (``defaults=False``: only the keys it has)."""
    d = gguf_hf_config(meta, "mistral", "MistralForCausalLM")
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
