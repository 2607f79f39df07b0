"""Mixtral checkpoints.

Hugging Face: ``model.layers.N.block_sparse_moe.gate.weight`` (router) and per-expert
``block_sparse_moe.experts.E.w1/w3/w2.weight`` (gate/up/down), stacked here into
``layers.N.mlp.experts.{gate,up,down}_proj.weight``.  GGUF (llama.cpp): ``blk.N.ffn_gate_inp`` (router)
and stacked ``ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps``; q/k rows permuted for interleaved
RoPE as for Llama.
"""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common import rename_hf
from max.pipelines.architectures.common.moe import GGUF_MOE_NAMES, stack_experts
from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters

EXPERTS = r"layers\.(?P<layer>\d+)\.(?:block_sparse_moe|mlp)\.experts\.(?P<expert>\d+)\.(?P<proj>\w+)\.(?P<leaf>weight)"


def convert_safetensor_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    out = stack_experts(rename_hf(state_dict), EXPERTS, {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj",
                                                          "gate_proj": "gate_proj", "up_proj": "up_proj",
                                                          "down_proj": "down_proj"})
    return {n.replace(".block_sparse_moe.", ".mlp."): w for n, w in out.items()}


WEIGHT_ADAPTERS = {**standard_adapters({**GGUF_LAYER_NAMES, **GGUF_MOE_NAMES}),
                   WeightsFormat.safetensors: convert_safetensor_state_dict,
                   WeightsFormat.pytorch: convert_safetensor_state_dict}
