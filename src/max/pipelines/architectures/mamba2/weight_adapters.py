"""Mamba-2 checkpoints: Hugging Face names minus ``backbone.`` (older checkpoints' ``embedding`` is
``embeddings``); llama.cpp's GGUF names (``ssm_*``), with its converter's layouts undone: the convolution
stored ``[channels, kernel]``, ``ssm_a`` holding ``A = -exp(A_log)`` as ``[heads, 1]``, ``ssm_d`` as
``[heads, 1]`` (both named without a ``.weight`` suffix), the gated norm's weight as ``[groups, inner / groups]``,
``dt_bias`` as ``ssm_dt.bias``."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import Derived, rename_gguf, rename_hf


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = rename_hf(state_dict, prefix="backbone.")
    return {("embeddings.weight" if k == "embedding.weight" else k): v for k, v in out.items()}


GGUF_LAYERS = {"attn_norm": "norm", "ssm_in": "mixer.in_proj", "ssm_conv1d": "mixer.conv1d", "ssm_dt": "mixer.dt",
               "ssm_a": "mixer.ssm_a", "ssm_d": "mixer.ssm_d", "ssm_norm": "mixer.norm", "ssm_out": "mixer.out_proj"}


def gguf(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    import torch

    # the converter names A and D without a suffix (blk.N.ssm_a, blk.N.ssm_d)
    flat = {(f"{k}.weight" if k.startswith("blk.") and k.endswith((".ssm_a", ".ssm_d")) else k): v
            for k, v in state_dict.items()}
    out: dict[str, Any] = {}
    for k, v in rename_gguf(flat, GGUF_LAYERS, {"token_embd": "embeddings", "output_norm": "norm_f",
                                                      "output": "lm_head"}).items():
        if k.endswith(".mixer.dt.bias"):
            out[k.replace(".mixer.dt.bias", ".mixer.dt_bias")] = v
        elif k.endswith(".mixer.ssm_a.weight"):  # A = -exp(A_log)
            out[k.replace(".mixer.ssm_a.weight", ".mixer.A_log")] = Derived(lambda a: torch.log(-a).reshape(-1), v)
        elif k.endswith(".mixer.ssm_d.weight"):
            out[k.replace(".mixer.ssm_d.weight", ".mixer.D")] = Derived(lambda d: d.reshape(-1), v)
        elif k.endswith(".mixer.norm.weight"):
            out[k] = Derived(lambda w: w.reshape(-1), v)
        elif k.endswith(".mixer.conv1d.weight"):  # [channels, kernel] -> [channels, 1, kernel]
            out[k] = Derived(lambda w: w.unsqueeze(1), v)
        else:
            out[k] = v
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
