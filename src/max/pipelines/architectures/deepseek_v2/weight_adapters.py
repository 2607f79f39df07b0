"""DeepSeek-V2 checkpoints: Hugging Face per-expert ``mlp.experts.E.{gate,up,down}_proj`` stacked; GGUF
(llama.cpp ``deepseek2``): ``attn_q`` / ``attn_q_a`` + ``attn_q_a_norm`` + ``attn_q_b``, ``attn_kv_a_mqa``,
``attn_kv_a_norm``, ``attn_kv_b``, routed and shared experts.  Files that split ``attn_kv_b`` into
``attn_k_b``/``attn_v_b`` (newer llama.cpp conversions) are not supported yet (clear error)."""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common import rename_hf
from max.pipelines.architectures.common.moe import GGUF_MOE_NAMES, stack_experts
from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters

EXPERTS = r"layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.(?P<proj>\w+)\.(?P<leaf>weight)"
GGUF_NAMES = {**GGUF_LAYER_NAMES, **GGUF_MOE_NAMES, "attn_q_a": "self_attn.q_a_proj",
              "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
              "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
              "attn_kv_b": "self_attn.kv_b_proj"}


def convert_safetensor_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    return stack_experts(rename_hf(state_dict), EXPERTS, {p: p for p in ("gate_proj", "up_proj", "down_proj")})



def convert_gguf_state_dict(state_dict: dict[str, Any], **kw: Any) -> dict[str, Any]:
    if any(".attn_k_b." in n for n in state_dict):
        raise NotImplementedError("DeepseekV2ForCausalLM: GGUF files with attn_k_b/attn_v_b (split kv_b) are not "
                                  "supported yet; use a file with attn_kv_b or the safetensors checkpoint")
    return standard_adapters(GGUF_NAMES)[WeightsFormat.gguf](state_dict, **kw)


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: convert_safetensor_state_dict,
                   WeightsFormat.pytorch: convert_safetensor_state_dict, WeightsFormat.gguf: convert_gguf_state_dict}
