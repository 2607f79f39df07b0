"""Qwen3.5 checkpoints: Hugging Face names minus ``model.`` (``model.language_model.`` in the multimodal
release, whose vision tower and multi-token-prediction head are left out)."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import rename_hf


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    text = {k.replace("model.language_model.", "model.", 1): v for k, v in state_dict.items()
            if not k.startswith(("model.visual.", "mtp.", "visual."))}
    return rename_hf(text)


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors}
