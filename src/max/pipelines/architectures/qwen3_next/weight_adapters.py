"""Qwen3-Next checkpoints: Hugging Face names minus ``model.``, per-expert projections stacked (the
multi-token-prediction head is left out); llama.cpp's ``qwen3next`` GGUF names and layouts
(``common.deltanet.qwen_hybrid_gguf_weights``)."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.deltanet import qwen_hybrid_gguf_weights
from max.pipelines.architectures.common.moe import stack_experts
from max.pipelines.architectures.common.weights import rename_hf

EXPERTS = r"layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.(?P<proj>\w+)\.(?P<leaf>weight)"


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    text = {k: v for k, v in state_dict.items() if not k.startswith("mtp.")}
    return stack_experts(rename_hf(text), EXPERTS, {p: p for p in ("gate_proj", "up_proj", "down_proj")})


def gguf(state_dict: Mapping[str, Any], huggingface_config: Any = None, **_: Any) -> dict[str, Any]:
    return qwen_hybrid_gguf_weights(state_dict, huggingface_config, fused=True, tiled_v=False)


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
