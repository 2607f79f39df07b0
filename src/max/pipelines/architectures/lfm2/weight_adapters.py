"""LFM2 checkpoints: Hugging Face names minus ``model.``, the attention and feed-forward projections under
the shared decoder's names (``out_proj`` -> ``o_proj``, ``q_layernorm`` -> ``q_norm``, ``w1``/``w3``/``w2``
-> ``gate_proj``/``up_proj``/``down_proj``)."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import rename_hf

_RENAMES = {"self_attn.out_proj.": "self_attn.o_proj.", "self_attn.q_layernorm.": "self_attn.q_norm.",
            "self_attn.k_layernorm.": "self_attn.k_norm.", "feed_forward.w1.": "feed_forward.gate_proj.",
            "feed_forward.w3.": "feed_forward.up_proj.", "feed_forward.w2.": "feed_forward.down_proj."}


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = {}
    for k, v in rename_hf(state_dict).items():
        for a, b in _RENAMES.items():
            k = k.replace(a, b)
        out[k] = v
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors}
