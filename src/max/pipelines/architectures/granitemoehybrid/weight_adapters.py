"""Granite 4 hybrid checkpoints: Hugging Face names minus ``model.``; the experts' stacked ``input_linear``
(gate then up) split into ``mlp.experts.gate_proj`` / ``up_proj``, ``output_linear`` -> ``down_proj``,
``router.layer`` -> ``mlp.gate``; the shared MLP's ``input_linear`` / ``output_linear`` ->
``gate_up_proj`` / ``down_proj``.  llama.cpp's GGUF names: ``ssm_*`` (Mamba-2 layers, its layouts undone),
``attn_*`` (q/k rows in its NORM-rope order: the model rotates interleaved pairs), stacked
``ffn_{gate,up,down}_exps``, ``ffn_gate_inp``, the shared MLP as ``ffn_{gate,up,down}_shexp`` (or
``ffn_{gate,up,down}`` in a dense model), gate and up joined into ``gate_up_proj``."""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.moe import GGUF_MOE_NAMES
from max.pipelines.architectures.common.weights import (
    GGUF_LAYER_NAMES,
    GGUF_SSM_NAMES,
    Derived,
    gguf_ssm_layout,
    rename_gguf,
    rename_hf,
)

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


GGUF_LAYERS = {**GGUF_LAYER_NAMES, **{k: v for k, v in GGUF_MOE_NAMES.items() if "shexp" not in k},
               **{a: f"mamba.{b}" for a, b in GGUF_SSM_NAMES.items()},
               "ffn_gate_shexp": "shared_mlp.gate", "ffn_up_shexp": "shared_mlp.up",
               "ffn_down_shexp": "shared_mlp.down_proj", "ffn_gate": "shared_mlp.gate", "ffn_up": "shared_mlp.up",
               "ffn_down": "shared_mlp.down_proj"}


def gguf(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = gguf_ssm_layout(rename_gguf(state_dict, GGUF_LAYERS), "mamba")
    for k in [k for k in out if k.endswith(".shared_mlp.gate.weight")]:
        p = k[: -len("gate.weight")]
        out[p + "gate_up_proj.weight"] = Derived(lambda g, u: torch.cat([g, u], 0), out.pop(k),
                                                 out.pop(p + "up.weight"))
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
