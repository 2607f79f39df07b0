"""Falcon-H1 checkpoints: Hugging Face names minus ``model.`` (``final_layernorm`` kept), with the µP
multipliers folded into the projections they scale (all linear, so the model computes the same):
``ssm_in_multiplier`` and the per-section ``ssm_multipliers`` into ``mamba.in_proj``, ``ssm_out_multiplier``
into ``mamba.out_proj``, ``attention_in_multiplier`` into q/k/v (and ``key_multiplier`` into k),
``attention_out_multiplier`` into ``o_proj``, ``mlp_multipliers`` into ``gate_proj`` / ``down_proj``.
llama.cpp's GGUF names (``ssm_*`` with its layouts undone, ``attn_*`` in Hugging Face's row order,
``ffn_*``): its converter has folded the same multipliers already."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import (
    GGUF_LAYER_NAMES,
    GGUF_SSM_NAMES,
    Derived,
    gguf_ssm_layout,
    rename_gguf,
    rename_hf,
)


def _get(hf: Any, key: str, default: Any) -> Any:
    v = hf.get(key) if isinstance(hf, dict) else getattr(hf, key, None)
    return default if v is None else v


def _mup(hf: Any) -> torch.Tensor:
    """The per-row multiplier of ``in_proj``'s output (z, x, B, C, dt sections)."""
    hidden = int(_get(hf, "hidden_size", 0))
    d_ssm = _get(hf, "mamba_d_ssm", None)
    inner = int(d_ssm) if d_ssm is not None else int(_get(hf, "mamba_expand", 2)) * hidden
    gs = int(_get(hf, "mamba_n_groups", 1)) * int(_get(hf, "mamba_d_state", 256))
    m = [float(v) for v in _get(hf, "ssm_multipliers", [1.0] * 5)]
    sizes = [inner, inner, gs, gs, int(_get(hf, "mamba_n_heads", 128))]
    return torch.cat([torch.full((n,), v) for n, v in zip(sizes, m)])


def safetensors(state_dict: Mapping[str, Any], huggingface_config: Any = None, **_: Any) -> dict[str, Any]:
    hf = huggingface_config.to_dict() if hasattr(huggingface_config, "to_dict") else dict(huggingface_config or {})
    s_in, s_out = float(_get(hf, "ssm_in_multiplier", 1.0)), float(_get(hf, "ssm_out_multiplier", 1.0))
    a_in, a_out = float(_get(hf, "attention_in_multiplier", 1.0)), float(_get(hf, "attention_out_multiplier", 1.0))
    key = float(_get(hf, "key_multiplier", 1.0))
    gate_m, down_m = (float(v) for v in _get(hf, "mlp_multipliers", [1.0, 1.0]))
    mup = _mup(hf)
    out: dict[str, Any] = {}
    for k, v in rename_hf(state_dict).items():
        leaf = k.rsplit(".", 1)[-1]
        w_row: Any = None  # a multiplier of the output rows (weight and bias)
        w_in = 1.0  # a multiplier of the input (weight only)
        if k.endswith("mamba.in_proj.weight") or k.endswith("mamba.in_proj.bias"):
            w_row, w_in = mup, s_in
        elif ".mamba.out_proj." in k:
            w_row = s_out
        elif ".self_attn.q_proj." in k or ".self_attn.v_proj." in k:
            w_in = a_in
        elif ".self_attn.k_proj." in k:
            w_in, w_row = a_in, key
        elif ".self_attn.o_proj." in k:
            w_row = a_out
        elif ".feed_forward.gate_proj." in k:
            w_row = gate_m
        elif ".feed_forward.down_proj." in k:
            w_row = down_m
        if leaf == "bias":
            w_in = 1.0
        if w_row is None and w_in == 1.0:
            out[k] = v
            continue

        def fold(t: torch.Tensor, r: Any = w_row, i: float = w_in) -> torch.Tensor:
            if r is not None:
                t = t * (r.reshape(-1, *([1] * (t.dim() - 1))) if isinstance(r, torch.Tensor) else r)
            return t * i if i != 1.0 else t

        out[k] = Derived(fold, v)
    return out


GGUF_LAYERS = {**GGUF_LAYER_NAMES, **{a: f"mamba.{b}" for a, b in GGUF_SSM_NAMES.items()},
               "ffn_norm": "pre_ff_layernorm", "ffn_gate": "feed_forward.gate_proj", "ffn_up": "feed_forward.up_proj",
               "ffn_down": "feed_forward.down_proj"}


def gguf(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = rename_gguf(state_dict, GGUF_LAYERS, {"token_embd": "embed_tokens", "output_norm": "final_layernorm",
                                                "output": "lm_head"})
    return gguf_ssm_layout(out, "mamba")


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
