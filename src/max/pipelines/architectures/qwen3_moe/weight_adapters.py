"""Qwen3-MoE checkpoints: Hugging Face per-expert ``mlp.experts.E.{gate,up,down}_proj.weight`` stacked into
``mlp.experts.{gate,up,down}_proj.weight``; GGUF ``ffn_gate_inp`` / ``ffn_{gate,up,down}_exps``."""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common import rename_hf
from max.pipelines.architectures.common.moe import GGUF_MOE_NAMES, stack_experts
from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters

EXPERTS = r"layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.(?P<proj>\w+)\.(?P<leaf>weight)"


def convert_safetensor_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    return stack_experts(rename_hf(state_dict), EXPERTS, {p: p for p in ("gate_proj", "up_proj", "down_proj")})


WEIGHT_ADAPTERS = {**standard_adapters({**GGUF_LAYER_NAMES, **GGUF_MOE_NAMES}),
                   WeightsFormat.safetensors: convert_safetensor_state_dict,
                   WeightsFormat.pytorch: convert_safetensor_state_dict}
