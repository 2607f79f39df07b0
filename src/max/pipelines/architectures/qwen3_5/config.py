"""Qwen3.5 text configuration from a Hugging Face ``config.json`` (``transformers.Qwen3_5TextConfig``, or
the ``text_config`` of a ``Qwen3_5Config``) or the metadata of a ``qwen35`` GGUF file."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.deltanet import qwen_hybrid_config, qwen_hybrid_gguf_config


def config_from_hf(hf: dict) -> DecoderConfig:
    if "text_config" in hf and "num_hidden_layers" not in hf:
        hf = {**hf["text_config"], "tie_word_embeddings": hf.get("tie_word_embeddings",
                                                               hf["text_config"].get("tie_word_embeddings", False))}
    return qwen_hybrid_config(hf, "Qwen3_5ForCausalLM")


HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
    num_key_value_heads=4, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, pad_token_id=None,
    bos_token_id=None, eos_token_id=None,
    layer_types=lambda d: ["linear_attention" if (i + 1) % 4 else "full_attention"
                           for i in range(d["num_hidden_layers"])])
"""``transformers.Qwen3_5TextConfig``'s defaults (what a GGUF file lacks); RoPE base 10000, a quarter of each
head rotated."""


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``Qwen3_5TextConfig`` dict of a ``qwen35`` GGUF file (``defaults=False``: only the keys it has).
    Text positions are the same on MRoPE's three axes, so ``rope.dimension_sections`` changes nothing here."""
    return qwen_hybrid_gguf_config(meta, "qwen3_5_text", "Qwen3_5ForCausalLM", HF_DEFAULTS if defaults else None)
