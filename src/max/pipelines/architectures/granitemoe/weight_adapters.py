"""Granite MoE checkpoints: ``block_sparse_moe.router.layer`` is the router, ``input_linear``
``[experts, 2 * moe_dim, hidden]`` holds each expert's gate then up projection, ``output_linear`` its
down projection.  GGUF (llama.cpp ``granitemoe``): ``ffn_gate_inp`` (router), ``ffn_gate_exps`` /
``ffn_up_exps`` (``input_linear`` split) and ``ffn_down_exps``; q/k rows permuted as for Llama."""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common import Derived, rename_hf
from max.pipelines.architectures.common.moe import GGUF_MOE_NAMES
from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters

GGUF_NAMES = {**GGUF_LAYER_NAMES, **GGUF_MOE_NAMES, "ffn_gate_inp": "mlp.router"}


def convert_safetensor_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, w in rename_hf(state_dict).items():
        if ".block_sparse_moe." not in name:
            out[name] = w
            continue
        layer = name.split(".block_sparse_moe.")[0]
        if name.endswith("router.layer.weight"):
            out[f"{layer}.mlp.router.weight"] = w
        elif name.endswith("input_linear.weight"):
            out[f"{layer}.mlp.experts.gate_proj.weight"] = Derived(lambda t: t[:, : t.shape[1] // 2], w)
            out[f"{layer}.mlp.experts.up_proj.weight"] = Derived(lambda t: t[:, t.shape[1] // 2:], w)
        elif name.endswith("output_linear.weight"):
            out[f"{layer}.mlp.experts.down_proj.weight"] = w
        else:
            raise ValueError(f"GraniteMoeForCausalLM: unexpected checkpoint tensor {name!r}")
    return out


WEIGHT_ADAPTERS = {**standard_adapters(GGUF_NAMES), WeightsFormat.safetensors: convert_safetensor_state_dict,
                   WeightsFormat.pytorch: convert_safetensor_state_dict}
