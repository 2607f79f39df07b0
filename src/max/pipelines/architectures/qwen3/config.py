"""Qwen3 configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults
from max.pipelines.architectures.qwen2.config import qwen_layer_types, qwen_sliding_window

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, head_dim=128, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, sliding_window=4096,
    max_window_layers=28, layer_types=qwen_layer_types, pad_token_id=None, bos_token_id=None, eos_token_id=None)
"""``transformers.Qwen3Config``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**{**hf_common(hf, "Qwen3ForCausalLM"), "qk_norm": "head"})


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``Qwen3Config`` dict of a ``qwen3`` GGUF file (``defaults=False``: only the keys it has)."""
    d = gguf_hf_config(meta, "qwen3", "Qwen3ForCausalLM")
    return rope_defaults(qwen_sliding_window(with_defaults(d, HF_DEFAULTS))) if defaults else d
