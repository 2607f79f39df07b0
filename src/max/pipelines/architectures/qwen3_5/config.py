"""Qwen3.5 text configuration from a Hugging Face ``config.json`` (``transformers.Qwen3_5TextConfig``, or
the ``text_config`` of a ``Qwen3_5Config``)."""

from __future__ import annotations

from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.deltanet import qwen_hybrid_config


def config_from_hf(hf: dict) -> DecoderConfig:
    if "text_config" in hf and "num_hidden_layers" not in hf:
        hf = {**hf["text_config"], "tie_word_embeddings": hf.get("tie_word_embeddings",
                                                               hf["text_config"].get("tie_word_embeddings", False))}
    return qwen_hybrid_config(hf, "Qwen3_5ForCausalLM")
