"""Llama configuration from a Hugging Face ``config.json`` or GGUF metadata (``general.architecture = llama``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults
from max.pipelines.architectures.common.config import LLAMA_HF_DEFAULTS

HF_DEFAULTS: dict[str, Any] = LLAMA_HF_DEFAULTS
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
