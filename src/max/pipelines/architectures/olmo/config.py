"""OLMo configuration from a Hugging Face ``config.json`` or GGUF metadata (llama.cpp ``olmo``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, kv_heads, rope_defaults, \
    with_defaults

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=kv_heads, hidden_act="silu", max_position_embeddings=2048, pad_token_id=1, bos_token_id=None,
    eos_token_id=50279, tie_word_embeddings=False, attention_bias=False, clip_qkv=None)
"""``transformers.OlmoConfig``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common({"rms_norm_eps": 1e-5, **hf}, "OlmoForCausalLM")
    clip = hf.get("clip_qkv")
    c.update(o_proj_bias=c["attention_bias"], norm_kind="layernorm", clip_qkv=float(clip) if clip is not None else None)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``olmo`` GGUF metadata -> ``OlmoConfig`` dict: llama.cpp's converter stores ``clip_qkv`` as
    ``{arch}.attention.clamp_kqv`` (the weightless LayerNorms' epsilon, 1e-5, is fixed); ``defaults=False``:
    only the keys the file has."""
    d = gguf_hf_config(meta, "olmo", "OlmoForCausalLM")
    clamp = meta.arch_get("attention.clamp_kqv")
    if clamp is not None:
        d["clip_qkv"] = float(clamp)
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
