"""Llama 4 checkpoints: ``feed_forward`` is the MLP (``mlp``), ``shared_expert`` the shared experts; the
routed experts are stored stacked and transposed -- ``experts.gate_up_proj`` ``[experts, hidden,
2 * moe_dim]`` (gate then up) and ``experts.down_proj`` ``[experts, moe_dim, hidden]``; a
``Llama4ForConditionalGeneration`` checkpoint's ``language_model.`` prefix is accepted (its vision
tower is left out)."""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common import Derived, rename_hf


def convert_safetensor_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, w in state_dict.items():
        if name.startswith(("vision_model.", "multi_modal_projector.")):
            continue
        name = name.replace("language_model.", "", 1)
        name = name[len("model."):] if name.startswith("model.") else name
        name = name.replace(".feed_forward.shared_expert.", ".mlp.shared_experts.").replace(".feed_forward.", ".mlp.")
        if name.endswith(".mlp.experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            out[p + "gate_proj.weight"] = Derived(lambda t: t[:, :, : t.shape[2] // 2].transpose(1, 2).contiguous(), w)
            out[p + "up_proj.weight"] = Derived(lambda t: t[:, :, t.shape[2] // 2:].transpose(1, 2).contiguous(), w)
        elif name.endswith(".mlp.experts.down_proj"):
            out[name + ".weight"] = Derived(lambda t: t.transpose(1, 2).contiguous(), w)
        else:
            out[name] = w
    return rename_hf(out, prefix="")


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: convert_safetensor_state_dict,
                   WeightsFormat.pytorch: convert_safetensor_state_dict}
