"""Mamba-2 checkpoints: Hugging Face names minus ``backbone.`` (older checkpoints' ``embedding`` is
``embeddings``); llama.cpp's GGUF names (``ssm_*``, ``gguf_ssm_layout`` undoing its layouts)."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import GGUF_SSM_NAMES, gguf_ssm_layout, rename_gguf, rename_hf


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = rename_hf(state_dict, prefix="backbone.")
    return {("embeddings.weight" if k == "embedding.weight" else k): v for k, v in out.items()}


def gguf(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    names = {"attn_norm": "norm", **{a: f"mixer.{b}" for a, b in GGUF_SSM_NAMES.items()}}
    out = rename_gguf(state_dict, names, {"token_embd": "embeddings", "output_norm": "norm_f", "output": "lm_head"})
    return gguf_ssm_layout(out, "mixer")


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
