"""DeepSeek-V3 checkpoints: DeepSeek-V2's (per-expert projections stacked), the router's
``mlp.gate.e_score_correction_bias`` as the MoE's ``mlp.e_score_correction_bias``; the multi-token
prediction layers some checkpoints carry (``layers.{num_hidden_layers}...``) are left out."""

from __future__ import annotations

import re
from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.deepseek_v2.weight_adapters import convert_safetensor_state_dict as v2_convert


def convert_safetensor_state_dict(state_dict: dict[str, Any], huggingface_config: Any = None,
                                  **kw: Any) -> dict[str, Any]:
    n = getattr(huggingface_config, "num_hidden_layers", None)
    if n is None and isinstance(huggingface_config, dict):
        n = huggingface_config.get("num_hidden_layers")
    out = {}
    for name, w in v2_convert(state_dict, **kw).items():
        m = re.match(r"layers\.(\d+)\.", name)
        if n is not None and m and int(m.group(1)) >= int(n):
            continue  # multi-token prediction module
        out[name.replace(".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias")] = w
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: convert_safetensor_state_dict,
                   WeightsFormat.pytorch: convert_safetensor_state_dict}
