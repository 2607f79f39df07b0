"""Llama configuration from a Hugging Face ``config.json`` or GGUF metadata (``general.architecture = llama``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**hf_common(hf, "LlamaForCausalLM"))


def config_from_gguf(meta: Any) -> dict | None:
    """The ``LlamaConfig`` dict of a ``llama`` GGUF file; None for Mixtral-style files (with experts)."""
    if meta.arch_get("expert_count"):
        return None
    d = gguf_hf_config(meta, "llama", "LlamaForCausalLM")
    d["attention_bias"] = any(t.name == "blk.0.attn_q.bias" for t in meta.tensors)
    return d
