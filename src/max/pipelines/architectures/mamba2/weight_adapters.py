"""Mamba-2 checkpoints: Hugging Face names minus ``backbone.`` (older checkpoints' ``embedding`` is
``embeddings``)."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import rename_hf


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = rename_hf(state_dict, prefix="backbone.")
    return {("embeddings.weight" if k == "embedding.weight" else k): v for k, v in out.items()}


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors}
