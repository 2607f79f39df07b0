"""OLMo 2 configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import (
    DecoderConfig,
    NormPlan,
    gguf_hf_config,
    hf_common,
    kv_heads,
    rope_defaults,
    with_defaults,
)

NORMS = NormPlan(pre_attention=None, post_attention="post_attention_layernorm", pre_mlp=None,
                 post_mlp="post_feedforward_layernorm")

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=kv_heads, hidden_act="silu", max_position_embeddings=2048, pad_token_id=1, bos_token_id=None,
    eos_token_id=50279, tie_word_embeddings=False, attention_bias=False, rms_norm_eps=1e-5)
"""``transformers.Olmo2Config``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Olmo2ForCausalLM")
    c.update(o_proj_bias=c["attention_bias"], qk_norm="full", norms=NORMS, norm_multiply_before_cast=True)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``Olmo2Config`` dict of an ``olmo2`` GGUF file (``defaults=False``: only the keys it has)."""
    d = gguf_hf_config(meta, "olmo2", "Olmo2ForCausalLM")
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
