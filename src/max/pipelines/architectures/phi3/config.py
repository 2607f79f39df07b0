"""Phi-3 configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, kv_heads, with_defaults

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=kv_heads, hidden_act="silu", max_position_embeddings=4096,
    original_max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
    eos_token_id=32000, pad_token_id=32000, sliding_window=None)
"""``transformers.Phi3Config``'s defaults (what a GGUF file lacks); RoPE base 10000, whole heads rotated."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Phi3ForCausalLM")
    c.update(fused_qkv=True, fused_gate_up=True, attention_bias=False, mlp_bias=False)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``phi3`` GGUF metadata -> ``Phi3Config`` dict (``rope.dimension_count`` < head size: partial rotary;
    ``defaults=False``: only the keys the file has).

    Long-context files store their LongRoPE factors as tensors (``rope_factors_long/short``, read by
    ``gguf_hf_config``): a ``longrope`` entry whose original context also becomes the config's
    ``original_max_position_embeddings``.  Other RoPE scaling is an error (Phi-3 has only LongRoPE)."""
    g = meta.arch_get
    d = gguf_hf_config(meta, "phi3", "Phi3ForCausalLM", rope_dim_is_head_dim=False)
    head = int(g("embedding_length")) // int(g("attention.head_count"))
    rot = g("rope.dimension_count")
    if rot and int(rot) != head:
        d.setdefault("rope_parameters", {"rope_type": "default"})["partial_rotary_factor"] = int(rot) / head
    kind = d.get("rope_parameters", {}).get("rope_type", "default")
    if kind == "longrope":
        d["original_max_position_embeddings"] = d["rope_parameters"]["original_max_position_embeddings"]
    elif kind != "default":
        raise NotImplementedError(f"Phi3ForCausalLM: GGUF RoPE scaling {kind!r} is not supported (Phi-3 scales "
                                  "RoPE only with LongRoPE factors)")
    if not defaults:
        return d
    d = with_defaults(d, HF_DEFAULTS)
    rp = {"rope_type": "default", **(d.get("rope_parameters") or {})}
    rp.setdefault("rope_theta", 10000.0)
    rp.setdefault("partial_rotary_factor", 1.0)
    d["rope_parameters"] = rp
    return d
