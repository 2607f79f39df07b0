"""Granite 4 hybrid checkpoints: Hugging Face names minus ``model.``; the experts' stacked ``input_linear``
(gate then up) split into ``mlp.experts.gate_proj`` / ``up_proj``, ``output_linear`` -> ``down_proj``,
``router.layer`` -> ``mlp.gate``; the shared MLP's ``input_linear`` / ``output_linear`` ->
``gate_up_proj`` / ``down_proj``."""

from __future__ import annotations

import re
from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import Derived, rename_hf

_MOE = re.compile(r"layers\.(\d+)\.block_sparse_moe\.(input_linear|output_linear|router\.layer)\.weight")


def _half(w: Any, first: bool) -> Any:
    n = w.shape[1] // 2
    return (w[:, :n] if first else w[:, n:]).contiguous()


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in rename_hf(state_dict).items():
        m = _MOE.fullmatch(k)
        if m is not None:
            i, what = m.groups()
            p = f"layers.{i}.mlp"
            if what == "input_linear":
                out[f"{p}.experts.gate_proj.weight"] = Derived(lambda w: _half(w, True), v)
                out[f"{p}.experts.up_proj.weight"] = Derived(lambda w: _half(w, False), v)
            elif what == "output_linear":
                out[f"{p}.experts.down_proj.weight"] = v
            else:
                out[f"{p}.gate.weight"] = v
            continue
        k = k.replace(".shared_mlp.input_linear.", ".shared_mlp.gate_up_proj.")
        k = k.replace(".shared_mlp.output_linear.", ".shared_mlp.down_proj.")
        out[k] = v
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors}
