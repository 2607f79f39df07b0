"""Qwen3 configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**{**hf_common(hf, "Qwen3ForCausalLM"), "qk_norm": "head"})


def config_from_gguf(meta: Any) -> dict:
    return gguf_hf_config(meta, "qwen3", "Qwen3ForCausalLM")
