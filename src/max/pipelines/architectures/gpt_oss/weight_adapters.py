"""GPT-OSS checkpoints (bfloat16 safetensors as transformers saves them).

Experts are stored transposed with gate and up interleaved column by column:
``mlp.experts.gate_up_proj`` ``[experts, hidden, 2 * moe_dim]`` (+ ``_bias``) and ``mlp.experts.down_proj``
``[experts, moe_dim, hidden]`` (+ ``_bias``); they become ``experts.{gate,up,down}_proj.{weight,bias}``
in the ``[experts, out, in]`` layout.  The released MXFP4 checkpoints (``*_blocks``/``*_scales``) are not
supported (clear error): dequantise them to bfloat16 with transformers first.
"""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common import Derived, rename_hf


def convert_safetensor_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    if any(n.endswith(("_blocks", "_scales")) for n in state_dict):
        raise NotImplementedError("GptOssForCausalLM: MXFP4-quantised expert weights (*_blocks/*_scales) are not "
                                  "supported; load the model with transformers (dequantize=True) and save it in "
                                  "bfloat16 first")
    out: dict[str, Any] = {}
    for name, w in rename_hf(state_dict).items():
        base = name.rsplit(".experts.", 1)[0] + ".experts"
        if name.endswith(".experts.gate_up_proj"):
            out[f"{base}.gate_proj.weight"] = Derived(lambda t: t[:, :, 0::2].transpose(1, 2).contiguous(), w)
            out[f"{base}.up_proj.weight"] = Derived(lambda t: t[:, :, 1::2].transpose(1, 2).contiguous(), w)
        elif name.endswith(".experts.gate_up_proj_bias"):
            out[f"{base}.gate_proj.bias"] = Derived(lambda t: t[:, 0::2].contiguous(), w)
            out[f"{base}.up_proj.bias"] = Derived(lambda t: t[:, 1::2].contiguous(), w)
        elif name.endswith(".experts.down_proj"):
            out[f"{base}.down_proj.weight"] = Derived(lambda t: t.transpose(1, 2).contiguous(), w)
        elif name.endswith(".experts.down_proj_bias"):
            out[f"{base}.down_proj.bias"] = w
        else:
            out[name] = w
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: convert_safetensor_state_dict}
