"""Qwen3.5 checkpoints: Hugging Face names minus ``model.`` (``model.language_model.`` in the multimodal
release, whose vision tower and multi-token-prediction head are left out); llama.cpp's ``qwen35`` GGUF names
and layouts, value heads back from its tiled order (``common.deltanet.qwen_hybrid_gguf_weights``)."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.deltanet import qwen_hybrid_gguf_weights
from max.pipelines.architectures.common.weights import rename_hf


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    text = {k.replace("model.language_model.", "model.", 1): v for k, v in state_dict.items()
            if not k.startswith(("model.visual.", "mtp.", "visual."))}
    return rename_hf(text)


def gguf(state_dict: Mapping[str, Any], huggingface_config: Any = None, **_: Any) -> dict[str, Any]:
    return qwen_hybrid_gguf_weights(state_dict, huggingface_config, fused=False, tiled_v=True)


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
