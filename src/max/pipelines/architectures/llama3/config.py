"""Llama configuration from a Hugging Face ``config.json`` or GGUF metadata (``general.architecture = llama``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import (
    DecoderConfig,
    gguf_hf_config,
    hf_common,
    kv_heads,
    rope_defaults,
    whole_head_dim,
    with_defaults,
)

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=kv_heads, head_dim=whole_head_dim, hidden_act="silu", max_position_embeddings=2048,
    rms_norm_eps=1e-6, pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    attention_bias=False, mlp_bias=False)
"""``transformers.LlamaConfig``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**hf_common(hf, "LlamaForCausalLM"))


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict | None:
    """The ``LlamaConfig`` dict of a ``llama`` GGUF file; None for Mixtral-style files (with experts).
    ``defaults=False``: only the keys the file has."""
    if meta.arch_get("expert_count"):
        return None
    d = gguf_hf_config(meta, "llama", "LlamaForCausalLM")
    d["attention_bias"] = any(t.name == "blk.0.attn_q.bias" for t in meta.tensors)
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
