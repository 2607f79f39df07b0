"""Granite configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults
from max.pipelines.architectures.common.config import LLAMA_HF_DEFAULTS, derive_defaults

HF_DEFAULTS: dict[str, Any] = derive_defaults(
    LLAMA_HF_DEFAULTS, drop=("head_dim",), embedding_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0,
    attention_multiplier=1.0)
"""``transformers.GraniteConfig``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "GraniteForCausalLM")
    c.update(o_proj_bias=c["attention_bias"],
             embedding_multiplier=float(hf.get("embedding_multiplier", 1.0)),
             residual_multiplier=float(hf.get("residual_multiplier", 1.0)),
             attention_scale=float(hf.get("attention_multiplier", 1.0)),
             logits_scaling=float(hf.get("logits_scaling", 1.0)))
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict | None:
    """``granite`` GGUF metadata -> ``GraniteConfig`` dict (multipliers from ``{arch}.embedding_scale``,
    ``residual_scale``, ``attention.scale``, ``logit_scale``); None for Granite-MoE files.
    ``defaults=False``: only the keys the file has."""
    g = meta.arch_get
    if g("expert_count"):
        return None
    d = gguf_granite_keys(meta, gguf_hf_config(meta, "granite", "GraniteForCausalLM"))
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d


def gguf_granite_keys(meta: Any, d: dict) -> dict:
    """``d`` with Granite's multipliers (llama.cpp's ``embedding_scale``, ``residual_scale``,
    ``attention.scale``, ``logit_scale``) and ``attention_bias`` (the file has q biases) of a GGUF file."""
    g = meta.arch_get
    for key, name in (("embedding_scale", "embedding_multiplier"), ("residual_scale", "residual_multiplier"),
                      ("attention.scale", "attention_multiplier"), ("logit_scale", "logits_scaling")):
        if g(key) is not None:
            d[name] = float(g(key))
    d["attention_bias"] = any(t.name == "blk.0.attn_q.bias" for t in meta.tensors)
    return d
