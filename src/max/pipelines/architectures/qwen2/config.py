"""Qwen2 configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults


def qwen_layer_types(d: dict[str, Any]) -> list[str]:
    """Qwen2/Qwen3's derived default of ``layer_types``: sliding-window attention from layer
    ``max_window_layers`` on when ``use_sliding_window``, else full attention everywhere."""
    sliding = d["use_sliding_window"] and d["sliding_window"] is not None
    return ["sliding_attention" if sliding and i >= d["max_window_layers"] else "full_attention"
            for i in range(d["num_hidden_layers"])]


def qwen_sliding_window(d: dict[str, Any]) -> dict[str, Any]:
    """Qwen configs drop ``sliding_window`` unless ``use_sliding_window`` (as their config classes do)."""
    return {**d, "sliding_window": d["sliding_window"] if d["use_sliding_window"] else None}


HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096, max_window_layers=28,
    layer_types=qwen_layer_types, pad_token_id=None, bos_token_id=None, eos_token_id=None)
"""``transformers.Qwen2Config``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**{**hf_common(hf, "Qwen2ForCausalLM"), "attention_bias": True})


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``Qwen2Config`` dict of a ``qwen2`` GGUF file (``defaults=False``: only the keys it has)."""
    d = gguf_hf_config(meta, "qwen2", "Qwen2ForCausalLM")
    return rope_defaults(qwen_sliding_window(with_defaults(d, HF_DEFAULTS))) if defaults else d
